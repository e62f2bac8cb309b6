#include "core/embedding_order.h"

namespace olmoref {

void embedding_position_order(const uint32_t* tokens, int64_t R, int64_t V, std::vector<int64_t>& start,
                              std::vector<int64_t>& order) {
  // Stable, so each row sums its positions in position order.
  start.assign(static_cast<size_t>(V + 1), 0);
  order.assign(static_cast<size_t>(R), 0);
  for (int64_t r = 0; r < R; ++r) ++start[tokens[r] + 1];
  for (int64_t v = 0; v < V; ++v) start[v + 1] += start[v];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t r = 0; r < R; ++r) order[fill[tokens[r]]++] = r;
}

}  // namespace olmoref
