// tests/kernels/norm_cases.h — RMSNorm shapes and operands shared by the host-decomposition test, the GPU test and
// the fused-form test (tests/ref/test_fused.cpp): rows shorter and longer than a warp, widths that are not
// multiples of 8, 16 or 32, more columns than a block; and the fused forms of core/executor.h run on any executor
// next to the unfused op sequences they replace.
#pragma once

#include <cmath>
#include <cstring>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/rmsnorm_exact.h"
#include "core/executor.h"
#include "ref/ops.h"

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

// ---- fused forms ----
// QK-norm + RoPE shapes: R rows of T positions, n_heads heads of hd (n = n_heads·hd): single rows, one pair per
// head, pair counts and widths that are not multiples of the SIMD or warp widths, more pairs than a warp.
struct RopeNormCase {
  int64_t R, T, n_heads, hd;
  int64_t n() const { return n_heads * hd; }
};
inline std::vector<RopeNormCase> rope_norm_cases() {
  return {{1, 1, 1, 2}, {1, 1, 3, 6}, {7, 7, 3, 6}, {37, 5, 1, 8}, {37, 5, 5, 16}, {9, 4, 4, 64}, {5, 5, 3, 22},
          {6, 2, 2, 34}, {3, 3, 1, 514}};
}

// Operands as the model feeds them: in bf16 every input tensor is bf16-valued (dy stands in for the residual).
inline NormOperands fused_operands(int64_t R, int64_t n, uint32_t seed, bool bf16) {
  NormOperands o = norm_operands(NormCase{R, n}, seed);
  if (bf16)
    for (std::vector<float>* v : {&o.x, &o.w, &o.dy})
      for (float& f : *v) f = round_bf16(f);
  return o;
}

struct FusedRun {
  std::vector<float> y, inv_rms;
};

// The run's y [R, n] and inv_rms [R], once the executor is done.
inline FusedRun fetch_run(Executor& e, const Buffer<float>& y, const Buffer<float>& inv_rms, int64_t R, int64_t n) {
  FusedRun r{std::vector<float>(static_cast<size_t>(R * n)), std::vector<float>(static_cast<size_t>(R))};
  e.synchronize();
  y.download(r.y.data(), R * n);
  inv_rms.download(r.inv_rms.data(), R);
  return r;
}

// out = res + RMSNorm(x) with res = o.dy: the fused op, or the sequence model/olmo3.cpp ran before it existed.
inline FusedRun run_residual_norm(Executor& e, bool fused, bool bf16, int64_t R, int64_t n, const NormOperands& o) {
  Buffer<float> x(e, R * n, "x"), w(e, n, "w"), res(e, R * n, "res"), out(e, R * n, "out"), ir(e, R, "inv_rms");
  x.upload(o.x.data(), R * n);
  w.upload(o.w.data(), n);
  res.upload(o.dy.data(), R * n);
  if (fused) {
    e.rmsnorm_residual_forward(res.data(), x.data(), w.data(), out.data(), ir.data(), R, n, 1e-6f, bf16);
  } else {
    Buffer<float> tmp(e, R * n, "normed");
    e.rmsnorm_forward(x.data(), w.data(), tmp.data(), ir.data(), R, n, 1e-6f);
    if (bf16) e.round_bf16(tmp.data(), R * n);
    e.add(res.data(), tmp.data(), out.data(), R * n);
    if (bf16) e.round_bf16(out.data(), R * n);
  }
  return fetch_run(e, out, ir, R, n);
}

// y = RoPE(RMSNorm(x)): the fused op, or rmsnorm_forward; round; rope_forward; round.
inline FusedRun run_rope_norm(Executor& e, bool fused, bool bf16, const RopeNormCase& c, const NormOperands& o) {
  const int64_t R = c.R, n = c.n();
  const RopeTable t = make_rope_table(c.T, c.hd, 500000.0);
  Buffer<float> x(e, R * n, "x"), w(e, n, "w"), y(e, R * n, "y"), ir(e, R, "inv_rms");
  Buffer<float> cos(e, static_cast<int64_t>(t.cos.size()), "cos"), sin(e, static_cast<int64_t>(t.sin.size()), "sin");
  x.upload(o.x.data(), R * n);
  w.upload(o.w.data(), n);
  cos.upload(t.cos.data(), cos.size());
  sin.upload(t.sin.data(), sin.size());
  const RopeView rope{c.T, c.hd, cos.data(), sin.data()};
  if (fused) {
    e.rmsnorm_rope_forward(x.data(), w.data(), y.data(), ir.data(), R, c.n_heads, rope, 1e-6f, bf16);
  } else {
    e.rmsnorm_forward(x.data(), w.data(), y.data(), ir.data(), R, n, 1e-6f);
    if (bf16) e.round_bf16(y.data(), R * n);
    e.rope_forward(y.data(), R, c.n_heads, rope);
    if (bf16) e.round_bf16(y.data(), R * n);
  }
  return fetch_run(e, y, ir, R, n);
}

// The backward: dy = o.dy rotated back in place, then dx, dw; or rope_backward; round; rmsnorm_backward. The forward
// (unfused, on the same executor) provides inv_rms. y holds the rotated dy, then dx, then dw; inv_rms the forward's.
inline FusedRun run_rope_norm_backward(Executor& e, bool fused, bool bf16, const RopeNormCase& c,
                                       const NormOperands& o) {
  const int64_t R = c.R, n = c.n();
  const RopeTable t = make_rope_table(c.T, c.hd, 500000.0);
  Buffer<float> x(e, R * n, "x"), w(e, n, "w"), y(e, R * n, "y"), ir(e, R, "inv_rms");
  Buffer<float> dy(e, R * n, "dy"), dx(e, R * n, "dx"), dw(e, n, "dw");
  Buffer<float> cos(e, static_cast<int64_t>(t.cos.size()), "cos"), sin(e, static_cast<int64_t>(t.sin.size()), "sin");
  x.upload(o.x.data(), R * n);
  w.upload(o.w.data(), n);
  dy.upload(o.dy.data(), R * n);
  cos.upload(t.cos.data(), cos.size());
  sin.upload(t.sin.data(), sin.size());
  const RopeView rope{c.T, c.hd, cos.data(), sin.data()};
  e.rmsnorm_forward(x.data(), w.data(), y.data(), ir.data(), R, n, 1e-6f);
  if (fused) {
    e.rope_rmsnorm_backward(x.data(), w.data(), ir.data(), dy.data(), dx.data(), dw.data(), R, c.n_heads, rope, bf16,
                            false);
  } else {
    e.rope_backward(dy.data(), R, c.n_heads, rope);
    if (bf16) e.round_bf16(dy.data(), R * n);
    e.rmsnorm_backward(x.data(), w.data(), ir.data(), dy.data(), dx.data(), dw.data(), R, n, false);
  }
  FusedRun r{std::vector<float>(static_cast<size_t>(2 * R * n + n)), std::vector<float>(static_cast<size_t>(R))};
  e.synchronize();
  dy.download(r.y.data(), R * n);
  dx.download(r.y.data() + R * n, R * n);
  dw.download(r.y.data() + 2 * R * n, n);
  ir.download(r.inv_rms.data(), R);
  return r;
}

inline bool same_bits(const FusedRun& a, const FusedRun& b) {
  return a.y.size() == b.y.size() && a.inv_rms.size() == b.inv_rms.size() &&
         std::memcmp(a.y.data(), b.y.data(), a.y.size() * sizeof(float)) == 0 &&
         std::memcmp(a.inv_rms.data(), b.inv_rms.data(), a.inv_rms.size() * sizeof(float)) == 0;
}

}  // namespace olmoref::testing
