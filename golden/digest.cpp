#include "golden/digest.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <xxhash.h>

#include "core/parallel.h"

namespace olmoref {

static_assert(std::endian::native == std::endian::little,
              "digests hash the in-memory bytes of fp32/uint32 values and assume a little-endian host");

std::string hex64(uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

std::string Digest128::hex() const { return hex64(hi) + hex64(lo); }

void merkle_leaves(const float* data, int64_t n, int64_t c0, int64_t c1, Digest128* out, ThreadPool* pool) {
  // Leaf i depends on chunk c0 + i alone and goes to out[i], so how the range is split never changes a bit.
  const auto hash = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t lo = (c0 + i) * kDigestChunk, hi = std::min(n, lo + kDigestChunk);
      const XXH128_hash_t h = XXH3_128bits(data + lo, static_cast<size_t>(hi - lo) * sizeof(float));
      out[i] = {h.high64, h.low64};
    }
  };
  // A chunk (256 KiB) hashes in tens of microseconds; 4 of them are worth a hand-off to a thread.
  constexpr int64_t kGrainChunks = 4;
  if (pool)
    pool->parallel_for(c1 - c0, kGrainChunks, hash);
  else
    hash(0, c1 - c0);
}

Digest128 merkle_root(const std::vector<Digest128>& leaves) {
  std::vector<XXH128_canonical_t> bytes(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) XXH128_canonicalFromHash(&bytes[i], {leaves[i].lo, leaves[i].hi});
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size() * sizeof(XXH128_canonical_t));
  return {h.high64, h.low64};
}

MerkleStream::MerkleStream() : state_(XXH3_createState()) { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_)); }

MerkleStream::~MerkleStream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void MerkleStream::add(const float* data, int64_t n) {
  auto* st = static_cast<XXH3_state_t*>(state_);
  while (n > 0) {
    const int64_t take = std::min(n, kDigestChunk - in_chunk_);
    XXH3_128bits_update(st, data, static_cast<size_t>(take) * sizeof(float));
    data += take, n -= take, in_chunk_ += take, fed_ += take;
    if (in_chunk_ == kDigestChunk) {
      const XXH128_hash_t h = XXH3_128bits_digest(st);
      leaves_.push_back({h.high64, h.low64});
      XXH3_128bits_reset(st);
      in_chunk_ = 0;
    }
  }
}

Digest128 MerkleStream::finish() {
  auto* st = static_cast<XXH3_state_t*>(state_);
  if (in_chunk_ > 0) {  // the last leaf, short
    const XXH128_hash_t h = XXH3_128bits_digest(st);
    leaves_.push_back({h.high64, h.low64});
    XXH3_128bits_reset(st);
    in_chunk_ = 0;
  }
  return merkle_root(leaves_);
}

Digest128 merkle_digest(const float* data, int64_t n) {
  const int64_t chunks = (n + kDigestChunk - 1) / kDigestChunk;
  std::vector<Digest128> leaves(static_cast<size_t>(chunks));
  merkle_leaves(data, n, 0, chunks, leaves.data());
  return merkle_root(leaves);
}

uint64_t data_digest(const uint32_t* tokens, int64_t n) {
  return XXH3_64bits(tokens, static_cast<size_t>(n) * sizeof(uint32_t));
}

}  // namespace olmoref
