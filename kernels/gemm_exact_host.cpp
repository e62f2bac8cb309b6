#include "kernels/gemm_exact.h"

#include <stdexcept>
#include <string>

namespace olmoref::kernels {

void gemm_exact_host(const GemmArgs& g) {
  GemmShared sh;
  HostBlock<GemmRegs, kGemmThreads> blk(sh);
  for (int64_t bi = 0; bi < gemm_grid_rows(g.M); ++bi)
    for (int64_t bj = 0; bj < gemm_grid_cols(g.N); ++bj) gemm_exact_block(blk, sh, g, bi, bj);
}

void gemm_exact_host_tiles(const GemmArgs& g, const std::vector<std::pair<int64_t, int64_t>>& blocks) {
  GemmShared sh;
  HostBlock<GemmRegs, kGemmThreads> blk(sh);
  for (const auto& [bi, bj] : blocks) {
    if (bi < 0 || bi >= gemm_grid_rows(g.M) || bj < 0 || bj >= gemm_grid_cols(g.N))
      throw std::out_of_range("gemm_exact_host_tiles: block (" + std::to_string(bi) + ", " + std::to_string(bj) +
                              ") is outside the grid of " + std::to_string(gemm_grid_rows(g.M)) + " x " +
                              std::to_string(gemm_grid_cols(g.N)) + " blocks");
    gemm_exact_block(blk, sh, g, bi, bj);
  }
}

}  // namespace olmoref::kernels
