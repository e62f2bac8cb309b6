// dist/layout.h — who owns what in an HSDP run (dp_shard x dp_replicate ranks).
//
// World rank r = replicate_index * dp_shard + shard_index. Ranks with the same shard_index (one per
// replicate group) own the same range of the canonical flat vector: its parameters (fp32 master),
// reduced gradient and AdamW moments. Ranges are whole 65,536-float chunks (the gradient-norm and
// digest chunks), so per-chunk scalars never straddle ranks. Micro-batches: rank r computes the
// contiguous block [r·M/W, (r+1)·M/W) of the step's M canonical micro-batches, a whole subtree of the
// step tree when W is a power of two dividing M (docs/canonical/step.md).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace olmoref::dist {

inline constexpr int64_t kShardAlign = 1 << 16;

struct Layout {
  int dp_shard = 1, dp_replicate = 1;
  int rank = 0;
  int64_t total = 0;  // floats in the flat vector

  int world() const { return dp_shard * dp_replicate; }
  int shard_index() const { return rank % dp_shard; }
  int replicate_index() const { return rank / dp_shard; }
  // Floats per shard (the last may be shorter), a whole number of chunks.
  int64_t shard_stride() const {
    const int64_t chunks = (total + kShardAlign - 1) / kShardAlign;
    return ((chunks + dp_shard - 1) / dp_shard) * kShardAlign;
  }
  int64_t begin(int shard) const { return std::min<int64_t>(total, shard * shard_stride()); }
  int64_t end(int shard) const { return std::min<int64_t>(total, (shard + 1) * shard_stride()); }
  int64_t lo() const { return begin(shard_index()); }
  int64_t hi() const { return end(shard_index()); }

  // Throws with the fix when the layout cannot keep the canonical tree.
  void validate(int64_t micro_batches) const {
    const int w = world();
    if (dp_shard < 1 || dp_replicate < 1) throw std::invalid_argument("--dp-shard and --dp-replicate must be >= 1");
    if ((w & (w - 1)) != 0)
      throw std::invalid_argument("dp_shard x dp_replicate = " + std::to_string(w) +
                                  " ranks: the world size must be a power of two (1, 2, 4, 8, ...) so each rank's "
                                  "micro-batches form a whole subtree of the canonical reduction");
    if (micro_batches % w != 0)
      throw std::invalid_argument("the step's " + std::to_string(micro_batches) + " micro-batches cannot be split over " +
                                  std::to_string(w) + " ranks; make train.global_batch_instances / train.micro_batch_instances a multiple of the world size");
  }
};

}  // namespace olmoref::dist
