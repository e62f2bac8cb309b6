#include "golden/state_digest.h"

#include <algorithm>

#include "golden/digest.h"

namespace olmoref {

namespace {

// Chunks a device executor's state passes through the host at a time: 256 chunks of 64 Ki floats, 64 MiB. The digest
// is hashed on the host, so a device copy of the whole range (29 GiB of fp32 parameters at 7B) would otherwise sit
// there every step; by blocks the host holds one block, whatever the model's size.
constexpr int64_t kStreamChunks = 256;

// The Merkle leaves of chunks [c0, c1) of the whole vector, read from `state`, which holds [lo, hi) of it.
std::vector<Digest128> range_leaves(const Buffer<float>& state, const Executor& ex, int64_t lo, int64_t hi, int64_t c0,
                                    int64_t c1) {
  // merkle_leaves indexes chunks of the whole vector; it is given a pointer as if at element 0.
  if (ex.host_memory()) return merkle_leaves(state.data() - lo, hi, c0, c1);
  std::vector<Digest128> leaves;
  std::vector<float> staging;
  for (int64_t b0 = c0; b0 < c1; b0 += kStreamChunks) {
    const int64_t b1 = std::min(c1, b0 + kStreamChunks);
    const int64_t x0 = std::max(lo, b0 * kDigestChunk), x1 = std::min(hi, b1 * kDigestChunk);
    staging.resize(static_cast<size_t>(x1 - x0));
    state.download(staging.data(), x1 - x0, x0 - lo);
    const std::vector<Digest128> part = merkle_leaves(staging.data() - x0, x1, b0, b1);
    leaves.insert(leaves.end(), part.begin(), part.end());
  }
  return leaves;
}

}  // namespace

std::string StateDigest::sharded(const Buffer<float>& state) {
  const dist::Layout& layout = s_.layout;
  const int64_t lo = layout.lo(), hi = layout.hi();
  // An empty shard (more ranks than chunks) owns no chunk.
  const int64_t c0 = lo / kDigestChunk, c1 = hi > lo ? (hi + kDigestChunk - 1) / kDigestChunk : c0;
  const std::vector<Digest128> leaves = range_leaves(state, s_.ex, lo, hi, c0, c1);
  if (layout.dp_shard == 1) return merkle_root(leaves).hex();  // this range is the whole vector
  const int64_t per = layout.shard_stride() / kDigestChunk;    // chunks per shard
  std::vector<Digest128> mine(static_cast<size_t>(per));
  std::copy(leaves.begin(), leaves.end(), mine.begin());
  std::vector<Digest128> all(static_cast<size_t>(per * layout.dp_shard));
  s_.shard_group.allgather(mine.data(), mine.size() * sizeof(Digest128), all.data(), "all-gather digest leaves");
  const int64_t chunks = (layout.total + kDigestChunk - 1) / kDigestChunk;
  std::vector<Digest128> ordered;
  for (int s = 0; s < layout.dp_shard; ++s) {
    const int64_t first = layout.begin(s) / kDigestChunk;
    for (int64_t c = 0; c < per && first + c < chunks && layout.begin(s) + c * kDigestChunk < layout.end(s); ++c)
      ordered.push_back(all[static_cast<size_t>(s * per + c)]);
  }
  return merkle_root(ordered).hex();
}

std::string StateDigest::operator()(const Buffer<float>& state, uint64_t& pieces_sent) {
  if (!s_.placement.drops_any()) return sharded(state);
  static_assert(kDigestChunk == dist::kShardAlign, "digest chunks are the shards' alignment");
  const dist::Layout& layout = s_.layout;
  const int W = layout.world();
  if (hashed_chunks_.empty())
    for (int q = 0; q < W; ++q) hashed_chunks_.push_back(s_.placement.hashed_chunks(q));
  const std::vector<std::vector<int64_t>>& chunks_of = hashed_chunks_;
  std::vector<dist::Ranges> want(static_cast<size_t>(W));
  size_t widest = 0;
  for (int q = 0; q < W; ++q) {
    for (int64_t c : chunks_of[static_cast<size_t>(q)])
      want[static_cast<size_t>(q)].push_back({c * kDigestChunk, std::min(layout.total, (c + 1) * kDigestChunk)});
    widest = std::max(widest, chunks_of[static_cast<size_t>(q)].size());
  }
  const std::vector<float> mine = dist::collect_pieces(s_, state, want, pieces_sent);
  std::vector<Digest128> leaves(widest);
  const float* next = mine.data();
  const std::vector<int64_t>& my_chunks = chunks_of[static_cast<size_t>(layout.rank)];
  for (size_t i = 0; i < my_chunks.size(); ++i) {
    const int64_t c = my_chunks[i], n = std::min(layout.total, (c + 1) * kDigestChunk) - c * kDigestChunk;
    // merkle_leaves indexes chunks of the whole vector; give it a pointer as if at element 0.
    leaves[i] = merkle_leaves(next - c * kDigestChunk, c * kDigestChunk + n, c, c + 1)[0];
    next += n;
  }
  std::vector<Digest128> all(widest * static_cast<size_t>(W));
  s_.world.allgather(leaves.data(), leaves.size() * sizeof(Digest128), all.data(), "all-gather digest leaves");
  const int64_t chunks = (layout.total + kDigestChunk - 1) / kDigestChunk;
  // hashed_chunks gives every chunk to exactly one rank (model-moe-ep checks it), so this fills every leaf once.
  std::vector<Digest128> ordered(static_cast<size_t>(chunks));
  for (int q = 0; q < W; ++q)
    for (size_t i = 0; i < chunks_of[static_cast<size_t>(q)].size(); ++i)
      ordered[static_cast<size_t>(chunks_of[static_cast<size_t>(q)][i])] = all[static_cast<size_t>(q) * widest + i];
  return merkle_root(ordered).hex();
}

}  // namespace olmoref
