// tests/kernels/norm_cases.h — RMSNorm shapes and operands shared by the host-decomposition test and the GPU
// test: rows shorter and longer than a warp, widths that are not multiples of 32, more columns than a block.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/rmsnorm_exact.h"

namespace olmoref::testing {

struct NormCase {
  int64_t R, n;
};
inline std::vector<NormCase> norm_cases() {
  return {{1, 1}, {3, 5}, {7, 31}, {2, 32}, {5, 33}, {4, 64}, {3, 100}, {9, 257}, {2, 600}};
}
struct NormOperands {
  std::vector<float> x, w, dy;
};
inline NormOperands norm_operands(const NormCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  NormOperands o;
  for (int64_t i = 0; i < c.R * c.n; ++i) o.x.push_back(std::ldexp(u(rng), static_cast<int>(rng() % 12) - 6));
  for (int64_t i = 0; i < c.n; ++i) o.w.push_back(1.0f + 0.3f * u(rng));
  for (int64_t i = 0; i < c.R * c.n; ++i) o.dy.push_back(std::ldexp(u(rng), static_cast<int>(rng() % 12) - 6));
  return o;
}

// The kernel arguments of a case over the caller's buffers (eps 1e-6; backward pointers may stay null).
inline kernels::RmsNormArgs norm_args(const NormCase& c, const float* x, const float* w, float* y, float* inv_rms,
                                      const float* dy = nullptr, float* dx = nullptr, float* dw = nullptr) {
  kernels::RmsNormArgs a;
  a.R = c.R, a.n = c.n, a.x = x, a.w = w, a.y = y, a.inv_rms = inv_rms, a.eps = 1e-6f, a.dy = dy, a.dx = dx, a.dw = dw;
  return a;
}

}  // namespace olmoref::testing
