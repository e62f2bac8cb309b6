#include "golden/digest.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <xxhash.h>

namespace olmoref {

static_assert(std::endian::native == std::endian::little,
              "digests hash the in-memory bytes of fp32/uint32 values and assume a little-endian host");

std::string hex64(uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

std::string Digest128::hex() const { return hex64(hi) + hex64(lo); }

std::vector<Digest128> merkle_leaves(const float* data, int64_t n, int64_t c0, int64_t c1) {
  std::vector<Digest128> out;
  out.reserve(static_cast<size_t>(c1 - c0));
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t lo = c * kDigestChunk, hi = std::min(n, lo + kDigestChunk);
    const XXH128_hash_t h = XXH3_128bits(data + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    out.push_back({h.high64, h.low64});
  }
  return out;
}

Digest128 merkle_root(const std::vector<Digest128>& leaves) {
  std::vector<XXH128_canonical_t> bytes(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) XXH128_canonicalFromHash(&bytes[i], {leaves[i].lo, leaves[i].hi});
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size() * sizeof(XXH128_canonical_t));
  return {h.high64, h.low64};
}

Digest128 merkle_digest(const float* data, int64_t n) {
  const int64_t chunks = (n + kDigestChunk - 1) / kDigestChunk;
  return merkle_root(merkle_leaves(data, n, 0, chunks));
}

uint64_t data_digest(const uint32_t* tokens, int64_t n) {
  return XXH3_64bits(tokens, static_cast<size_t>(n) * sizeof(uint32_t));
}

}  // namespace olmoref
