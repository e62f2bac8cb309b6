// Sliding-window GQA attention forward on the device: kernels/attention_exact.h, one 32-thread block per
// (instance, head, query).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/attention_exact.h"

namespace olmoref::kernels {

namespace {
__global__ void __launch_bounds__(32) attention_forward_kernel(AttentionArgs a) {
  __shared__ AttentionShared sh;
  DeviceBlock<NoRegs, 32> blk;
  attention_forward_row(blk, sh, a, blockIdx.x);
}
}  // namespace

void attention_forward_device(const AttentionArgs& a) {
  const int64_t rows = a.B * a.H * a.T;
  if (rows == 0) return;
  attention_forward_kernel<<<static_cast<unsigned>(rows), 32>>>(a);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("attention_forward_kernel launch: ") + cudaGetErrorString(err));
}

}  // namespace olmoref::kernels
