// kernels/rmsnorm_exact.h — RMSNorm / QK-norm forward and backward in exact mode (docs/canonical/
// norm-rope-swiglu.md, reductions.md), one source for the CUDA kernels and their host execution.
//
// Row kernels: one block of 32 threads (one warp) per row; thread j is lane j of the canonical row reduction,
// accumulating elements j, j+32, ... in order, then the 32-lane tree in shared memory. Elementwise parts are
// split over the same 32 threads by column. The weight gradient is a column kernel: one thread per column, a
// chain over the rows in order (the model calls it per instance: the leaf of the instance tree).
//
// The fused ops (core/executor.h) are these kernels with an epilogue or prologue, chosen by the arguments:
// rmsnorm_residual_forward and rmsnorm_rope_forward end the forward row kernel's final phase with the residual
// add, or with RoPE by a thread per rotate-half pair (both of a pair's normed values are that thread's own, so
// there is no barrier and no intermediate tensor); rope_rmsnorm_backward puts a RoPE-backward phase on dy, in
// place, in front of the backward row kernel. Each keeps the unfused sequence's bf16 rounding points.
#pragma once

#include <cstdint>

#include "kernels/block.h"
#include "core/elementwise.h"
#include "core/hd.h"

namespace olmoref::kernels {

inline constexpr int kRowThreads = 32;
inline constexpr int kColumnThreads = 256;

struct RowShared {
  float lane[kRowThreads];
};

struct RmsNormArgs {
  int64_t R = 0, n = 0;
  const float* x = nullptr;   // [R, n]
  const float* w = nullptr;   // [n]
  float* y = nullptr;         // forward output [R, n]
  float* inv_rms = nullptr;   // [R]: written by forward, read by backward
  float eps = 0.0f;
  const float* dy = nullptr;  // backward input [R, n]
  float* dx = nullptr;        // backward output [R, n]
  float* dw = nullptr;        // [n], overwritten by the column kernel (accumulate_dw: its chains continued)
  bool accumulate_dw = false;
  // Forward epilogues (none when res and rope_cos are null): y = res + RMSNorm(x), res [R, n]; or
  // y = RoPE(RMSNorm(x)) over n = n_heads·hd with row r at position elem::rope_position (r % T, or its position in
  // its document from rope_positions [R]), rope_cos/rope_sin [T, hd/2].
  // Backward prologue (rope_cos and dy_rope set, dy == dy_rope): dy rotated back by RoPE in place first.
  // bf16: round where the unfused sequence rounds (elem::fused_norm_output, elem::as_stored).
  const float* res = nullptr;
  float* dy_rope = nullptr;
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  const int32_t* rope_positions = nullptr;
  int64_t n_heads = 0, hd = 0, T = 0;
  bool bf16 = false;
};

// y = w ⊙ (x · r), r = 1/sqrt(rowsum32(fma(x, x)) · (1/n) + eps), for row `row`.
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void rmsnorm_forward_row(Block& blk, RowShared& sh, const RmsNormArgs& a, int64_t row) {
  const float* xr = a.x + row * a.n;
  blk.phase([&](int t, auto&) {
    float acc = 0.0f;
    for (int64_t c = t; c < a.n; c += kRowThreads) acc = hd_fma(xr[c], xr[c], acc);
    sh.lane[t] = acc;
  });
  lane_tree_phases(blk, sh.lane);
  blk.phase([&](int t, auto&) {
    const float inv_n = 1.0f / static_cast<float>(a.n);
    const float ir = 1.0f / hd_sqrt(sh.lane[0] * inv_n + a.eps);
    if (t == 0) a.inv_rms[row] = ir;
    float* yr = a.y + row * a.n;
    const float* resr = a.res ? a.res + row * a.n : nullptr;
    const auto normed = [&](int64_t c) {
      return elem::fused_norm_output(a.w[c] * (xr[c] * ir), resr ? resr[c] : 0.0f, resr != nullptr, a.bf16,
                                     elem::RoundBf16{});
    };
    if (!a.rope_cos) {
      for (int64_t c = t; c < a.n; c += kRowThreads) yr[c] = normed(c);
      return;
    }
    // Pair p = (head p / (hd/2), element j = p % (hd/2)): lo = head·hd + j, hi = lo + hd/2.
    const int64_t half = a.hd / 2;
    const float* cr = a.rope_cos + elem::rope_position(a.rope_positions, row, a.T) * half;
    const float* sr = a.rope_sin + elem::rope_position(a.rope_positions, row, a.T) * half;
    for (int64_t p = t; p < a.n_heads * half; p += kRowThreads) {
      const int64_t j = p % half, lo = (p / half) * a.hd + j;
      float vlo = normed(lo), vhi = normed(lo + half);
      elem::rope_pair_forward(vlo, vhi, cr[j], sr[j]);
      yr[lo] = elem::as_stored(vlo, a.bf16, elem::RoundBf16{});
      yr[lo + half] = elem::as_stored(vhi, a.bf16, elem::RoundBf16{});
    }
  });
}

// dx = r · (g − x̂ · (rowsum32(fma(g, x̂)) · (1/n))), g = dy ⊙ w, x̂ = x · r, for row `row`.
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void rmsnorm_backward_row(Block& blk, RowShared& sh, const RmsNormArgs& a, int64_t row) {
  const float* xr = a.x + row * a.n;
  const float* dyr = a.dy + row * a.n;
  const float ir = a.inv_rms[row];
  if (a.dy_rope) {
    // The fused RoPE backward: a thread per rotate-half pair, as the forward epilogue; the barrier after this
    // phase publishes the rotated row to the threads of the reduction.
    blk.phase([&](int t, auto&) {
      const int64_t half = a.hd / 2;
      const float* cr = a.rope_cos + elem::rope_position(a.rope_positions, row, a.T) * half;
      const float* sr = a.rope_sin + elem::rope_position(a.rope_positions, row, a.T) * half;
      float* gr = a.dy_rope + row * a.n;
      for (int64_t p = t; p < a.n_heads * half; p += kRowThreads) {
        const int64_t j = p % half, lo = (p / half) * a.hd + j;
        elem::rope_pair_backward(gr[lo], gr[lo + half], cr[j], sr[j]);
        gr[lo] = elem::as_stored(gr[lo], a.bf16, elem::RoundBf16{});
        gr[lo + half] = elem::as_stored(gr[lo + half], a.bf16, elem::RoundBf16{});
      }
    });
  }
  blk.phase([&](int t, auto&) {
    float acc = 0.0f;
    for (int64_t c = t; c < a.n; c += kRowThreads) acc = hd_fma(dyr[c] * a.w[c], xr[c] * ir, acc);
    sh.lane[t] = acc;
  });
  lane_tree_phases(blk, sh.lane);
  blk.phase([&](int t, auto&) {
    const float mean_gx = sh.lane[0] * (1.0f / static_cast<float>(a.n));
    float* dxr = a.dx + row * a.n;
    for (int64_t c = t; c < a.n; c += kRowThreads) {
      const float g = dyr[c] * a.w[c], xh = xr[c] * ir;
      dxr[c] = ir * (g - xh * mean_gx);
    }
  });
}

// dw[c] = chain over rows 0..R-1 of fma(dy[r, c], x[r, c] · r_r, ·), from 0 (accumulate_dw: from dw[c]); block `b` holds columns
// [b·256, (b+1)·256).
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void rmsnorm_weight_grad_block(Block& blk, const RmsNormArgs& a, int64_t b) {
  blk.phase([&](int t, auto&) {
    const int64_t c = b * kColumnThreads + t;
    if (c >= a.n) return;
    float acc = a.accumulate_dw ? a.dw[c] : 0.0f;
    for (int64_t r = 0; r < a.R; ++r) acc = hd_fma(a.dy[r * a.n + c], a.x[r * a.n + c] * a.inv_rms[r], acc);
    a.dw[c] = acc;
  });
}

// Host executions of the kernels (kernels/rmsnorm_exact_host.cpp) and the device launches (.cu). Forward runs
// the epilogue the arguments ask for.
void rmsnorm_forward_host(const RmsNormArgs& a);
void rmsnorm_backward_host(const RmsNormArgs& a);  // dx and dw (after the RoPE prologue, when asked)
void rmsnorm_forward_device(const RmsNormArgs& a);
void rmsnorm_backward_device(const RmsNormArgs& a);

}  // namespace olmoref::kernels
