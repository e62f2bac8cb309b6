#include "kernels/attention_exact.h"

namespace olmoref::kernels {

void attention_forward_host(const AttentionArgs& a) {
  AttentionShared sh;
  HostBlock<NoRegs, 32> blk;
  for (int64_t row = 0; row < a.B * a.H * a.T; ++row) attention_forward_row(blk, sh, a, row);
}

}  // namespace olmoref::kernels
