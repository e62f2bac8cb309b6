// core/elementwise.h — the per-element arithmetic of SwiGLU, RoPE, the fused RMSNorm tails and AdamW, one source
// for the CPU loops (ref/ops.cpp, core/optim.cpp, ref/simd_ops_impl.h) and the CUDA kernels (kernels/). Elementwise
// ops have no order; only their formula and rounding points matter (docs/canonical/norm-rope-swiglu.md, step.md,
// bf16.md).
#pragma once

#include "core/bf16.h"
#include "core/hd.h"
#include "core/mathfn_impl.h"

namespace olmoref::elem {

// a = silu(g) · u. V is float or a SIMD register (core/lanes.h): the same formula per lane.
template <class V>
OLMOREF_HD inline V swiglu_forward(V g, V u) { return det::impl::siluf(g) * u; }
// silu'(g) = σ(g)·(1 + g·(1 − σ(g))); du = da·silu(g), dg = (da·u)·silu'(g)
// σ(g) = 1 / (1 + expf(−g)) and silu(g) = g / (1 + expf(−g)) share expf(−g) and the denominator (the same
// operations as det::impl::sigmoidf and siluf, evaluated once).
template <class V>
OLMOREF_HD inline void swiglu_backward(V g, V u, V da, V& dg, V& du) {
  const V den = 1.0f + det::impl::expf(-g);
  const V sg = 1.0f / den;
  const V silu = g / den;
  const V dsilu = sg * (1.0f + g * (1.0f - sg));
  du = da * silu;
  dg = (da * u) * dsilu;
}
// bf16 recipe: s = bf16(silu(g)), a = bf16(s·u); du = bf16(da·s), dg = bf16(bf16(da·u)·silu'(g)).
OLMOREF_HD inline float swiglu_forward_bf16(float g, float u) { return round_bf16(round_bf16(det::impl::siluf(g)) * u); }
OLMOREF_HD inline void swiglu_backward_bf16(float g, float u, float da, float& dg, float& du) {
  const float sg = det::impl::sigmoidf(g);
  const float silu = round_bf16(det::impl::siluf(g));  // the bf16 tensor the forward multiplied
  const float dsilu = sg * (1.0f + g * (1.0f - sg));
  du = round_bf16(da * silu);
  dg = round_bf16(round_bf16(da * u) * dsilu);
}

// The SwiGLU GEMM epilogues, per element (ref/ops.cpp on the CPU, kernels/gemm_exact.h gemm_store on CUDA): the
// finished product as its tensor stores it (bf16: rounded), then SwiGLU from it. Forward: u in = the product, out =
// u as stored; returns a. Backward: da = the product; dg, du as swiglu_backward(_bf16).
OLMOREF_HD inline float swiglu_forward_from_product(float g, float& u, bool bf16) {
  if (bf16) u = round_bf16(u);
  return bf16 ? swiglu_forward_bf16(g, u) : swiglu_forward(g, u);
}
OLMOREF_HD inline void swiglu_backward_from_product(float g, float u, float da, bool bf16, float& dg, float& du) {
  if (bf16) swiglu_backward_bf16(g, u, round_bf16(da), dg, du);
  else swiglu_backward(g, u, da, dg, du);
}

// The position RoPE rotates row r of an instance of T rows by: under intra-document masking its position in its
// document (positions [rows], docs/canonical/documents.md), else r % T.
OLMOREF_HD inline int64_t rope_position(const int32_t* positions, int64_t r, int64_t T) {
  return positions ? positions[r] : r % T;
}

// RoPE on one rotate-half pair (lo = element j, hi = element j + hd/2) with the table's c = cos, s = sin:
// forward lo' = lo·c − hi·s, hi' = hi·c + lo·s; backward (Rᵀ) lo' = lo·c + hi·s, hi' = hi·c − lo·s. Each product
// rounded, then the sum, as PyTorch.
OLMOREF_HD inline void rope_pair_forward(float& lo, float& hi, float c, float s) {
  const float a = lo, b = hi;
  const float p1 = a * c, p2 = b * s, p3 = b * c, p4 = a * s;
  lo = p1 - p2;
  hi = p3 + p4;
}
OLMOREF_HD inline void rope_pair_backward(float& lo, float& hi, float c, float s) {
  const float a = lo, b = hi;
  const float p1 = a * c, p2 = b * s, p3 = b * c, p4 = a * s;
  lo = p1 + p2;
  hi = p3 - p4;
}

// The value a tensor holds as the unfused op sequence stores it: rounded to bf16 in bf16 precision (round_act),
// as computed in fp32. `round` is round_bf16 on V (a float: RoundBf16; a SIMD register: its lanes').
template <class V, class Round>
OLMOREF_HD inline V as_stored(V v, bool bf16, Round round) { return bf16 ? round(v) : v; }
// The output of a fused RMSNorm from its normed value y = w·(x·r): y as stored (bf16: rounded), then, with a
// residual, res + that, stored again (bf16: the sum rounded) — rmsnorm; round; add(res, ·); round, bit for bit.
template <class V, class Round>
OLMOREF_HD inline V fused_norm_output(V y, V res, bool residual, bool bf16, Round round) {
  const V normed = as_stored(y, bf16, round);
  return residual ? as_stored(res + normed, bf16, round) : normed;
}
struct RoundBf16 {
  OLMOREF_HD float operator()(float x) const { return round_bf16(x); }
};

// Embedding gradient dtable[v, c]: token v's positions order[start[v] .. start[v+1]) summed in order with
// plain adds from +0 (core/embedding_order.h), or from `from`: a sum over an instance's positions split in runs
// continues run by run.
OLMOREF_HD inline float embedding_grad(const int64_t* start, const int64_t* order, const float* dx, int64_t v, int64_t c,
                                       int64_t d, float from = 0.0f) {
  float row = from;
  for (int64_t k = start[v]; k < start[v + 1]; ++k) row = row + dx[order[k] * d + c];
  return row;
}

// AdamW's fp32 scalars of one step (formed in fp64 and rounded once by the caller, core/optim.cpp).
struct AdamWScalars {
  float step_size, bc2_sqrt, one_minus_b1, b2, one_minus_b2, eps;
};
// p = p·decay; m = m + (1−β1)(g − m); v = β2·v + (1−β2)·g²; p = p − step_size·(m / (sqrt(v)/bc2 + eps))
OLMOREF_HD inline void adamw(const AdamWScalars& s, float decay, float g, float& p, float& m, float& v) {
  const float pd = p * decay;
  const float mi = m + s.one_minus_b1 * (g - m);
  const float vi = s.b2 * v + s.one_minus_b2 * (g * g);
  const float denom = hd_sqrt(vi) / s.bc2_sqrt + s.eps;
  p = pd - s.step_size * (mi / denom);
  m = mi;
  v = vi;
}

// SkipStepAdamW's fp32 scalars of one step and group (OLMo-core's foreach_adamw_step; core/skip_step.h forms them).
// With step_factor 0 (a skipped step) decay = c1 = c2 = 1, w1 = w2 = 0 and neg_step_size = −0: the same arithmetic
// then leaves p, m, v as they were (up to the sign of zeros and NaN propagation, exactly as OLMo-core's tensors).
struct SkipStepScalars {
  float decay, c1, w1, c2, w2, bc2_sqrt, eps, neg_step_size;
};
// Each line one of OLMo-core's foreach ops, each rounded to fp32 (no fma):
//   p·decay;  m·c1 + g·w1;  v·c2 + (g·g)·w2;  (sqrt(v)/bc2_sqrt + eps);  p + (m/denom)·neg_step_size
OLMOREF_HD inline void skip_step_adamw(const SkipStepScalars& s, float g, float& p, float& m, float& v) {
  const float pd = p * s.decay;
  const float mc = m * s.c1;
  const float gw = g * s.w1;
  const float mi = mc + gw;
  const float g2 = g * g;
  const float vc = v * s.c2;
  const float gw2 = g2 * s.w2;
  const float vi = vc + gw2;
  const float denom = hd_sqrt(vi) / s.bc2_sqrt + s.eps;
  const float update = (mi / denom) * s.neg_step_size;
  p = pd + update;
  m = mi;
  v = vi;
}

}  // namespace olmoref::elem
