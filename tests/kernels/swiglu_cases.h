// tests/kernels/swiglu_cases.h — the SwiGLU fusions (matmul_forward_swiglu, matmul_backward_input_swiglu) and their
// unfused sequence on any executor, for the CPU/cuda-host test (tests/ref/test_epilogue.cpp) and the device
// check (tests/gpu/test_gpu_kernels.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/executor.h"
#include "core/bf16.h"
#include "core/mathfn.h"

namespace olmoref::testing {

inline std::vector<float> random_values(int64_t n, uint32_t seed, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = bf16 ? round_bf16(dist(rng)) : dist(rng);
  return v;
}

// First index whose bits differ (two NaNs match: see tests/ref/test_simd.cpp), or -1.
inline int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (det::bits(a[i]) != det::bits(b[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

// Shapes (M, N, K) of the product: single elements, tails of every tile, several K blocks (KC is 256-512 on the
// CPU paths, 16 on the CUDA kernel), and enough rows to split over threads.
struct SwigluShape {
  int64_t M, N, K;
};
inline const SwigluShape kSwigluShapes[] = {{1, 1, 1}, {7, 37, 5}, {13, 100, 600}, {70, 33, 1030}, {130, 260, 64}};

// The fused ops and the unfused sequence on one executor (host memory in, host memory out).
struct SwigluRun {
  std::vector<float> u, a, dg, du;
};

// bf16_inputs: the operands are bf16-valued (always so in bf16).
inline SwigluRun run_swiglu(Executor& ex, const SwigluShape& s, bool bf16, bool fused, bool bf16_inputs = false) {
  const bool q = bf16 || bf16_inputs;
  // Forward: u [M, N] = X [M, K]·W3 [N, K]ᵀ, a = SwiGLU(g, u). Backward: da [M, N] = dY [M, K2]·W2 [K2, N] with
  // K2 = K (the product's reduction), then dg, du [M, N].
  const int64_t M = s.M, N = s.N, K = s.K;
  const std::vector<float> x = random_values(M * K, 11, q), w3 = random_values(N * K, 12, q);
  std::vector<float> g = random_values(M * N, 13, q), u_given = random_values(M * N, 14, q);
  const std::vector<float> dy = random_values(M * K, 15, q), w2 = random_values(K * N, 16, q);
  // SiLU's edges: ±inf, huge and tiny gates (every 17th element).
  const float edges[] = {INFINITY, -INFINITY, 88.0f, -104.0f, 1e-30f, -0.0f};
  for (size_t i = 0; i < g.size(); i += 17) g[i] = edges[(i / 17) % 6];
  auto up = [&](const std::vector<float>& h, const char* what) {
    float* p = static_cast<float*>(ex.allocate(h.size() * sizeof(float), what));
    ex.to_device(p, h.data(), h.size() * sizeof(float));
    return p;
  };
  auto scratch = [&](int64_t n, const char* what) {
    float* p = static_cast<float*>(ex.allocate(static_cast<size_t>(n) * sizeof(float), what));
    ex.zero(p, static_cast<size_t>(n) * sizeof(float));
    return p;
  };
  float *dx = up(x, "x"), *dw3 = up(w3, "w3"), *dgate = up(g, "g"), *du_given = up(u_given, "u"), *ddy = up(dy, "dy"),
        *dw2 = up(w2, "w2");
  float *u = scratch(M * N, "u out"), *a = scratch(M * N, "a"), *dg = scratch(M * N, "dg"), *du = scratch(M * N, "du"),
        *da = scratch(M * N, "da");
  if (fused) {
    ex.matmul_forward_swiglu(dx, dw3, dgate, u, a, M, N, K, bf16);
    ex.matmul_backward_input_swiglu(ddy, dw2, dgate, du_given, dg, du, M, K, N, bf16);
  } else {
    ex.matmul_forward(dx, dw3, u, M, N, K);
    if (bf16) ex.round_bf16(u, M * N);
    ex.swiglu_forward(dgate, u, a, M * N, bf16);
    ex.matmul_backward_input(ddy, dw2, da, M, K, N, false);
    if (bf16) ex.round_bf16(da, M * N);
    ex.swiglu_backward(dgate, du_given, da, dg, du, M * N, bf16);
  }
  SwigluRun r;
  for (auto [dev, host] : {std::pair{u, &r.u}, std::pair{a, &r.a}, std::pair{dg, &r.dg}, std::pair{du, &r.du}}) {
    host->resize(static_cast<size_t>(M * N));
    ex.to_host(host->data(), dev, host->size() * sizeof(float));
  }
  for (float* p : {dx, dw3, dgate, du_given, ddy, dw2, u, a, dg, du, da}) ex.deallocate(p);
  return r;
}

inline std::string runs_differ(const SwigluRun& want, const SwigluRun& got) {
  if (int64_t i = first_diff(want.u, got.u); i >= 0) return "u at " + std::to_string(i);
  if (int64_t i = first_diff(want.a, got.a); i >= 0) return "a at " + std::to_string(i);
  if (int64_t i = first_diff(want.dg, got.dg); i >= 0) return "dg at " + std::to_string(i);
  if (int64_t i = first_diff(want.du, got.du); i >= 0) return "du at " + std::to_string(i);
  return "";
}

}  // namespace olmoref::testing
