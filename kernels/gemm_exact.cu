// The exact-mode GEMM on the device: the decomposition of kernels/gemm_exact.h, one block per output tile.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/gemm_exact.h"

namespace olmoref::kernels {

// sm_90 (nvcc 13.0, -Xptxas -v; kernels-ptxas-budget prints it): 180 registers since the interior tiles' unchecked
// fetch (138 before), no stack, no spills, 16.5 KiB of shared memory. Capping it at 128 registers for two blocks per
// SM (__launch_bounds__(256, 2)) spills the accumulators, so one block it is.
__global__ void __launch_bounds__(kGemmThreads) gemm_exact_kernel(GemmArgs g) {
  __shared__ GemmShared sh;
  DeviceBlock<GemmRegs, kGemmThreads> blk;
  gemm_exact_block(blk, sh, g, blockIdx.y, blockIdx.x);
}

void gemm_exact_device(const GemmArgs& g) {
  if (g.debug_split_k)  // the kernel compiles the split out (#if !defined(__CUDA_ARCH__)): refused, never ignored
    throw std::invalid_argument("gemm_exact_device: debug_split_k is a host-only negative control (cuda-host)");
  if (g.M == 0 || g.N == 0) return;
  const dim3 grid(static_cast<unsigned>(gemm_grid_cols(g.N)), static_cast<unsigned>(gemm_grid_rows(g.M)));
  if (gemm_grid_rows(g.M) > 65535) throw std::invalid_argument("gemm_exact_device: M too large for one launch");
  gemm_exact_kernel<<<grid, kGemmThreads>>>(g);
  check_launch("gemm_exact_kernel");
}

}  // namespace olmoref::kernels
