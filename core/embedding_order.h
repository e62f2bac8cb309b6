#pragma once
// The order in which every executor sums the embedding gradient: shared, so the CPU and the device agree by
// construction on which positions feed each table row and in what order.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace olmoref {

// The positions of each token in order (a stable counting sort over tokens [R] with values < V): token v's
// positions are order[start[v] .. start[v+1]). start is [V + 1], order is [R].
void embedding_position_order(const uint32_t* tokens, int64_t R, int64_t V, std::vector<int64_t>& start,
                              std::vector<int64_t>& order);

}  // namespace olmoref
