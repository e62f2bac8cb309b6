// Sliding-window GQA attention on the device: kernels/attention_exact.h. The forward and the backward's query kernel
// are a fixed grid of 32-thread blocks striding over the (instance, head, query) rows, each with its scratch row; the
// key kernel is one 32-thread block per (instance, query head, key).
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/attention_exact.h"

namespace olmoref::kernels {

namespace {
__global__ void __launch_bounds__(32) attention_forward_kernel(AttentionArgs a) {
  __shared__ AttentionShared sh;
  DeviceBlock<NoRegs, 32> blk;
  attention_block_rows(a, blockIdx.x, gridDim.x,
                       [&](int64_t row, float* scratch_row) { attention_forward_row(blk, sh, a, row, scratch_row); });
}
__global__ void __launch_bounds__(32) attention_backward_query_kernel(AttentionArgs a) {
  __shared__ AttentionShared sh;
  DeviceBlock<NoRegs, 32> blk;
  attention_block_rows(a, blockIdx.x, gridDim.x, [&](int64_t row, float* scratch_row) {
    attention_backward_query(blk, sh, a, row, scratch_row);
  });
}
__global__ void __launch_bounds__(32) attention_backward_key_kernel(AttentionArgs a) {
  __shared__ AttentionKeyShared sh;
  DeviceBlock<NoRegs, 32> blk;
  attention_backward_key(blk, sh, a, blockIdx.x);
}
__global__ void attention_group_sum_kernel(AttentionArgs a, int64_t n) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) attention_group_sum(a, e);
}
}  // namespace

void attention_backward_device(const AttentionArgs& a) {
  const int64_t rows = a.B * a.H * a.T, n = a.B * a.T * a.KV * a.hd;
  if (rows == 0) return;
  attention_backward_query_kernel<<<static_cast<unsigned>(attention_row_blocks(a)), 32>>>(a);
  check_launch("attention_backward_query_kernel");
  attention_backward_key_kernel<<<static_cast<unsigned>(rows), 32>>>(a);
  check_launch("attention_backward_key_kernel");
  attention_group_sum_kernel<<<element_blocks(n), kElementThreads>>>(a, n);
  check_launch("attention_group_sum_kernel");
}

void attention_forward_device(const AttentionArgs& a) {
  if (a.B * a.H * a.T == 0) return;
  attention_forward_kernel<<<static_cast<unsigned>(attention_row_blocks(a)), 32>>>(a);
  check_launch("attention_forward_kernel");
}

}  // namespace olmoref::kernels
