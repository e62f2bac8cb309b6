// dist/layout.h — who owns what in an HSDP run (dp_shard x dp_replicate ranks).
//
// World rank r = replicate_index * dp_shard + shard_index. Ranks with the same shard_index (one per
// replicate group) hold the same range of the canonical flat vector's fp32 master parameters (what FSDP
// gathers from). The optimizer's state is split further (the distributed optimizer): the shard's range is cut
// among its dp_replicate replicas in replicate-index order, and each rank reduces the gradient, keeps AdamW's
// moments and updates the parameters on its part alone; the replicas then all-gather the updated parameters.
// Ranges are whole 65,536-float chunks (the gradient-norm and digest chunks), so per-chunk scalars never
// straddle ranks. Instances: rank r computes a contiguous run of the step's micro-batches
// (core/instance_tree.h: BatchSplit); any world size works, since ranks only change who computes which nodes
// of the instance tree (docs/canonical/step.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace olmoref::dist {

inline constexpr int64_t kShardAlign = 1 << 16;
// Floats each replica contributes per round when the replicas all-gather their updated parameters: 16 chunks, 4 MiB,
// so the transient is (dp_replicate + 1) blocks whatever the model's size.
inline constexpr int64_t kParamGatherBlock = 16 * kShardAlign;

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

  // Floats per optimizer range (the last ones of a shard may be shorter or empty), a whole number of chunks.
  int64_t optimizer_stride() const {
    const int64_t chunks = shard_stride() / kShardAlign;
    return ((chunks + dp_replicate - 1) / dp_replicate) * kShardAlign;
  }
  // Rank r's optimizer range [optimizer_begin(r), optimizer_end(r)): inside its shard's, part replicate_index_of(r).
  int64_t optimizer_begin(int r) const {
    const int s = shard_index_of(r);
    return std::min<int64_t>(end(s), begin(s) + replicate_index_of(r) * optimizer_stride());
  }
  int64_t optimizer_end(int r) const {
    const int s = shard_index_of(r);
    return std::min<int64_t>(end(s), begin(s) + (replicate_index_of(r) + 1) * optimizer_stride());
  }
  int64_t optimizer_lo() const { return optimizer_begin(rank); }
  int64_t optimizer_hi() const { return optimizer_end(rank); }
  // The world rank with this shard index and replicate index.
  int rank_of(int shard, int replicate) const { return replicate * dp_shard + shard; }

  void validate() const {
    if (dp_shard < 1 || dp_replicate < 1) throw std::invalid_argument("--dp-shard and --dp-replicate must be >= 1");
  }
};

}  // namespace olmoref::dist
