// The MoE routing, combine-backward and router-backward exact kernels on the device: the bodies of
// kernels/moe_exact.h, one warp-sized block per row.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"
#include "kernels/moe_exact.h"

namespace olmoref::kernels {

namespace {

__global__ void __launch_bounds__(kRowThreads) moe_route_kernel(MoERouteArgs a) {
  __shared__ MoERowShared sh;
  DeviceBlock<NoRegs, kRowThreads> blk;
  moe_route_row(blk, sh, a, blockIdx.x);
}

__global__ void __launch_bounds__(kRowThreads) moe_combine_backward_kernel(MoECombineBackwardArgs a) {
  __shared__ MoERowShared sh;
  DeviceBlock<NoRegs, kRowThreads> blk;
  moe_combine_backward_row(blk, sh, a, blockIdx.x);
}

__global__ void __launch_bounds__(kRowThreads) moe_router_backward_kernel(MoERouterBackwardArgs a) {
  __shared__ MoERowShared sh;
  DeviceBlock<NoRegs, kRowThreads> blk;
  moe_router_backward_row(blk, sh, a, blockIdx.x);
}

}  // namespace

void moe_route_device(const MoERouteArgs& a) {
  if (a.R == 0) return;
  moe_route_kernel<<<static_cast<unsigned>(a.R), kRowThreads, 0, current_stream()>>>(a);
  check_launch("moe_route_kernel");
}

void moe_combine_backward_device(const MoECombineBackwardArgs& a) {
  if (a.plan.R == 0) return;
  moe_combine_backward_kernel<<<static_cast<unsigned>(a.plan.R), kRowThreads, 0, current_stream()>>>(a);
  check_launch("moe_combine_backward_kernel");
}

void moe_router_backward_device(const MoERouterBackwardArgs& a) {
  if (a.in.R == 0) return;
  moe_router_backward_kernel<<<static_cast<unsigned>(a.in.R), kRowThreads, 0, current_stream()>>>(a);
  check_launch("moe_router_backward_kernel");
}

}  // namespace olmoref::kernels
