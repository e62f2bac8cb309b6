#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/embed_rope.h"
#include "ref/elementwise.h"

namespace olmoref::kernels {

namespace {

constexpr int kThreads = 256;
unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }
__device__ int64_t element() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + " launch: " + cudaGetErrorString(err));
}

__global__ void embedding_forward_kernel(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d) {
  const int64_t i = element();
  if (i < R * d) x[i] = table[static_cast<int64_t>(tokens[i / d]) * d + i % d];
}
__global__ void embedding_backward_kernel(const int64_t* start, const int64_t* order, const float* dx, float* dtable,
                                          int64_t V, int64_t d) {
  const int64_t i = element();
  if (i >= V * d) return;
  dtable[i] = elem::embedding_grad(start, order, dx, i / d, i % d, d);
}
__global__ void rope_kernel(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t T, const float* cos,
                            const float* sin, bool backward) {
  const int64_t half = hd / 2, i = element();
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
  embedding_forward_kernel<<<blocks(R * d), kThreads>>>(table, tokens, x, R, d);
  check_launch("embedding_forward_kernel");
}
void embedding_backward_device(const int64_t* start, const int64_t* order, const float* dx, float* dtable, int64_t V,
                               int64_t d) {
  if (V * d == 0) return;
  embedding_backward_kernel<<<blocks(V * d), kThreads>>>(start, order, dx, dtable, V, d);
  check_launch("embedding_backward_kernel");
}
void rope_forward_device(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t T, const float* cos,
                         const float* sin) {
  if (rows == 0) return;
  rope_kernel<<<blocks(rows * n_heads * (hd / 2)), kThreads>>>(x, rows, n_heads, hd, T, cos, sin, false);
  check_launch("rope_kernel");
}
void rope_backward_device(float* dx, int64_t rows, int64_t n_heads, int64_t hd, int64_t T, const float* cos,
                          const float* sin) {
  if (rows == 0) return;
  rope_kernel<<<blocks(rows * n_heads * (hd / 2)), kThreads>>>(dx, rows, n_heads, hd, T, cos, sin, true);
  check_launch("rope_kernel (backward)");
}

}  // namespace olmoref::kernels
