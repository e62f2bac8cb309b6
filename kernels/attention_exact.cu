// Sliding-window GQA attention on the device: kernels/attention_exact.h. Blocks of 256 threads on tiles of 32
// positions: the forward a grid the device holds at once, dealt the query tiles heaviest first, each block with its 32
// scratch rows; the backward's query and key kernels one block per tile, heaviest first.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/attention_exact.h"
#include "kernels/device_memory.h"

namespace olmoref::kernels {

namespace {
// Two blocks an SM (launch bounds (256, 2): at most 128 registers): sm_90 (nvcc 13.0, -Xptxas -v) 128 registers, 44.9
// KiB of shared memory, no spills. Without the bound, ptxas's choice moves with the code (128 or 173 registers).
__global__ void __launch_bounds__(kAttThreads, 2) attention_forward_kernel(AttentionArgs a) {
  __shared__ AttentionForwardShared sh;
  DeviceBlock<AttentionForwardRegs, kAttThreads> blk;
  attention_forward_block(blk, sh, a, blockIdx.x, gridDim.x);
}
// sm_90 (nvcc 13.0, -Xptxas -v): left to themselves the backward's kernels take 171 registers, one block per SM;
// capped at 128 for two (__launch_bounds__(256, 2)) neither spills. The key kernel did spill 8 bytes while its dk/dv
// loop asked attention_in_band per (query, key) in 64 bits; it now takes the query's band start once per query
// (the same predicate), and fits.
__global__ void __launch_bounds__(kAttThreads, 2) attention_backward_query_kernel(AttentionArgs a) {
  __shared__ AttentionBackwardShared sh;
  DeviceBlock<AttentionBackwardRegs, kAttThreads> blk;
  attention_backward_query_tile(blk, sh, a, attention_tile_by_rank(a, blockIdx.x, true));
}
__global__ void __launch_bounds__(kAttThreads, 2) attention_backward_key_kernel(AttentionArgs a) {
  __shared__ AttentionBackwardShared sh;
  DeviceBlock<AttentionBackwardRegs, kAttThreads> blk;
  attention_backward_key_tile(blk, sh, a, attention_tile_by_rank(a, blockIdx.x, false));
}
__global__ void attention_group_sum_kernel(AttentionArgs a, int64_t n) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) attention_group_sum(a, e);
}
}  // namespace

namespace {

// The held launches' dynamic shared memory (0: as built), asked once per process (one device per process).
struct HeldShared {
  size_t forward = 0, query = 0, key = 0;
};
const HeldShared& held_shared() {
  static const HeldShared held = [] {
    HeldShared h;
    h.forward = one_block_per_sm_shared_bytes(attention_forward_kernel, sizeof(AttentionForwardShared), kAttThreads,
                                              "attention_forward_kernel");
    h.query = one_block_per_sm_shared_bytes(attention_backward_query_kernel, sizeof(AttentionBackwardShared),
                                            kAttThreads, "attention_backward_query_kernel");
    h.key = one_block_per_sm_shared_bytes(attention_backward_key_kernel, sizeof(AttentionBackwardShared), kAttThreads,
                                          "attention_backward_key_kernel");
    return h;
  }();
  return held;
}

void backward(const AttentionArgs& a, const HeldShared& shared) {
  const int64_t tiles = attention_tiles(a), n = a.B * a.T * a.KV * a.hd;
  if (tiles == 0) return;
  attention_backward_query_kernel<<<static_cast<unsigned>(tiles), kAttThreads, shared.query, current_stream()>>>(a);
  check_launch("attention_backward_query_kernel");
  attention_backward_key_kernel<<<static_cast<unsigned>(tiles), kAttThreads, shared.key, current_stream()>>>(a);
  check_launch("attention_backward_key_kernel");
  attention_group_sum_kernel<<<element_blocks(n), kElementThreads, 0, current_stream()>>>(a, n);
  check_launch("attention_group_sum_kernel");
}

void forward(const AttentionArgs& a, size_t shared) {
  if (attention_tiles(a) == 0) return;
  const auto blocks = static_cast<unsigned>(attention_forward_blocks(a));
  attention_forward_kernel<<<blocks, kAttThreads, shared, current_stream()>>>(a);
  check_launch("attention_forward_kernel");
}

}  // namespace

void attention_backward_device(const AttentionArgs& a) { backward(a, HeldShared{}); }

int64_t attention_forward_resident_blocks() {
  // One device per process (kernels::select_device runs before the first kernel), so it is asked once.
  static const int64_t resident = [] {
    const KernelFit fit = kernel_fit(attention_forward_kernel, kAttThreads, "attention_forward_kernel");
    return static_cast<int64_t>(current_device_sms()) * (fit.blocks_per_sm > 0 ? fit.blocks_per_sm : 1);
  }();
  return resident;
}

void attention_forward_device(const AttentionArgs& a) { forward(a, 0); }

AttentionDeviceFit attention_device_fit() {
  const KernelFit f = kernel_fit(attention_forward_kernel, kAttThreads, "attention_forward_kernel");
  const KernelFit q = kernel_fit(attention_backward_query_kernel, kAttThreads, "attention_backward_query_kernel");
  const KernelFit k = kernel_fit(attention_backward_key_kernel, kAttThreads, "attention_backward_key_kernel");
  return {f.registers, f.blocks_per_sm, q.registers, q.blocks_per_sm, k.registers, k.blocks_per_sm};
}

void attention_forward_device_one_block_per_sm(const AttentionArgs& a) {
  AttentionArgs held = a;
  held.tile_blocks = std::min<int64_t>(a.tile_blocks, current_device_sms());  // one wave of one block an SM
  forward(held, held_shared().forward);
}

void attention_backward_device_one_block_per_sm(const AttentionArgs& a) { backward(a, held_shared()); }

}  // namespace olmoref::kernels
