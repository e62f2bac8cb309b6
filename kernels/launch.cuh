// kernels/launch.cuh — launch helpers shared by the .cu files: 1-D grids over n elements (shape only, never the
// SM count) and a launch-error check that names the kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace olmoref::kernels {

// The stream this thread's kernels go to: the legacy default stream (0), but inside a kernels::StreamScope
// (kernels/device_memory.h), where the work queued on a side stream runs (dist::SideStream::run).
cudaStream_t current_stream();

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
// BENCH ONLY: the dynamic shared memory that leaves `kernel` (`threads` a block, `static_shared` bytes of its own) one
// block an SM: more than half the SM's with the static part, which the kernel never touches (so the grid and the bits
// stay), with the attribute that allows a launch past the 48 KiB default set. What a second block an SM buys is the
// kernel's time so held over its time as built. Held so, the SM also gives more of its L1 to shared memory, so the
// ratio bounds occupancy's share from above. Throws unless the device then holds exactly one block an SM.
template <class Kernel>
size_t one_block_per_sm_shared_bytes(Kernel* kernel, size_t static_shared, int threads, const char* name) {
  const auto check = [name](cudaError_t err, const char* what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(name) + ": " + what + ": " + cudaGetErrorString(err));
  };
  int device = 0, per_sm = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
        "cudaDeviceGetAttribute(shared memory per SM)");
  const size_t bytes = static_cast<size_t>(per_sm) / 2 + 1 - static_shared + 1024;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute(max dynamic shared memory)");
  int blocks = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, bytes),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (blocks != 1)
    throw std::runtime_error(std::string(name) + " held to one block an SM: " + std::to_string(bytes) +
                             " bytes of dynamic shared memory leave " + std::to_string(blocks) + " blocks an SM");
  return bytes;
}

// A kernel's registers a thread and the blocks of `threads` an SM holds at once, as this device compiles and places it.
struct KernelFit {
  int registers = 0, blocks_per_sm = 0;
};
template <class Kernel>
KernelFit kernel_fit(Kernel* kernel, int threads, const char* name) {
  cudaFuncAttributes attributes{};
  KernelFit fit;
  cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit.blocks_per_sm, kernel, threads, 0);
  if (err != cudaSuccess) throw std::runtime_error(std::string(name) + ": kernel_fit: " + cudaGetErrorString(err));
  fit.registers = attributes.numRegs;
  return fit;
}

inline void check_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(kernel) + " launch: " + cudaGetErrorString(err));
  if (!sync_launches()) return;
  err = cudaDeviceSynchronize();
  if (err != cudaSuccess) throw std::runtime_error(std::string(kernel) + " execution: " + cudaGetErrorString(err));
}

}  // namespace olmoref::kernels
