// tests/kernels/gemm_cases.h — awkward GEMM shapes and operands shared by the host-decomposition test and
// the GPU test, so both check the same cases.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/gemm_exact.h"

namespace olmoref::testing {

struct GemmCase {
  int64_t M, N, K;
  int layout;  // 0: forward X·Wᵀ, 1: input gradient dY·W, 2: weight gradient dYᵀ·X (ref/gemm.h)
  bool accumulate;
};

// Odd sizes, single rows/columns, K shorter and longer than a slab (one slab, an odd number and an even number of
// slabs, for the two buffers), tiles (128 x 128, and 64 x 64: gemm_pick_tiling) whole and cut in every direction, and
// a thread's two runs of rows and columns (GemmTile128's) half full.
inline std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> out;
  const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 7},      {64, 64, 16},  {65, 63, 17},  {130, 70, 33},
                               {17, 200, 1},  {1, 129, 64},   {200, 1, 48},  {96, 160, 100}, {128, 128, 8},
                               {129, 257, 9}, {300, 140, 20}, {257, 3, 130}};
  for (const auto& s : shapes)
    for (int layout = 0; layout < 3; ++layout)
      for (const bool acc : {false, true}) out.push_back({s[0], s[1], s[2], layout, acc});
  return out;
}

// Operands with signed zeros, values across many binades, and an accumulator with -0 entries.
struct GemmOperands {
  std::vector<float> a, b, c;
};
inline GemmOperands gemm_operands(const GemmCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    for (auto& x : v) {
      const uint32_t r = rng() % 16;
      x = r == 0 ? 0.0f : r == 1 ? -0.0f : std::ldexp(u(rng), static_cast<int>(rng() % 24) - 12);
    }
  };
  GemmOperands o;
  fill(o.a, static_cast<size_t>(c.M * c.K));
  fill(o.b, static_cast<size_t>(c.K * c.N));
  fill(o.c, static_cast<size_t>(c.M * c.N));
  return o;
}

// The strided views of each layout over the operand buffers (a holds M*K values, b K*N values).
inline kernels::GemmArgs gemm_args(const GemmCase& c, const float* a, const float* b, float* out) {
  kernels::GemmArgs g;
  g.M = c.M;
  g.N = c.N;
  g.K = c.K;
  g.A = a;
  g.B = b;
  g.C = out;
  g.ldc = c.N;
  g.accumulate = c.accumulate;
  switch (c.layout) {
    case 0:  // A = X[M,K] row-major, B(p, j) = W[j, p] with W[N,K]
      g.a_row = c.K, g.a_col = 1, g.b_row = 1, g.b_col = c.K;
      break;
    case 1:  // A = dY[M,K'] row-major (K' = reduction), B = W[K', N] row-major
      g.a_row = c.K, g.a_col = 1, g.b_row = c.N, g.b_col = 1;
      break;
    default:  // A(i, p) = dY[p, i] with dY[K, M]; B = X[K, N] row-major
      g.a_row = 1, g.a_col = c.M, g.b_row = c.N, g.b_col = 1;
      break;
  }
  return g;
}

}  // namespace olmoref::testing
