// kernels/rmsnorm_exact.h — RMSNorm / QK-norm forward and backward in exact mode (docs/canonical/
// norm-rope-swiglu.md, reductions.md), one source for the CUDA kernels and their host execution.
//
// Row kernels: one block of 32 threads (one warp) per row; thread j is lane j of the canonical row reduction,
// accumulating elements j, j+32, ... in order, then the 32-lane tree in shared memory. Elementwise parts are
// split over the same 32 threads by column. The weight gradient is a column kernel: one thread per column, a
// chain over the rows in order (the model calls it per instance: the leaf of the instance tree).
#pragma once

#include <cstdint>

#include "kernels/block.h"
#include "ref/hd.h"

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
  float* dw = nullptr;        // [n], overwritten by the column kernel
};

// y = w ⊙ (x · r), r = 1/sqrt(rowsum32(fma(x, x)) · (1/n) + eps), for row `row`.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
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
    for (int64_t c = t; c < a.n; c += kRowThreads) yr[c] = a.w[c] * (xr[c] * ir);
  });
}

// dx = r · (g − x̂ · (rowsum32(fma(g, x̂)) · (1/n))), g = dy ⊙ w, x̂ = x · r, for row `row`.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Block>
OLMOREF_HD void rmsnorm_backward_row(Block& blk, RowShared& sh, const RmsNormArgs& a, int64_t row) {
  const float* xr = a.x + row * a.n;
  const float* dyr = a.dy + row * a.n;
  const float ir = a.inv_rms[row];
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

// dw[c] = chain over rows 0..R-1 of fma(dy[r, c], x[r, c] · r_r, ·), from 0; block `b` holds columns
// [b·256, (b+1)·256).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Block>
OLMOREF_HD void rmsnorm_weight_grad_block(Block& blk, const RmsNormArgs& a, int64_t b) {
  blk.phase([&](int t, auto&) {
    const int64_t c = b * kColumnThreads + t;
    if (c >= a.n) return;
    float acc = 0.0f;
    for (int64_t r = 0; r < a.R; ++r) acc = hd_fma(a.dy[r * a.n + c], a.x[r * a.n + c] * a.inv_rms[r], acc);
    a.dw[c] = acc;
  });
}

// Host executions of the kernels (kernels/rmsnorm_exact_host.cpp) and the device launches (.cu).
void rmsnorm_forward_host(const RmsNormArgs& a);
void rmsnorm_backward_host(const RmsNormArgs& a);  // dx and dw
void rmsnorm_forward_device(const RmsNormArgs& a);
void rmsnorm_backward_device(const RmsNormArgs& a);

}  // namespace olmoref::kernels
