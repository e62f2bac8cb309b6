// The device side of kernels/elementwise.h: one generic kernel, one thread per element, grid ceil(n / 256) x 256
// (a function of n only, never of the SM count).
#include <cuda_runtime.h>

#include "kernels/elementwise.h"
#include "kernels/launch.cuh"

namespace olmoref::kernels {

namespace {

template <class Op>
__global__ void elementwise_kernel(Op op, int64_t n) {
  const int64_t i = element_index();
  if (i < n) op(i);
}

template <class Op>
void launch(const Op& op, int64_t n, const char* name) {
  if (n <= 0) return;
  elementwise_kernel<<<element_blocks(n), kElementThreads, 0, current_stream()>>>(op, n);
  check_launch(name);
}

}  // namespace

void run_device(const SwigluForwardOp& op, int64_t n) { launch(op, n, "swiglu_forward"); }
void run_device(const SwigluBackwardOp& op, int64_t n) { launch(op, n, "swiglu_backward"); }
void run_device(const AdamWOp& op, int64_t n) { launch(op, n, "adamw"); }
void run_device(const SkipStepAdamWOp& op, int64_t n) { launch(op, n, "skip_step_adamw"); }
void run_device(const RoundBf16Op& op, int64_t n) { launch(op, n, "round_bf16"); }
void run_device(const AddOp& op, int64_t n) { launch(op, n, "add"); }
void run_device(const ScaleOp& op, int64_t n) { launch(op, n, "scale"); }
void run_device(const EmbeddingForwardOp& op, int64_t n) { launch(op, n, "embedding_forward"); }
void run_device(const EmbeddingBackwardOp& op, int64_t n) { launch(op, n, "embedding_backward"); }
void run_device(const RopeOp& op, int64_t n) { launch(op, n, "rope"); }
void run_device(const MoEDispatchOp& op, int64_t n) { launch(op, n, "moe_dispatch"); }
void run_device(const MoECombineOp& op, int64_t n) { launch(op, n, "moe_combine"); }
void run_device(const MoEScatterAddOp& op, int64_t n) { launch(op, n, "moe_scatter_add"); }
void run_device(const MoESharedCombineOp& op, int64_t n) { launch(op, n, "moe_shared_combine"); }
void run_device(const MoESharedCombineBackwardOp& op, int64_t n) { launch(op, n, "moe_shared_combine_backward"); }

}  // namespace olmoref::kernels
