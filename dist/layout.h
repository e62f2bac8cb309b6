// dist/layout.h — who owns what in an HSDP run (dp_shard x dp_replicate ranks).
//
// World rank r = replicate_index * dp_shard + shard_index. Ranks with the same shard_index (one per
// replicate group) own the same range of the canonical flat vector: its parameters (fp32 master),
// reduced gradient and AdamW moments. Ranges are whole 65,536-float chunks (the gradient-norm and
// digest chunks), so per-chunk scalars never straddle ranks. Instances: rank r computes a contiguous run
// of the step's micro-batches (core/instance_tree.h: BatchSplit); any world size works, since ranks only
// change who computes which nodes of the instance tree (docs/canonical/step.md).
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
  int shard_index_of(int r) const { return r % dp_shard; }
  int replicate_index_of(int r) const { return r / dp_shard; }
  // Floats per shard (the last may be shorter), a whole number of chunks.
  int64_t shard_stride() const {
    const int64_t chunks = (total + kShardAlign - 1) / kShardAlign;
    return ((chunks + dp_shard - 1) / dp_shard) * kShardAlign;
  }
  int64_t begin(int shard) const { return std::min<int64_t>(total, shard * shard_stride()); }
  int64_t end(int shard) const { return std::min<int64_t>(total, (shard + 1) * shard_stride()); }
  int64_t lo() const { return begin(shard_index()); }
  int64_t hi() const { return end(shard_index()); }

  void validate() const {
    if (dp_shard < 1 || dp_replicate < 1) throw std::invalid_argument("--dp-shard and --dp-replicate must be >= 1");
  }
};

}  // namespace olmoref::dist
