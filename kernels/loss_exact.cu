// Cross-entropy + z-loss, gradient-norm chunks and zero counts on the device: the bodies of kernels/loss_exact.h, one
// 32-thread block per row, per instance and per chunk.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/loss_exact.h"

namespace olmoref::kernels {

namespace {


__global__ void __launch_bounds__(32) cross_entropy_row_kernel(LossArgs a) {
  __shared__ LossShared sh;
  DeviceBlock<NoRegs, 32> blk;
  cross_entropy_row(blk, sh, a, blockIdx.x);
}
__global__ void __launch_bounds__(32) loss_totals_kernel(LossArgs a) {
  __shared__ LossShared sh;
  DeviceBlock<NoRegs, 32> blk;
  loss_instance_totals(blk, sh, a, blockIdx.x);
}
__global__ void __launch_bounds__(32) grad_norm_chunk_kernel(NormChunkArgs a) {
  __shared__ LossShared sh;
  DeviceBlock<NoRegs, 32> blk;
  grad_norm_chunk(blk, sh, a, blockIdx.x);
}

__global__ void __launch_bounds__(32) zero_count_chunk_kernel(ZeroCountArgs a) {
  __shared__ LossShared sh;
  DeviceBlock<NoRegs, 32> blk;
  zero_count_chunk(blk, sh, a, blockIdx.x);
}

}  // namespace

void cross_entropy_device(const LossArgs& a) {
  if (a.R == 0) return;
  cross_entropy_row_kernel<<<static_cast<unsigned>(a.R), 32, 0, current_stream()>>>(a);
  check_launch("cross_entropy_row_kernel");
  if (!a.ce_total) return;
  loss_totals_kernel<<<static_cast<unsigned>(a.R / a.T), 32, 0, current_stream()>>>(a);
  check_launch("loss_totals_kernel");
}

void grad_norm_chunks_device(const NormChunkArgs& a) {
  if (a.n == 0) return;
  grad_norm_chunk_kernel<<<static_cast<unsigned>((a.n + a.chunk - 1) / a.chunk), 32, 0, current_stream()>>>(a);
  check_launch("grad_norm_chunk_kernel");
}

void zero_count_chunks_device(const ZeroCountArgs& a) {
  if (a.n == 0) return;
  zero_count_chunk_kernel<<<static_cast<unsigned>((a.n + a.chunk - 1) / a.chunk), 32, 0, current_stream()>>>(a);
  check_launch("zero_count_chunk_kernel");
}

}  // namespace olmoref::kernels
