// RMSNorm / QK-norm exact kernels on the device: the bodies of kernels/rmsnorm_exact.h, one block per row
// (a warp) and one thread per column for the weight gradient.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/rmsnorm_exact.h"

namespace olmoref::kernels {

namespace {


// Also the fused forms: the epilogue is chosen by the arguments, the same for every block (no divergence).
__global__ void __launch_bounds__(kRowThreads) rmsnorm_forward_kernel(RmsNormArgs a) {
  __shared__ RowShared sh;
  DeviceBlock<NoRegs, kRowThreads> blk;
  rmsnorm_forward_row(blk, sh, a, blockIdx.x);
}

__global__ void __launch_bounds__(kRowThreads) rmsnorm_backward_kernel(RmsNormArgs a) {
  __shared__ RowShared sh;
  DeviceBlock<NoRegs, kRowThreads> blk;
  rmsnorm_backward_row(blk, sh, a, blockIdx.x);
}

__global__ void __launch_bounds__(kColumnThreads) rmsnorm_weight_grad_kernel(RmsNormArgs a) {
  DeviceBlock<NoRegs, kColumnThreads> blk;
  rmsnorm_weight_grad_block(blk, a, blockIdx.x);
}

}  // namespace

void rmsnorm_forward_device(const RmsNormArgs& a) {
  if (a.R == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(a.R), kRowThreads, 0, current_stream()>>>(a);
  check_launch("rmsnorm_forward_kernel");
}

void rmsnorm_backward_device(const RmsNormArgs& a) {
  if (a.R == 0) return;
  rmsnorm_backward_kernel<<<static_cast<unsigned>(a.R), kRowThreads, 0, current_stream()>>>(a);
  check_launch("rmsnorm_backward_kernel");
  const auto column_blocks = static_cast<unsigned>((a.n + kColumnThreads - 1) / kColumnThreads);
  rmsnorm_weight_grad_kernel<<<column_blocks, kColumnThreads, 0, current_stream()>>>(a);
  check_launch("rmsnorm_weight_grad_kernel");
}

}  // namespace olmoref::kernels
