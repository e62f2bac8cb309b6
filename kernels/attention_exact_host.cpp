#include "kernels/attention_exact.h"

namespace olmoref::kernels {

void attention_forward_host(const AttentionArgs& a) {
  AttentionShared sh;
  HostBlock<NoRegs, 32> blk;
  for (int64_t row = 0; row < a.B * a.H * a.T; ++row) attention_forward_row(blk, sh, a, row);
}

void attention_backward_host(const AttentionArgs& a) {
  AttentionShared sh;
  HostBlock<NoRegs, 32> blk;
  const int64_t rows = a.B * a.H * a.T;
  for (int64_t row = 0; row < rows; ++row) attention_backward_query(blk, sh, a, row);
  for (int64_t key = 0; key < rows; ++key) attention_backward_key(blk, a, key);
  for (int64_t e = 0; e < a.B * a.T * a.KV * a.hd; ++e) attention_group_sum(a, e);
}

}  // namespace olmoref::kernels
