// kernels/launch.cuh — launch helpers shared by the .cu files: 1-D grids over n elements (shape only, never the
// SM count) and a launch-error check that names the kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace olmoref::kernels {

inline constexpr int kElementThreads = 256;
inline unsigned element_blocks(int64_t n) { return static_cast<unsigned>((n + kElementThreads - 1) / kElementThreads); }
__device__ inline int64_t element_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
// OLMOREF_CUDA_SYNC_LAUNCHES=1 (tools/gpu_check.sh's kernel and sanitizer steps): wait for every kernel, so a fault
// inside one is reported with its name instead of by whichever copy comes next. A debugging switch like CUDA's own
// CUDA_LAUNCH_BLOCKING: it changes when the host waits, never what a kernel computes.
inline bool sync_launches() {
  static const bool on = [] {
    const char* v = std::getenv("OLMOREF_CUDA_SYNC_LAUNCHES");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}
inline void check_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(kernel) + " launch: " + cudaGetErrorString(err));
  if (!sync_launches()) return;
  err = cudaDeviceSynchronize();
  if (err != cudaSuccess) throw std::runtime_error(std::string(kernel) + " execution: " + cudaGetErrorString(err));
}

}  // namespace olmoref::kernels
