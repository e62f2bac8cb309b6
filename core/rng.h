// core/rng.h — counter-based randomness: every random number is a pure function of
// (seed, purpose, stream, index). No generator state exists, so initialisation does not depend on
// sharding, thread count or call order.
#pragma once

#include <cstdint>

namespace olmoref {

// Philox4x32-10 (Salmon et al., SC'11): 10 rounds of the standard multipliers and key schedule.
struct Philox4x32 {
  uint32_t v[4];
};

inline Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(M0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(M1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += W0;
    k1 += W1;
  }
  return {{c0, c1, c2, c3}};
}

// Purposes keep independent uses of one seed apart.
enum class RngPurpose : uint32_t { init = 1, holdout_split = 2, bootstrap = 3, test = 99 };

// Two uniform doubles in (0, 1) with 53 random bits each, for (seed, purpose, stream, index, attempt).
inline void uniform2(uint64_t seed, RngPurpose purpose, uint32_t stream, uint64_t index, uint32_t attempt,
                     double* u1, double* u2) {
  const Philox4x32 r = philox4x32_10(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), stream,
                                     attempt ^ (static_cast<uint32_t>(purpose) << 24),
                                     static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t a = (static_cast<uint64_t>(r.v[0]) << 21) ^ (r.v[1] & 0x1fffffu);  // 53 bits
  const uint64_t b = (static_cast<uint64_t>(r.v[2]) << 21) ^ (r.v[3] & 0x1fffffu);
  // (x + 0.5) / 2^53 lies strictly inside (0, 1): log(u1) is always finite.
  *u1 = (static_cast<double>(a) + 0.5) * 0x1p-53;
  *u2 = (static_cast<double>(b) + 0.5) * 0x1p-53;
}

}  // namespace olmoref
