// Exact-mode elementwise kernels (kernels/elementwise.h). Grid: ceil(n / 256) blocks of 256 threads.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/elementwise.h"

namespace olmoref::kernels {

namespace {


__global__ void swiglu_forward_kernel(const float* g, const float* u, float* a, int64_t n, bool bf16) {
  const int64_t i = element_index();
  if (i < n) a[i] = bf16 ? elem::swiglu_forward_bf16(g[i], u[i]) : elem::swiglu_forward(g[i], u[i]);
}
__global__ void swiglu_backward_kernel(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                                       bool bf16) {
  const int64_t i = element_index();
  if (i >= n) return;
  if (bf16) elem::swiglu_backward_bf16(g[i], u[i], da[i], dg[i], du[i]);
  else elem::swiglu_backward(g[i], u[i], da[i], dg[i], du[i]);
}
__global__ void adamw_kernel(elem::AdamWScalars s, float decay, const float* grad, float* p, float* m, float* v,
                             int64_t n) {
  const int64_t i = element_index();
  if (i < n) elem::adamw(s, decay, grad[i], p[i], m[i], v[i]);
}
__global__ void round_bf16_kernel(float* x, int64_t n) {
  const int64_t i = element_index();
  if (i < n) x[i] = round_bf16(x[i]);
}
__global__ void tree_add_kernel(float* dst, const float* src, int64_t n) {
  const int64_t i = element_index();
  if (i < n) dst[i] = dst[i] + src[i];
}
__global__ void scale_kernel(float* x, float c, int64_t n) {
  const int64_t i = element_index();
  if (i < n) x[i] = x[i] * c;
}

}  // namespace

void swiglu_forward_device(const float* g, const float* u, float* a, int64_t n, bool bf16) {
  if (n == 0) return;
  swiglu_forward_kernel<<<element_blocks(n), kElementThreads>>>(g, u, a, n, bf16);
  check_launch("swiglu_forward_kernel");
}
void swiglu_backward_device(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n, bool bf16) {
  if (n == 0) return;
  swiglu_backward_kernel<<<element_blocks(n), kElementThreads>>>(g, u, da, dg, du, n, bf16);
  check_launch("swiglu_backward_kernel");
}
void adamw_device(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v, int64_t n) {
  if (n == 0) return;
  adamw_kernel<<<element_blocks(n), kElementThreads>>>(s, decay, grad, p, m, v, n);
  check_launch("adamw_kernel");
}
void round_bf16_device(float* x, int64_t n) {
  if (n == 0) return;
  round_bf16_kernel<<<element_blocks(n), kElementThreads>>>(x, n);
  check_launch("round_bf16_kernel");
}
void tree_add_device(float* dst, const float* src, int64_t n) {
  if (n == 0) return;
  tree_add_kernel<<<element_blocks(n), kElementThreads>>>(dst, src, n);
  check_launch("tree_add_kernel");
}
void scale_device(float* x, float c, int64_t n) {
  if (n == 0) return;
  scale_kernel<<<element_blocks(n), kElementThreads>>>(x, c, n);
  check_launch("scale_kernel");
}

}  // namespace olmoref::kernels
