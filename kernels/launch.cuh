// kernels/launch.cuh — launch helpers shared by the .cu files: 1-D grids over n elements (shape only, never the
// SM count) and a launch-error check that names the kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace olmoref::kernels {

inline constexpr int kElementThreads = 256;
inline unsigned element_blocks(int64_t n) { return static_cast<unsigned>((n + kElementThreads - 1) / kElementThreads); }
__device__ inline int64_t element_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(kernel) + " launch: " + cudaGetErrorString(err));
}

}  // namespace olmoref::kernels
