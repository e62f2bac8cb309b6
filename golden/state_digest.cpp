#include "golden/state_digest.h"

#include <algorithm>
#include <future>

#include "core/parallel.h"

namespace olmoref {

std::vector<Digest128> StateDigest::range_leaves(const Buffer<float>& state, int64_t lo, int64_t hi, int64_t c0,
                                                 int64_t c1) {
  std::vector<Digest128> leaves(static_cast<size_t>(c1 - c0));
  // merkle_leaves indexes chunks of the whole vector; it is given a pointer as if at element 0.
  if (s_.ex.host_memory()) {
    merkle_leaves(state.data() - lo, hi, c0, c1, leaves.data(), pool_);
    return leaves;
  }
  // Two blocks in flight: block k downloads (on this thread, the executor's) into one staging buffer while the pool
  // hashes block k - 1 from the other. An exception leaves through `hashing`'s destructor, which waits for it.
  std::future<void> hashing;
  for (int64_t b0 = c0, k = 0; b0 < c1; b0 += stream_chunks_, ++k) {
    const int64_t b1 = std::min(c1, b0 + stream_chunks_);
    const int64_t x0 = std::max(lo, b0 * kDigestChunk), x1 = std::min(hi, b1 * kDigestChunk);
    std::vector<float>& staging = staging_[k % 2];
    if (static_cast<int64_t>(staging.size()) < x1 - x0) staging.resize(static_cast<size_t>(x1 - x0));
    float* block = staging.data();
    state.download(block, x1 - x0, x0 - lo);
    if (hashing.valid()) hashing.get();  // block k - 1 hashed: its buffer is free for block k + 1
    hashing = std::async(std::launch::async, [this, block, x0, x1, b0, b1, c0, &leaves] {
      merkle_leaves(block - x0, x1, b0, b1, leaves.data() + (b0 - c0), pool_);
    });
  }
  if (hashing.valid()) hashing.get();
  return leaves;
}

std::string StateDigest::sharded(const Buffer<float>& state, dist::Span span) {
  const dist::Layout& layout = s_.layout;
  const int W = layout.world();
  // Each rank hashes the chunks of its optimizer range (inside its shard's, so any span's buffer has them): the
  // replicas of a shard split the hashing as they split the update.
  const int64_t base = dist::span_begin(layout, span, layout.rank);
  const int64_t lo = layout.optimizer_lo(), hi = layout.optimizer_hi();
  // An empty range (more ranks than chunks) hashes no chunk.
  const int64_t c0 = lo / kDigestChunk, c1 = hi > lo ? (hi + kDigestChunk - 1) / kDigestChunk : c0;
  const std::vector<Digest128> leaves = range_leaves(state, base, base + state.size(), c0, c1);
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
  const std::vector<int64_t>& my_chunks = chunks_of[static_cast<size_t>(layout.rank)];
  // `mine` holds my chunks in order (hashed_chunks ascends), each whole but the vector's last, which can only come
  // last: as a vector of its own, its chunk i is chunk my_chunks[i] of the whole.
  merkle_leaves(mine.data(), static_cast<int64_t>(mine.size()), 0, static_cast<int64_t>(my_chunks.size()),
                leaves.data(), pool_);
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
