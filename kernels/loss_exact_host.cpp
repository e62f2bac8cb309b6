#include "kernels/loss_exact.h"

namespace olmoref::kernels {

void cross_entropy_host(const LossArgs& a) {
  LossShared sh;
  HostBlock<NoRegs, 32> blk(sh);
  for (int64_t r = 0; r < a.R; ++r) cross_entropy_row(blk, sh, a, r);
  if (a.ce_total)
    for (int64_t b = 0; b < a.R / a.T; ++b) loss_instance_totals(blk, sh, a, b);
}

void grad_norm_chunks_host(const NormChunkArgs& a) {
  LossShared sh;
  HostBlock<NoRegs, 32> blk(sh);
  for (int64_t c = 0; c < (a.n + a.chunk - 1) / a.chunk; ++c) grad_norm_chunk(blk, sh, a, c);
}

void zero_count_chunks_host(const ZeroCountArgs& a) {
  LossShared sh;
  HostBlock<NoRegs, 32> blk(sh);
  for (int64_t c = 0; c < (a.n + a.chunk - 1) / a.chunk; ++c) zero_count_chunk(blk, sh, a, c);
}

}  // namespace olmoref::kernels
