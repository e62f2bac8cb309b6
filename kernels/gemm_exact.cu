// The exact-mode GEMM on the device: the decomposition of kernels/gemm_exact.h, one block per output tile.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/gemm_exact.h"

namespace olmoref::kernels {

// sm_90 (nvcc 13.0, -Xptxas -v; kernels-ptxas-budget prints it): 125 registers, no stack, no spills, 16.5 KiB of
// shared memory, so two blocks an SM (16 warps), one's slab barrier under the other's fmas. It was 180 registers and
// one block an SM while each staged element's address was its own 64-bit product (gemm_fetch_slab's walk replaced
// them). The bound keeps it there: a change that needs more registers shows as a spill in kernels-ptxas-budget.
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_exact_kernel(GemmArgs g) {
  __shared__ GemmShared sh;
  DeviceBlock<GemmRegs, kGemmThreads> blk;
  gemm_exact_block(blk, sh, g, blockIdx.y, blockIdx.x);
}

namespace {

void launch(const GemmArgs& g, size_t unused_shared_bytes) {
  if (g.debug_split_k)  // the kernel compiles the split out (#if !defined(__CUDA_ARCH__)): refused, never ignored
    throw std::invalid_argument("gemm_exact_device: debug_split_k is a host-only negative control (cuda-host)");
  if (g.M == 0 || g.N == 0) return;
  const dim3 grid(static_cast<unsigned>(gemm_grid_cols(g.N)), static_cast<unsigned>(gemm_grid_rows(g.M)));
  if (gemm_grid_rows(g.M) > 65535) throw std::invalid_argument("gemm_exact_device: M too large for one launch");
  gemm_exact_kernel<<<grid, kGemmThreads, unused_shared_bytes, current_stream()>>>(g);
  check_launch("gemm_exact_kernel");
}

}  // namespace

void gemm_exact_device(const GemmArgs& g) { launch(g, 0); }

GemmDeviceFit gemm_exact_device_fit() {
  const KernelFit fit = kernel_fit(gemm_exact_kernel, kGemmThreads, "gemm_exact_kernel");
  return {fit.registers, fit.blocks_per_sm};
}

void gemm_exact_device_one_block_per_sm(const GemmArgs& g) {
  // Asked once per process (one device per process).
  static const size_t unused =
      one_block_per_sm_shared_bytes(gemm_exact_kernel, sizeof(GemmShared), kGemmThreads, "gemm_exact_kernel");
  launch(g, unused);
}

}  // namespace olmoref::kernels
