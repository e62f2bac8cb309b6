#include "kernels/attention_exact.h"

#include <memory>

namespace olmoref::kernels {

// The device grids' blocks one after another, in block order: each its own tiles, heaviest first (and, in the
// forward, its own scratch rows), as on the device. Shared memory and the blocks' registers on the heap: together they
// pass 100 KiB.
void attention_forward_host(const AttentionArgs& a) {
  auto sh = std::make_unique<AttentionForwardShared>();
  HostBlock<AttentionForwardRegs, kAttThreads> blk(*sh);
  const int64_t blocks = attention_forward_blocks(a);
  for (int64_t block = 0; block < blocks; ++block) attention_forward_block(blk, *sh, a, block, blocks);
}

void attention_backward_host(const AttentionArgs& a) {
  auto sh = std::make_unique<AttentionBackwardShared>();
  HostBlock<AttentionBackwardRegs, kAttThreads> blk(*sh);
  const int64_t tiles = attention_tiles(a);
  for (int64_t g = 0; g < tiles; ++g) attention_backward_query_tile(blk, *sh, a, attention_tile_by_rank(a, g, true));
  for (int64_t g = 0; g < tiles; ++g) attention_backward_key_tile(blk, *sh, a, attention_tile_by_rank(a, g, false));
  for (int64_t e = 0; e < a.B * a.T * a.KV * a.hd; ++e) attention_group_sum(a, e);
}

}  // namespace olmoref::kernels
