#include "kernels/gemm_exact.h"

namespace olmoref::kernels {

void gemm_exact_host(const GemmArgs& g) {
  GemmShared sh;
  HostBlock<GemmRegs, kGemmThreads> blk;
  for (int64_t bi = 0; bi < gemm_grid_rows(g.M); ++bi)
    for (int64_t bj = 0; bj < gemm_grid_cols(g.N); ++bj) gemm_exact_block(blk, sh, g, bi, bj);
}

}  // namespace olmoref::kernels
