// The exact-mode GEMM on the device: the decomposition of kernels/gemm_exact.h, one block per output tile.
#include <cuda_runtime.h>

#include "kernels/launch.cuh"

#include <stdexcept>
#include <string>

#include "kernels/device_memory.h"
#include "kernels/gemm_exact.h"

namespace olmoref::kernels {

// One kernel per tile shape, each bounded to the blocks an SM it is built for (kernels-ptxas-budget prints both; a
// change that needs more registers shows there as a spill).
// GemmTile128, sm_90 (nvcc 13.0, -Xptxas -v): 125 registers, no stack, no spills, 16.5 KiB of shared memory, so two
// blocks an SM (16 warps), one's slab barrier under the other's fmas. It was 180 registers and one block an SM while
// each staged element's address was its own 64-bit product (gemm_fetch_slab's walk replaced them).
// GemmTile64: 108 registers, 8.5 KiB of shared memory, 16 chains a thread; two blocks an SM as well. Its registers are
// mostly not the chains (the walk's 64-bit offsets, the row and column bounds, the epilogue's operands): bounded to
// three blocks an SM (85 registers) or four (64) ptxas spills (kernels-ptxas-budget fails), so the small tile buys
// blocks for more SMs, not more warps on each.
template <class Tile, int kBlocksPerSm>
__global__ void __launch_bounds__(Tile::threads, kBlocksPerSm) gemm_exact_kernel(GemmArgs g) {
  __shared__ typename Tile::Shared sh;
  DeviceBlock<typename Tile::Regs, Tile::threads> blk;
  gemm_exact_block<Tile>(blk, sh, g, blockIdx.y, blockIdx.x);
}

namespace {

template <class Tile>
struct Kernel;
template <>
struct Kernel<GemmTile128> {
  static constexpr auto* fn = gemm_exact_kernel<GemmTile128, 2>;
  static constexpr const char* name = "gemm_exact_kernel<GemmTile128>";
};
template <>
struct Kernel<GemmTile64> {
  static constexpr auto* fn = gemm_exact_kernel<GemmTile64, 2>;
  static constexpr const char* name = "gemm_exact_kernel<GemmTile64>";
};

template <class Tile>
void launch(const GemmArgs& g, GemmTiling tiling, size_t unused_shared_bytes) {
  if (g.debug_split_k)  // the kernel compiles the split out (#if !defined(__CUDA_ARCH__)): refused, never ignored
    throw std::invalid_argument("gemm_exact_device: debug_split_k is a host-only negative control (cuda-host)");
  if (g.M == 0 || g.N == 0) return;
  const int64_t rows = gemm_grid_rows(g.M, tiling), cols = gemm_grid_cols(g.N, tiling);
  if (rows > 65535) throw std::invalid_argument("gemm_exact_device: M too large for one launch");
  const dim3 grid(static_cast<unsigned>(cols), static_cast<unsigned>(rows));
  Kernel<Tile>::fn<<<grid, Tile::threads, unused_shared_bytes, current_stream()>>>(g);
  check_launch(Kernel<Tile>::name);
}

// Asked once per process and tile (one device per process).
template <class Tile>
size_t held_shared_bytes() {
  static const size_t unused = one_block_per_sm_shared_bytes(Kernel<Tile>::fn, sizeof(typename Tile::Shared),
                                                             Tile::threads, Kernel<Tile>::name);
  return unused;
}

}  // namespace

void gemm_exact_device(const GemmArgs& g) { gemm_exact_device(g, gemm_pick_tiling(g.M, g.N, current_device_sms())); }

void gemm_exact_device(const GemmArgs& g, GemmTiling tiling) {
  if (tiling == GemmTiling::tile64) launch<GemmTile64>(g, tiling, 0);
  else launch<GemmTile128>(g, tiling, 0);
}

GemmDeviceFit gemm_exact_device_fit(GemmTiling tiling) {
  const KernelFit fit = tiling == GemmTiling::tile64
                            ? kernel_fit(Kernel<GemmTile64>::fn, GemmTile64::threads, Kernel<GemmTile64>::name)
                            : kernel_fit(Kernel<GemmTile128>::fn, GemmTile128::threads, Kernel<GemmTile128>::name);
  return {fit.registers, fit.blocks_per_sm};
}

void gemm_exact_device_one_block_per_sm(const GemmArgs& g, GemmTiling tiling) {
  if (tiling == GemmTiling::tile64) launch<GemmTile64>(g, tiling, held_shared_bytes<GemmTile64>());
  else launch<GemmTile128>(g, tiling, held_shared_bytes<GemmTile128>());
}

}  // namespace olmoref::kernels
