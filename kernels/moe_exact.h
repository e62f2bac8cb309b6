// kernels/moe_exact.h — the mixture of experts' routing, combine backward and router backward in exact mode
// (docs/canonical/moe.md), one source for the CUDA kernels and their host execution (cuda-host).
//
// Row kernels as kernels/rmsnorm_exact.h: one block of 32 threads (a warp) per row; thread t is lane t of the
// canonical row reduction (core/reduce.h canonical_sum / canonical_dot: elements t, t+32, ... in order, then the
// 32-lane tree in shared memory), elementwise parts are split over the same threads by column, and the serial steps
// of a row (max, top-k scans, the weights' normalisation and its gradient) are thread 0 running core/moe_row.h, the
// code ref/moe.cpp runs. So the bits are ref/'s by construction, and the E and d of a row never decide a block shape.
//
// route:            logits [R, E] -> scores [R, E], lse [R], top [R, k], weight [R, k]
// combine backward: dout [R, d], y [S, d], weight [R, k] -> dy [S, d], dweight [R, k]
// router backward:  MoERouterBackward (scores, lse, top, weight, dweight, lb_grad) -> dlogits [R, E], which holds
//                   ds (the gradient of the scores) until the softmax backward overwrites it in place.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/mathfn_impl.h"
#include "core/moe_row.h"
#include "core/op_types.h"
#include "kernels/block.h"
#include "kernels/rmsnorm_exact.h"

namespace olmoref::kernels {

struct MoERouteArgs {
  int64_t R = 0, E = 0, k = 0;
  int normalize_p = 0;
  const float* logits = nullptr;  // [R, E]
  float* scores = nullptr;        // [R, E]
  float* lse = nullptr;           // [R]
  int32_t* top = nullptr;         // [R, k]
  float* weight = nullptr;        // [R, k]
};

struct MoECombineBackwardArgs {
  MoEDispatch plan;
  int64_t d = 0;
  const float* dout = nullptr;    // [R, d]
  const float* y = nullptr;       // [S, d]
  const float* weight = nullptr;  // [R, k]
  float* dy = nullptr;            // [S, d]
  float* dweight = nullptr;       // [R, k]
};

struct MoERouterBackwardArgs {
  MoERouterBackward in;
  float* dlogits = nullptr;       // [R, E]
};

// The lanes and the one value a row's threads share between phases (the row max, the softmax sum).
struct MoERowShared {
  float lane[kRowThreads];
  float value;
};

// canonical_dot(a [n], b [n]) as a warp computes it: lane t chains fma(a_i, b_i, ·) over i = t, t+32, ... from 0, then
// the 32-lane tree; the value is in sh.lane[0] for the phases that follow.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Block>
OLMOREF_HD void warp_dot_phases(Block& blk, MoERowShared& sh, const float* a, const float* b, int64_t n) {
  blk.phase([&](int t, auto&) {
    float acc = 0.0f;
    for (int64_t i = t; i < n; i += kRowThreads) acc = hd_fma(a[i], b[i], acc);
    sh.lane[t] = acc;
  });
  lane_tree_phases(blk, sh.lane);
}

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Block>
OLMOREF_HD void moe_route_row(Block& blk, MoERowShared& sh, const MoERouteArgs& a, int64_t row) {
  const float* l = a.logits + row * a.E;
  float* s = a.scores + row * a.E;
  blk.phase([&](int t, auto&) {
    if (t == 0) sh.value = moe_row::row_max(l, a.E);
  });
  blk.phase([&](int t, auto&) {  // s = expf(l − m) and the lanes of canonical_sum(s)
    float acc = 0.0f;
    for (int64_t e = t; e < a.E; e += kRowThreads) {
      s[e] = det::impl::expf(l[e] - sh.value);
      acc = acc + s[e];
    }
    sh.lane[t] = acc;
  });
  lane_tree_phases(blk, sh.lane);
  blk.phase([&](int t, auto&) {
    const float sum = sh.lane[0];
    for (int64_t e = t; e < a.E; e += kRowThreads) s[e] = s[e] / sum;
    if (t == 0) a.lse[row] = sh.value + det::impl::logf(sum);
  });
  blk.phase([&](int t, auto&) {  // the top-k scans read the whole row's scores: after the barrier above
    if (t != 0) return;
    int32_t* top = a.top + row * a.k;
    float* w = a.weight + row * a.k;
    moe_row::select_top_k(s, a.E, a.k, top, w);
    moe_row::normalize_weights(s, top, a.k, a.normalize_p, w);
  });
}

// Row r: for each choice j, dy[p] = weight[r, j] · dout[r] by column and dweight[r, j] = canonical_dot(dout[r], y[p]),
// p = position(r, j).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Block>
OLMOREF_HD void moe_combine_backward_row(Block& blk, MoERowShared& sh, const MoECombineBackwardArgs& a, int64_t row) {
  const int64_t k = a.plan.k, d = a.d;
  const float* g = a.dout + row * d;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = a.plan.position[row * k + j];
    warp_dot_phases(blk, sh, g, a.y + p * d, d);
    blk.phase([&](int t, auto&) {
      const float w = a.weight[row * k + j];
      float* dyp = a.dy + p * d;
      for (int64_t c = t; c < d; c += kRowThreads) dyp[c] = w * g[c];
      if (t == 0) a.dweight[row * k + j] = sh.lane[0];
    });
  }
}

// Row r: ds = the lb gradient of r's unit, then the chosen experts' ∂weight (thread 0, core/moe_row.h), then
// dl_e = moe_row::logit_grad(s_e, ds_e, canonical_dot(s, ds), fl32(z_grad · lse_r), z_grad), ds held in dlogits.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Block>
OLMOREF_HD void moe_router_backward_row(Block& blk, MoERowShared& sh, const MoERouterBackwardArgs& args, int64_t row) {
  const MoERouterBackward& a = args.in;
  const float* s = a.scores + row * a.E;
  float* ds = args.dlogits + row * a.E;
  blk.phase([&](int t, auto&) {
    const float* lb = a.lb_grad + (row / a.lb_rows) * a.E;
    for (int64_t e = t; e < a.E; e += kRowThreads) ds[e] = lb[e];
  });
  blk.phase([&](int t, auto&) {
    if (t == 0)
      moe_row::add_chosen_grad(s, a.top + row * a.k, a.weight + row * a.k, a.dweight + row * a.k, a.k, a.normalize_p, ds);
  });
  warp_dot_phases(blk, sh, s, ds, a.E);
  blk.phase([&](int t, auto&) {
    const float dot = sh.lane[0], zl = a.z_grad * a.lse[row];
    for (int64_t e = t; e < a.E; e += kRowThreads) ds[e] = moe_row::logit_grad(s[e], ds[e], dot, zl, a.z_grad);
  });
}

// Host executions (kernels/moe_exact_host.cpp) and device launches (kernels/moe_exact.cu): a block per row.
void moe_route_host(const MoERouteArgs& a);
void moe_combine_backward_host(const MoECombineBackwardArgs& a);
void moe_router_backward_host(const MoERouterBackwardArgs& a);
void moe_route_device(const MoERouteArgs& a);
void moe_combine_backward_device(const MoECombineBackwardArgs& a);
void moe_router_backward_device(const MoERouterBackwardArgs& a);

}  // namespace olmoref::kernels
