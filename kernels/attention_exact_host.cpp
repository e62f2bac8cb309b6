#include "kernels/attention_exact.h"

namespace olmoref::kernels {

// The device grids' blocks one after another: each its own rows and scratch row, as on the device.
void attention_forward_host(const AttentionArgs& a) {
  AttentionShared sh;
  HostBlock<NoRegs, 32> blk;
  const int64_t blocks = attention_row_blocks(a);
  for (int64_t block = 0; block < blocks; ++block)
    attention_block_rows(a, block, blocks,
                         [&](int64_t row, float* scratch_row) { attention_forward_row(blk, sh, a, row, scratch_row); });
}

void attention_backward_host(const AttentionArgs& a) {
  AttentionShared sh;
  AttentionKeyShared key_sh;
  HostBlock<NoRegs, 32> blk;
  const int64_t rows = a.B * a.H * a.T, blocks = attention_row_blocks(a);
  for (int64_t block = 0; block < blocks; ++block)
    attention_block_rows(a, block, blocks, [&](int64_t row, float* scratch_row) {
      attention_backward_query(blk, sh, a, row, scratch_row);
    });
  for (int64_t key = 0; key < rows; ++key) attention_backward_key(blk, key_sh, a, key);
  for (int64_t e = 0; e < a.B * a.T * a.KV * a.hd; ++e) attention_group_sum(a, e);
}

}  // namespace olmoref::kernels
