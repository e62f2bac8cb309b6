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

std::string StateDigest::sharded(const Buffer<float>& state, dist::Span span) {
  const dist::Layout& layout = s_.layout;
  const int W = layout.world();
  // Each rank hashes the chunks of its optimizer range (inside its shard's, so any span's buffer has them): the
  // replicas of a shard split the hashing as they split the update.
  const int64_t base = dist::span_begin(layout, span, layout.rank);
  const int64_t lo = layout.optimizer_lo(), hi = layout.optimizer_hi();
  // An empty range (more ranks than chunks) hashes no chunk.
  const int64_t c0 = lo / kDigestChunk, c1 = hi > lo ? (hi + kDigestChunk - 1) / kDigestChunk : c0;
  const std::vector<Digest128> leaves = range_leaves(state, s_.ex, base, base + state.size(), c0, c1);
  if (W == 1) return merkle_root(leaves).hex();  // this range is the whole vector
  const int64_t per = layout.optimizer_stride() / kDigestChunk;  // chunks per optimizer range
  std::vector<Digest128> mine(static_cast<size_t>(per));
  std::copy(leaves.begin(), leaves.end(), mine.begin());
  std::vector<Digest128> all(static_cast<size_t>(per * W));
  s_.world.allgather(mine.data(), mine.size() * sizeof(Digest128), all.data(), "all-gather digest leaves");
  const int64_t chunks = (layout.total + kDigestChunk - 1) / kDigestChunk;
  std::vector<Digest128> ordered(static_cast<size_t>(chunks));
  for (int r = 0; r < W; ++r)
    for (int64_t c = 0; c < per; ++c) {
      const int64_t at = layout.optimizer_begin(r) + c * kDigestChunk;
      if (at < layout.optimizer_end(r))
        ordered[static_cast<size_t>(at / kDigestChunk)] = all[static_cast<size_t>(r * per + c)];
    }
  return merkle_root(ordered).hex();
}

std::string StateDigest::operator()(const Buffer<float>& state, dist::Span span, uint64_t& pieces_sent) {
  // Every rank holds its whole optimizer range of the moments, and of the parameters too (dist::StatePlacement).
  if (!s_.placement.drops_any() || span == dist::Span::optimizer) return sharded(state, span);
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
  const std::vector<float> mine = dist::collect_pieces(s_, state, span, want, pieces_sent);
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
