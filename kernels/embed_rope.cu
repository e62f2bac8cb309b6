#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/embed_rope.h"
#include "ref/elementwise.h"

namespace olmoref::kernels {

namespace {


__global__ void embedding_forward_kernel(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d) {
  const int64_t i = element_index();
  if (i < R * d) x[i] = table[static_cast<int64_t>(tokens[i / d]) * d + i % d];
}
__global__ void embedding_backward_kernel(const int64_t* start, const int64_t* order, const float* dx, float* dtable,
                                          int64_t V, int64_t d) {
  const int64_t i = element_index();
  if (i >= V * d) return;
  dtable[i] = elem::embedding_grad(start, order, dx, i / d, i % d, d);
}
__global__ void rope_kernel(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t T, const float* cos,
                            const float* sin, bool backward) {
  const int64_t half = hd / 2, i = element_index();
  if (i >= rows * n_heads * half) return;
  const int64_t j = i % half, h = (i / half) % n_heads, r = i / (half * n_heads);
  float* lo = x + r * n_heads * hd + h * hd + j;
  const float c = cos[(r % T) * half + j], s = sin[(r % T) * half + j];
  if (backward) elem::rope_pair_backward(lo[0], lo[half], c, s);
  else elem::rope_pair_forward(lo[0], lo[half], c, s);
}

}  // namespace

void embedding_forward_device(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d) {
  if (R * d == 0) return;
  embedding_forward_kernel<<<element_blocks(R * d), kElementThreads>>>(table, tokens, x, R, d);
  check_launch("embedding_forward_kernel");
}
void embedding_backward_device(const int64_t* start, const int64_t* order, const float* dx, float* dtable, int64_t V,
                               int64_t d) {
  if (V * d == 0) return;
  embedding_backward_kernel<<<element_blocks(V * d), kElementThreads>>>(start, order, dx, dtable, V, d);
  check_launch("embedding_backward_kernel");
}
void rope_forward_device(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t T, const float* cos,
                         const float* sin) {
  if (rows == 0) return;
  rope_kernel<<<element_blocks(rows * n_heads * (hd / 2)), kElementThreads>>>(x, rows, n_heads, hd, T, cos, sin, false);
  check_launch("rope_kernel");
}
void rope_backward_device(float* dx, int64_t rows, int64_t n_heads, int64_t hd, int64_t T, const float* cos,
                          const float* sin) {
  if (rows == 0) return;
  rope_kernel<<<element_blocks(rows * n_heads * (hd / 2)), kElementThreads>>>(dx, rows, n_heads, hd, T, cos, sin, true);
  check_launch("rope_kernel (backward)");
}

}  // namespace olmoref::kernels
