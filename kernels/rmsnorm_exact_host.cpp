#include "kernels/rmsnorm_exact.h"

namespace olmoref::kernels {

void rmsnorm_forward_host(const RmsNormArgs& a) {
  RowShared sh;
  HostBlock<NoRegs, kRowThreads> blk(sh);
  for (int64_t r = 0; r < a.R; ++r) rmsnorm_forward_row(blk, sh, a, r);
}

void rmsnorm_backward_host(const RmsNormArgs& a) {
  RowShared sh;
  HostBlock<NoRegs, kRowThreads> rows(sh);
  for (int64_t r = 0; r < a.R; ++r) rmsnorm_backward_row(rows, sh, a, r);
  HostBlock<NoRegs, kColumnThreads> cols;
  for (int64_t b = 0; b < (a.n + kColumnThreads - 1) / kColumnThreads; ++b) rmsnorm_weight_grad_block(cols, a, b);
}

}  // namespace olmoref::kernels
