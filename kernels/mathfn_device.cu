#include "kernels/mathfn_device.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/mathfn_impl.h"

namespace olmoref::kernels {

__global__ void mathfn_kernel(MathFn fn, const float* in, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = in[i];
  switch (fn) {
    case MathFn::expf: out[i] = det::impl::expf(x); break;
    case MathFn::logf: out[i] = det::impl::logf(x); break;
    case MathFn::sigmoidf: out[i] = det::impl::sigmoidf(x); break;
    case MathFn::siluf: out[i] = det::impl::siluf(x); break;
  }
}

void mathfn_on_device(MathFn fn, const float* in, float* out, int64_t n) {
  float *din = nullptr, *dout = nullptr;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (cudaMalloc(&din, bytes) != cudaSuccess || cudaMalloc(&dout, bytes) != cudaSuccess)
    throw std::runtime_error("mathfn_on_device: cudaMalloc of " + std::to_string(bytes) + " bytes failed");
  cudaMemcpy(din, in, bytes, cudaMemcpyHostToDevice);
  mathfn_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(fn, din, dout, n);
  const cudaError_t err = cudaDeviceSynchronize();
  cudaMemcpy(out, dout, bytes, cudaMemcpyDeviceToHost);
  cudaFree(din);
  cudaFree(dout);
  if (err != cudaSuccess) throw std::runtime_error(std::string("mathfn_kernel: ") + cudaGetErrorString(err));
}

}  // namespace olmoref::kernels
