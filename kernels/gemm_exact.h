// kernels/gemm_exact.h — the exact-mode GEMM (docs/canonical/matmul.md), one source for the CUDA kernel and
// its host execution.
//
// C[M,N] (=|+=) A[M,K]·B[K,N] with strided views. Every output element is ONE accumulator, a chain of
// fma over k = 0, 1, ..., K-1 in order, starting from 0 or from C (accumulate). The block computes a
// BM x BN tile: for each K-slab of BK it stages A[row0.., k0..] and B[k0.., col0..] in shared memory (double
// buffered: the next slab is fetched while this one is used), then each of its 256 threads continues the chains
// of its TM x TN outputs over the slab's kk = 0..kn-1 in order, k outermost, operands in registers.
// Tiling is over i/j only: no split-K, no tensor cores, no reassociation. The K tail is a shorter slab (never
// zero padding: fma(0, 0, -0) would turn a -0 accumulator into +0). Grid: ceil(N/BN) x ceil(M/BM) blocks of one of
// two tile shapes (GemmTile128, GemmTile64: gemm_pick_tiling, by the shape and the device's SMs), which hold the same
// chains: the bits are a function of the shape only.
#pragma once

#include <cstdint>

#include "kernels/block.h"
#include "core/elementwise.h"
#include "core/hd.h"

namespace olmoref::kernels {

// An elementwise step fused into the store of each finished output (ref/ops.h matmul_forward_swiglu,
// matmul_backward_input_swiglu): the accumulator never makes a round trip through memory before it.
enum class GemmEpilogueKind : int {
  none = 0,
  swiglu_forward,   // C = u (bf16: rounded); epi_out = a = SwiGLU(epi_g, u)
  swiglu_backward,  // da = acc (bf16: rounded); C = dg, epi_out = du of SwiGLU backward(epi_g, epi_u, da)
};

struct GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int64_t a_row = 0, a_col = 0;  // A(i, p) = A[i*a_row + p*a_col]
  const float* B = nullptr;
  int64_t b_row = 0, b_col = 0;  // B(p, j) = B[p*b_row + j*b_col]
  float* C = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  // TEST ONLY negative control: each K-slab starts a fresh chain that is then added to the accumulator
  // (a split-K order). The host-execution test shows it breaks the bits.
  bool debug_split_k = false;
  // Epilogue operands, all [M, ldc] at C's positions.
  GemmEpilogueKind epilogue = GemmEpilogueKind::none;
  const float* epi_g = nullptr;
  const float* epi_u = nullptr;
  float* epi_out = nullptr;
  bool epi_bf16 = false;
};

// Stores the finished chain `acc` of output position `at` (row * ldc + col), through the epilogue.
OLMOREF_HD inline void gemm_store(const GemmArgs& g, int64_t at, float acc) {
  switch (g.epilogue) {
    case GemmEpilogueKind::none: g.C[at] = acc; break;
    case GemmEpilogueKind::swiglu_forward: {
      float u = acc;
      g.epi_out[at] = elem::swiglu_forward_from_product(g.epi_g[at], u, g.epi_bf16);
      g.C[at] = u;
      break;
    }
    case GemmEpilogueKind::swiglu_backward: {
      float dg, du;
      elem::swiglu_backward_from_product(g.epi_g[at], g.epi_u[at], acc, g.epi_bf16, dg, du);
      g.C[at] = dg;
      g.epi_out[at] = du;
      break;
    }
  }
}

// The tile. Two shapes, the same decomposition and the same bits (every output one chain over k in order, whatever
// tile holds it); 256 threads, slabs of 8 k, in both:
//   GemmTile128: 128 x 128 outputs a block, 8 x 8 a thread. Thread t (tr = t / 16, tc = t % 16) owns rows {0, 64} +
//     tr·4 + {0..3} and columns {0, 64} + tc·4 + {0..3} of the tile, so a warp's reads of a k-row of the staged slab
//     are 4-float runs: the 16 column runs side by side, the row runs broadcast.
//   GemmTile64: 64 x 64 outputs a block, 4 x 4 a thread (rows tr·4 + {0..3}, columns tc·4 + {0..3}): four times the
//     blocks of GemmTile128 on the same output, for the grids that leave SMs idle (gemm_pick_tiling); each k-row of
//     the slab feeds a quarter of the fmas per shared load, so it is the slower tile wherever the large one fills the
//     device.
template <int kTileRows, int kThreadRows>
struct GemmTile {
  static constexpr int BM = kTileRows, BN = kTileRows, BK = 8, TM = kThreadRows, TN = kThreadRows;
  static constexpr int threads_across = BN / TN;                       // 16 threads across a tile row
  static constexpr int threads = (BM / TM) * threads_across;           // 256
  static constexpr int run = 4, run_gap = BM * run / TM;               // a thread's rows/columns: runs of 4, apart
  static constexpr int staged = BK * BM / threads;                     // elements of A (and of B) a thread stages
  // Shared rows are padded by 4 floats: a slab stored k-fast (8 threads writing one tile row's 8 k) lands in 8
  // different banks (the pitch is 4 mod 32), and every 4-float run stays 16-byte aligned.
  static constexpr int pitch = BM + 4;
  static_assert(threads == 256 && TM % run == 0 && (BK * BM) % threads == 0 && threads % BK == 0 && threads % BM == 0,
                "gemm_staged_walk and the 4-float runs assume these");

  struct Shared {
    // Two slabs, alternating: the block reads slab s from one while its threads stage slab s + 1 into the other.
    alignas(16) float a[2][BK][pitch];  // a[buf][kk][i] = A(row0 + i, k0 + kk)
    alignas(16) float b[2][BK][pitch];  // b[buf][kk][j] = B(k0 + kk, col0 + j)
  };
  struct Regs {
    float acc[TM][TN];                      // one chain per output
    float next_a[staged], next_b[staged];   // the next slab's elements, in flight during this slab's fmas
    int64_t a_at, b_at;  // the walk's offsets into A and B (gemm_staged_walk): element 0 of the next slab to fetch
  };
};
using GemmTile128 = GemmTile<128, 8>;
using GemmTile64 = GemmTile<64, 4>;

enum class GemmTiling : int { tile128 = 128, tile64 = 64 };
inline const char* gemm_tiling_name(GemmTiling t) { return t == GemmTiling::tile64 ? "tile64" : "tile128"; }
inline int64_t gemm_tile_rows(GemmTiling t) { return static_cast<int>(t); }  // = columns: the tiles are square

// A thread's row (or column) i in [0, TM) of the tile.
template <class Tile>
OLMOREF_HD inline int gemm_local(int t16, int i) { return (i / Tile::run) * Tile::run_gap + t16 * Tile::run + i % Tile::run; }

// Four consecutive shared floats: one 16-byte load on the device.
OLMOREF_HD inline void gemm_load4(const float* p, float* out) {
#if defined(__CUDA_ARCH__)
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
#else
  for (int i = 0; i < 4; ++i) out[i] = p[i];
#endif
}

// Thread t's staged elements of a slab: element s in [0, staged) is e = t + s·256 of the slab's BK·BM, taken as
// (kk, i) so that consecutive threads walk the operand's unit-stride direction and the global loads coalesce whether
// the tile's k or its rows/columns are contiguous in memory. With k contiguous (kk = e % BK, i = e / BK) a thread keeps
// its kk and steps 32 rows; otherwise (kk = e / BM, i = e % BM) it keeps its row and steps 256 / BM k. So a thread's
// elements are one base address and one step apart, the same in every slab.
struct GemmStagedWalk {
  int kk0, i0;  // element 0
  int dkk, di;  // from element s to s + 1
};
template <class Tile>
OLMOREF_HD inline GemmStagedWalk gemm_staged_walk(int t, bool k_contiguous) {
  if (k_contiguous) return {t % Tile::BK, t / Tile::BK, 0, Tile::threads / Tile::BK};
  return {t / Tile::BM, t % Tile::BM, Tile::threads / Tile::BM, 0};
}

// Where thread t's walk starts in A and B for the tile at (row0, col0): the slab at k = 0.
template <class Tile>
OLMOREF_HD inline void gemm_fetch_start(const GemmArgs& g, int64_t row0, int64_t col0, int t, typename Tile::Regs& r) {
  const GemmStagedWalk wa = gemm_staged_walk<Tile>(t, g.a_col == 1), wb = gemm_staged_walk<Tile>(t, g.b_row == 1);
  r.a_at = (row0 + wa.i0) * g.a_row + wa.kk0 * g.a_col;
  r.b_at = wb.kk0 * g.b_row + (col0 + wb.i0) * g.b_col;
}

// Thread t's staged elements of the next slab (kn valid k), from global memory; the walk then moves on one slab.
// Past the matrix: 0, never read into a chain (the chains stop at kn, rows and columns past the matrix are never
// stored). A whole slab of an interior tile (every row, column and k inside the matrix: the same for every thread of
// the block, so no lane diverges) loads without the bounds tests, the same elements. An element's address is the
// walk's offset plus s steps, not a 64-bit product per element: that took the 128 tile's kernel from 180 registers to
// 125 (kernels/gemm_exact.cu), under the 128 of two blocks an SM.
template <class Tile>
OLMOREF_HD inline void gemm_fetch_slab(const GemmArgs& g, int64_t row0, int64_t col0, int kn, int t, typename Tile::Regs& r) {
  const GemmStagedWalk wa = gemm_staged_walk<Tile>(t, g.a_col == 1), wb = gemm_staged_walk<Tile>(t, g.b_row == 1);
  const int64_t a_at = r.a_at, a_step = wa.di * g.a_row + wa.dkk * g.a_col;
  const int64_t b_at = r.b_at, b_step = wb.dkk * g.b_row + wb.di * g.b_col;
  r.a_at += Tile::BK * g.a_col, r.b_at += Tile::BK * g.b_row;
  if (kn == Tile::BK && row0 + Tile::BM <= g.M && col0 + Tile::BN <= g.N) {
    OLMOREF_UNROLL
    for (int s = 0; s < Tile::staged; ++s) r.next_a[s] = g.A[a_at + s * a_step], r.next_b[s] = g.B[b_at + s * b_step];
    return;
  }
  OLMOREF_UNROLL
  for (int s = 0; s < Tile::staged; ++s) {
    r.next_a[s] = wa.kk0 + s * wa.dkk < kn && row0 + wa.i0 + s * wa.di < g.M ? g.A[a_at + s * a_step] : 0.0f;
    r.next_b[s] = wb.kk0 + s * wb.dkk < kn && col0 + wb.i0 + s * wb.di < g.N ? g.B[b_at + s * b_step] : 0.0f;
  }
}

template <class Tile>
OLMOREF_HD inline void gemm_store_slab(const GemmArgs& g, typename Tile::Shared& sh, int buf, int t, const typename Tile::Regs& r) {
  const GemmStagedWalk wa = gemm_staged_walk<Tile>(t, g.a_col == 1), wb = gemm_staged_walk<Tile>(t, g.b_row == 1);
  OLMOREF_UNROLL
  for (int s = 0; s < Tile::staged; ++s) {
    sh.a[buf][wa.kk0 + s * wa.dkk][wa.i0 + s * wa.di] = r.next_a[s];
    sh.b[buf][wb.kk0 + s * wb.dkk][wb.i0 + s * wb.di] = r.next_b[s];
  }
}

// Block (bi, bj) of the grid: output rows [bi*BM, ...), columns [bj*BN, ...). Per slab, k outside the thread's TM x TN
// outputs: a k-row's TM A values and TN B values come into registers once and feed TM·TN fmas, each output's chain
// going on in ascending k exactly as the reference's.
OLMOREF_BLOCK_BODY
template <class Tile, class Block>
OLMOREF_HD void gemm_exact_block(Block& blk, typename Tile::Shared& sh, const GemmArgs& g, int64_t bi, int64_t bj) {
  using Regs = typename Tile::Regs;
  constexpr int BK = Tile::BK, TM = Tile::TM, TN = Tile::TN, across = Tile::threads_across;
  const int64_t row0 = bi * Tile::BM, col0 = bj * Tile::BN;
  const int64_t slabs = (g.K + BK - 1) / BK;
  auto slab_len = [&](int64_t s) { return static_cast<int>(g.K - s * BK < BK ? g.K - s * BK : BK); };
  blk.phase([&](int t, Regs& r) {
    OLMOREF_UNROLL
    for (int i = 0; i < TM; ++i)
      OLMOREF_UNROLL
      for (int j = 0; j < TN; ++j) {
        const int64_t row = row0 + gemm_local<Tile>(t / across, i), col = col0 + gemm_local<Tile>(t % across, j);
        r.acc[i][j] = g.accumulate && row < g.M && col < g.N ? g.C[row * g.ldc + col] : 0.0f;
      }
    if (slabs > 0) {
      gemm_fetch_start<Tile>(g, row0, col0, t, r);
      gemm_fetch_slab<Tile>(g, row0, col0, slab_len(0), t, r);
      gemm_store_slab<Tile>(g, sh, 0, t, r);
    }
  });
  for (int64_t s = 0; s < slabs; ++s) {
    const int buf = static_cast<int>(s & 1), kn = slab_len(s);
    const bool more = s + 1 < slabs;
    blk.phase([&](int t, Regs& r) {
      if (more) gemm_fetch_slab<Tile>(g, row0, col0, slab_len(s + 1), t, r);
      const int tr = (t / across) * Tile::run, tc = (t % across) * Tile::run;
#if !defined(__CUDA_ARCH__)
      if (g.debug_split_k) {  // TEST ONLY (host): the slab's chains start fresh and are added afterwards
        OLMOREF_UNROLL
        for (int i = 0; i < TM; ++i)
          OLMOREF_UNROLL
          for (int j = 0; j < TN; ++j) {
            float part = 0.0f;
            for (int kk = 0; kk < kn; ++kk)
              part = hd_fma(sh.a[buf][kk][gemm_local<Tile>(t / across, i)], sh.b[buf][kk][gemm_local<Tile>(t % across, j)], part);
            r.acc[i][j] = r.acc[i][j] + part;
          }
      } else
#endif
        for (int kk = 0; kk < kn; ++kk) {
          float a[TM], b[TN];
          OLMOREF_UNROLL
          for (int run = 0; run < TM / Tile::run; ++run) {
            gemm_load4(&sh.a[buf][kk][run * Tile::run_gap + tr], a + run * Tile::run);
            gemm_load4(&sh.b[buf][kk][run * Tile::run_gap + tc], b + run * Tile::run);
          }
          OLMOREF_UNROLL
          for (int i = 0; i < TM; ++i)
            OLMOREF_UNROLL
            for (int j = 0; j < TN; ++j) r.acc[i][j] = hd_fma(a[i], b[j], r.acc[i][j]);
        }
      // The other buffer was last read in the previous phase, before its barrier.
      if (more) gemm_store_slab<Tile>(g, sh, buf ^ 1, t, r);
    });
  }
  blk.phase([&](int t, Regs& r) {
    OLMOREF_UNROLL
    for (int i = 0; i < TM; ++i)
      OLMOREF_UNROLL
      for (int j = 0; j < TN; ++j) {
        const int64_t row = row0 + gemm_local<Tile>(t / across, i), col = col0 + gemm_local<Tile>(t % across, j);
        if (row < g.M && col < g.N) gemm_store(g, row * g.ldc + col, r.acc[i][j]);
      }
  });
}

inline int64_t gemm_grid_rows(int64_t M, GemmTiling t) { return (M + gemm_tile_rows(t) - 1) / gemm_tile_rows(t); }
inline int64_t gemm_grid_cols(int64_t N, GemmTiling t) { return (N + gemm_tile_rows(t) - 1) / gemm_tile_rows(t); }

// The tiling a launch of an M x N output uses on a device of `sms` SMs: GemmTile128 unless its grid has fewer blocks
// than the device holds at once (two an SM, the bound its kernel is built for: kernels/gemm_exact.cu), where SMs would
// sit idle or alone on an SM with no second block to hide its barriers, then GemmTile64 (four times the blocks). The
// bits are the same either way; only the time differs (bench/gemm_bench times both on every shape). At 132 SMs (264
// places) 8 of olmo3-100m's 12 step shapes pick GemmTile64 (its d-wide outputs: 128 blocks of 128 x 128 or fewer), 6
// of olmo3-1b's 12 (its 2048 x 2048 outputs, 256 blocks), none of olmo3-7b's; `gemm_bench --dry-run` lists the picks.
inline GemmTiling gemm_pick_tiling(int64_t M, int64_t N, int sms) {
  const int64_t blocks = gemm_grid_rows(M, GemmTiling::tile128) * gemm_grid_cols(N, GemmTiling::tile128);
  return blocks < 2 * static_cast<int64_t>(sms) ? GemmTiling::tile64 : GemmTiling::tile128;
}

// The SMs the host execution (the cuda-host executor) picks tilings for: an H100's or H200's 132, the devices olmoref's
// figures are for, so a host run takes the tiles the device would (the bits are the same whichever it takes).
inline constexpr int kGemmHostSms = 132;

// The kernel's decomposition executed on the host, block by block (kernels/gemm_exact_host.cpp), in the tiling given,
// or by default the one a device of kGemmHostSms SMs picks. Bit for bit what the device computes; CI compares both
// tilings with ref/gemm.h's reference.
void gemm_exact_host(const GemmArgs& g);
void gemm_exact_host(const GemmArgs& g, GemmTiling tiling);

// The CUDA launch on device pointers (kernels/gemm_exact.cu); only with a CUDA build. The tiling is the one
// gemm_pick_tiling picks for this device's SMs, or the one given (tests, bench/gemm_bench).
void gemm_exact_device(const GemmArgs& g);
void gemm_exact_device(const GemmArgs& g, GemmTiling tiling);

// What the device makes of the kernel (only with a CUDA build): ptxas's registers a thread and the blocks an SM holds
// at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor), for bench/gemm_bench's rows and tests/gpu's check that the
// second block an SM is there.
struct GemmDeviceFit {
  int registers = 0, blocks_per_sm = 0;
};
GemmDeviceFit gemm_exact_device_fit(GemmTiling tiling = GemmTiling::tile128);

// BENCH ONLY: the same kernel, the same grid and the same bits, launched with dynamic shared memory it never touches,
// enough that an SM holds one block: what bench/gemm_bench measures the second block against.
void gemm_exact_device_one_block_per_sm(const GemmArgs& g, GemmTiling tiling = GemmTiling::tile128);

// Only the listed blocks (bi, bj) of the tiling's grid, each as gemm_exact_host computes it: blocks are independent, so
// a sample of a real shape's tiles is checked on the host in seconds where the whole grid would take hours.
void gemm_exact_host_tiles(const GemmArgs& g, const std::vector<std::pair<int64_t, int64_t>>& blocks,
                           GemmTiling tiling = GemmTiling::tile128);

}  // namespace olmoref::kernels
