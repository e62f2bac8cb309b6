#include "kernels/moe_exact.h"

namespace olmoref::kernels {

namespace {
// The grid of a row kernel executed on the host: body(blk, shared, row) for row = 0, 1, ..., R-1, one block after
// another (on the device each row is a block of its own; rows share nothing, so their order is free).
template <class Body>
void run_rows_host(int64_t R, Body&& body) {
  MoERowShared sh;
  HostBlock<NoRegs, kRowThreads> blk(sh);
  for (int64_t r = 0; r < R; ++r) body(blk, sh, r);
}
}  // namespace

void moe_route_host(const MoERouteArgs& a) {
  run_rows_host(a.R, [&](auto& blk, MoERowShared& sh, int64_t r) { moe_route_row(blk, sh, a, r); });
}

void moe_combine_backward_host(const MoECombineBackwardArgs& a) {
  run_rows_host(a.plan.R, [&](auto& blk, MoERowShared& sh, int64_t r) { moe_combine_backward_row(blk, sh, a, r); });
}

void moe_router_backward_host(const MoERouterBackwardArgs& a) {
  run_rows_host(a.in.R, [&](auto& blk, MoERowShared& sh, int64_t r) { moe_router_backward_row(blk, sh, a, r); });
}

}  // namespace olmoref::kernels
