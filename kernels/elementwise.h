// kernels/elementwise.h — the exact-mode elementwise kernels, one source for the device and the host:
// SwiGLU (fp32 and the bf16 recipe), AdamW and SkipStepAdamW on one tensor, bf16 rounding, residual add, the instance tree's add,
// gradient scaling (clipping), embedding forward/backward, RoPE and the mixture of experts' dispatch, combine,
// input-gradient gather and shared-expert mix (docs/canonical/norm-rope-swiglu.md, step.md, bf16.md, moe.md).
//
// Each kernel is an op object whose operator()(i) computes element i with core/elementwise.h's and core/bf16.h's
// arithmetic (the functions the CPU loops call). On the device one thread runs one i (grid ceil(n / 256) x 256,
// kernels/elementwise.cu); on the host run_host runs i = 0, 1, ..., n-1. No element reads another's output,
// so both give the same bits. Pointers are executor memory.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "core/elementwise.h"
#include "core/hd.h"
#include "core/op_types.h"

namespace olmoref::kernels {

struct SwigluForwardOp {
  const float *g, *u;
  float* a;
  bool bf16;
  OLMOREF_HD void operator()(int64_t i) const {
    a[i] = bf16 ? elem::swiglu_forward_bf16(g[i], u[i]) : elem::swiglu_forward(g[i], u[i]);
  }
};
struct SwigluBackwardOp {
  const float *g, *u, *da;
  float *dg, *du;
  bool bf16;
  OLMOREF_HD void operator()(int64_t i) const {
    if (bf16) elem::swiglu_backward_bf16(g[i], u[i], da[i], dg[i], du[i]);
    else elem::swiglu_backward(g[i], u[i], da[i], dg[i], du[i]);
  }
};
struct AdamWOp {
  elem::AdamWScalars s;
  float decay;
  const float* grad;
  float *p, *m, *v;
  OLMOREF_HD void operator()(int64_t i) const { elem::adamw(s, decay, grad[i], p[i], m[i], v[i]); }
};
struct SkipStepAdamWOp {
  elem::SkipStepScalars s;
  const float* grad;
  float *p, *m, *v;
  OLMOREF_HD void operator()(int64_t i) const { elem::skip_step_adamw(s, grad[i], p[i], m[i], v[i]); }
};
struct RoundBf16Op {
  const float* in;
  float* out;  // may equal in
  OLMOREF_HD void operator()(int64_t i) const { out[i] = round_bf16(in[i]); }
};
struct AddOp {  // out = a + b; a may equal out (the instance tree's add)
  const float *a, *b;
  float* out;
  OLMOREF_HD void operator()(int64_t i) const { out[i] = a[i] + b[i]; }
};
struct ScaleOp {
  float* x;
  float c;
  OLMOREF_HD void operator()(int64_t i) const { x[i] = x[i] * c; }
};
// x[r, :] = table[tokens[r], :], element i = r·d + c.
struct EmbeddingForwardOp {
  const float* table;
  const uint32_t* tokens;
  float* x;
  int64_t d;
  OLMOREF_HD void operator()(int64_t i) const { x[i] = table[static_cast<int64_t>(tokens[i / d]) * d + i % d]; }
};
// dtable[v, c] over token v's positions in position order (start/order: core/embedding_order.h), from +0 or
// (accumulate) from dtable's value; element i = v·d + c; rows of absent tokens +0 (or kept).
struct EmbeddingBackwardOp {
  const int64_t *start, *order;
  const float* dx;
  float* dtable;
  int64_t d;
  bool accumulate;
  OLMOREF_HD void operator()(int64_t i) const {
    dtable[i] = elem::embedding_grad(start, order, dx, i / d, i % d, d, accumulate ? dtable[i] : 0.0f);
  }
};
// One rotate-half pair per element: i = (r·n_heads + h)·(hd/2) + j; row r has position elem::rope_position (r % T,
// or its position in its document); cos/sin [T, hd/2].
struct RopeOp {
  float* x;
  int64_t n_heads, hd, T;
  const float *cos, *sin;
  bool backward;
  const int32_t* positions = nullptr;
  OLMOREF_HD void operator()(int64_t i) const {
    const int64_t half = hd / 2, j = i % half, h = (i / half) % n_heads, r = i / (half * n_heads);
    float* lo = x + r * n_heads * hd + h * hd + j;
    const int64_t pos = elem::rope_position(positions, r, T);
    const float c = cos[pos * half + j], s = sin[pos * half + j];
    if (backward) elem::rope_pair_backward(lo[0], lo[half], c, s);
    else elem::rope_pair_forward(lo[0], lo[half], c, s);
  }
};

// Mixture of experts (docs/canonical/moe.md), a thread per output element, rows of width d. Each element's sum over
// the row's k choices is the chain of ref/moe.cpp, j in rank order, so no two threads write one element.
struct MoEDispatchOp {  // xg [S, d], i = p·d + c
  MoEDispatch plan;
  const float* x;
  float* xg;
  int64_t d;
  OLMOREF_HD void operator()(int64_t i) const { xg[i] = x[plan.row_of[i / d] * d + i % d]; }
};
struct MoECombineOp {  // out [R, d], i = r·d + c: the fma chain over j from 0
  MoEDispatch plan;
  const float *y, *weight;
  float* out;
  int64_t d;
  OLMOREF_HD void operator()(int64_t i) const {
    const int64_t r = i / d, c = i % d;
    float acc = 0.0f;
    for (int64_t j = 0; j < plan.k; ++j) acc = hd_fma(weight[r * plan.k + j], y[plan.position[r * plan.k + j] * d + c], acc);
    out[i] = acc;
  }
};
struct MoEScatterAddOp {  // dx [R, d], i = r·d + c: dx + each choice's row, j in order
  MoEDispatch plan;
  const float* dxg;
  float* dx;
  int64_t d;
  OLMOREF_HD void operator()(int64_t i) const {
    const int64_t r = i / d, c = i % d;
    float acc = dx[i];
    for (int64_t j = 0; j < plan.k; ++j) acc = acc + dxg[plan.position[r * plan.k + j] * d + c];
    dx[i] = acc;
  }
};
struct MoESharedCombineOp {  // out may be routed
  const float *shared, *routed;
  float* out;
  float div, alpha;  // k + 1, moe_routed_share(k)
  OLMOREF_HD void operator()(int64_t i) const { out[i] = shared[i] / div + routed[i] * alpha; }
};
struct MoESharedCombineBackwardOp {
  const float* dout;
  float *dshared, *drouted;
  float div, alpha;
  OLMOREF_HD void operator()(int64_t i) const {
    const float g = dout[i];
    dshared[i] = g / div;
    drouted[i] = g * alpha;
  }
};

template <class Op>
void run_host(const Op& op, int64_t n) {
  for (int64_t i = 0; i < n; ++i) op(i);
}
// The device launches (kernels/elementwise.cu; CUDA builds only).
void run_device(const SwigluForwardOp& op, int64_t n);
void run_device(const SwigluBackwardOp& op, int64_t n);
void run_device(const AdamWOp& op, int64_t n);
void run_device(const SkipStepAdamWOp& op, int64_t n);
void run_device(const RoundBf16Op& op, int64_t n);
void run_device(const AddOp& op, int64_t n);
void run_device(const ScaleOp& op, int64_t n);
void run_device(const EmbeddingForwardOp& op, int64_t n);
void run_device(const EmbeddingBackwardOp& op, int64_t n);
void run_device(const RopeOp& op, int64_t n);
void run_device(const MoEDispatchOp& op, int64_t n);
void run_device(const MoECombineOp& op, int64_t n);
void run_device(const MoEScatterAddOp& op, int64_t n);
void run_device(const MoESharedCombineOp& op, int64_t n);
void run_device(const MoESharedCombineBackwardOp& op, int64_t n);

// Element counts of the ops whose n is not the tensor size.
inline int64_t rope_elements(int64_t rows, int64_t n_heads, int64_t hd) { return rows * n_heads * (hd / 2); }

}  // namespace olmoref::kernels
