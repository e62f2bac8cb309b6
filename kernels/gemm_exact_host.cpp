#include "kernels/gemm_exact.h"

#include <stdexcept>
#include <string>

namespace olmoref::kernels {

namespace {

template <class Tile>
void host_blocks(const GemmArgs& g, const std::vector<std::pair<int64_t, int64_t>>* blocks, GemmTiling tiling) {
  typename Tile::Shared sh;
  HostBlock<typename Tile::Regs, Tile::threads> blk(sh);
  const int64_t rows = gemm_grid_rows(g.M, tiling), cols = gemm_grid_cols(g.N, tiling);
  if (blocks == nullptr) {
    for (int64_t bi = 0; bi < rows; ++bi)
      for (int64_t bj = 0; bj < cols; ++bj) gemm_exact_block<Tile>(blk, sh, g, bi, bj);
    return;
  }
  for (const auto& [bi, bj] : *blocks) {
    if (bi < 0 || bi >= rows || bj < 0 || bj >= cols)
      throw std::out_of_range("gemm_exact_host_tiles: block (" + std::to_string(bi) + ", " + std::to_string(bj) +
                              ") is outside the " + gemm_tiling_name(tiling) + " grid of " + std::to_string(rows) +
                              " x " + std::to_string(cols) + " blocks");
    gemm_exact_block<Tile>(blk, sh, g, bi, bj);
  }
}

void run(const GemmArgs& g, const std::vector<std::pair<int64_t, int64_t>>* blocks, GemmTiling tiling) {
  if (tiling == GemmTiling::tile64) host_blocks<GemmTile64>(g, blocks, tiling);
  else host_blocks<GemmTile128>(g, blocks, tiling);
}

}  // namespace

void gemm_exact_host(const GemmArgs& g) { run(g, nullptr, gemm_pick_tiling(g.M, g.N, kGemmHostSms)); }
void gemm_exact_host(const GemmArgs& g, GemmTiling tiling) { run(g, nullptr, tiling); }

void gemm_exact_host_tiles(const GemmArgs& g, const std::vector<std::pair<int64_t, int64_t>>& blocks, GemmTiling tiling) {
  run(g, &blocks, tiling);
}

}  // namespace olmoref::kernels
