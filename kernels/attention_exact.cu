// Sliding-window GQA attention on the device: kernels/attention_exact.h. Blocks of 256 threads on tiles of 32
// positions: the forward a fixed grid striding over the query tiles, each block with its 32 scratch rows; the
// backward's query and key kernels one block per tile.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/attention_exact.h"

namespace olmoref::kernels {

namespace {
__global__ void __launch_bounds__(kAttThreads) attention_forward_kernel(AttentionArgs a) {
  __shared__ AttentionForwardShared sh;
  DeviceBlock<AttentionForwardRegs, kAttThreads> blk;
  attention_forward_block(blk, sh, a, blockIdx.x, gridDim.x);
}
__global__ void __launch_bounds__(kAttThreads) attention_backward_query_kernel(AttentionArgs a) {
  __shared__ AttentionBackwardShared sh;
  DeviceBlock<AttentionBackwardRegs, kAttThreads> blk;
  attention_backward_query_tile(blk, sh, a, blockIdx.x);
}
__global__ void __launch_bounds__(kAttThreads) attention_backward_key_kernel(AttentionArgs a) {
  __shared__ AttentionBackwardShared sh;
  DeviceBlock<AttentionBackwardRegs, kAttThreads> blk;
  attention_backward_key_tile(blk, sh, a, blockIdx.x);
}
__global__ void attention_group_sum_kernel(AttentionArgs a, int64_t n) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) attention_group_sum(a, e);
}
}  // namespace

void attention_backward_device(const AttentionArgs& a) {
  const int64_t tiles = attention_tiles(a), n = a.B * a.T * a.KV * a.hd;
  if (tiles == 0) return;
  attention_backward_query_kernel<<<static_cast<unsigned>(tiles), kAttThreads>>>(a);
  check_launch("attention_backward_query_kernel");
  attention_backward_key_kernel<<<static_cast<unsigned>(tiles), kAttThreads>>>(a);
  check_launch("attention_backward_key_kernel");
  attention_group_sum_kernel<<<element_blocks(n), kElementThreads>>>(a, n);
  check_launch("attention_group_sum_kernel");
}

void attention_forward_device(const AttentionArgs& a) {
  if (attention_tiles(a) == 0) return;
  attention_forward_kernel<<<static_cast<unsigned>(attention_forward_blocks(a)), kAttThreads>>>(a);
  check_launch("attention_forward_kernel");
}

}  // namespace olmoref::kernels
