// tests/kernels/loss_cases.h — cross-entropy shapes/operands and gradient vectors shared by the host-
// decomposition test and the GPU test.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace olmoref::testing {

struct LossCase {
  int64_t B, T, V;
};
inline std::vector<LossCase> loss_cases() { return {{1, 2, 1}, {1, 3, 5}, {2, 5, 31}, {3, 4, 33}, {2, 7, 97}, {1, 40, 600}}; }
struct LossOperands {
  std::vector<float> logits;
  std::vector<uint32_t> tokens;
};
inline LossOperands loss_operands(const LossCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  LossOperands o;
  for (int64_t i = 0; i < c.B * c.T * c.V; ++i) o.logits.push_back(nd(rng));
  if (!o.logits.empty()) o.logits[0] = -0.0f;
  for (int64_t i = 0; i < c.B * c.T; ++i) o.tokens.push_back(static_cast<uint32_t>(rng() % c.V));
  return o;
}
// Gradient-like vectors: several chunks and a partial last one, magnitudes over many binades.
inline std::vector<float> norm_vector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& x : g) x = std::ldexp(u(rng), static_cast<int>(rng() % 30) - 20);
  return g;
}

}  // namespace olmoref::testing
