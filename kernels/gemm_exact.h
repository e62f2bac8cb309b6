// kernels/gemm_exact.h — the exact-mode GEMM (docs/canonical/matmul.md), one source for the CUDA kernel and
// its host execution.
//
// C[M,N] (=|+=) A[M,K]·B[K,N] with strided views. Every output element is ONE accumulator, a chain of
// fma over k = 0, 1, ..., K-1 in order, starting from 0 or from C (accumulate). The block computes a
// BM x BN tile: for each K-slab of BK it stages A[row0.., k0..] and B[k0.., col0..] in shared memory (double
// buffered: the next slab is fetched while this one is used), then each of its 256 threads continues the chains
// of its TM x TN outputs over the slab's kk = 0..kn-1 in order, k outermost, operands in registers.
// Tiling is over i/j only: no split-K, no tensor cores, no reassociation. The K tail is a shorter slab (never
// zero padding: fma(0, 0, -0) would turn a -0 accumulator into +0). Grid: ceil(N/BN) x ceil(M/BM) blocks,
// a function of the shape only.
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

// The tile: 128 x 128 outputs per block of 256 threads, 8 x 8 per thread, slabs of 8 k. Thread t (tr = t / 16,
// tc = t % 16) owns rows {0, 64} + tr·4 + {0..3} and columns {0, 64} + tc·4 + {0..3} of the tile, so a warp's reads
// of a k-row of the staged slab are 4-float runs: the 16 column runs side by side, the row runs broadcast.
inline constexpr int kGemmBM = 128, kGemmBN = 128, kGemmBK = 8, kGemmTM = 8, kGemmTN = 8;
inline constexpr int kGemmThreads = (kGemmBM / kGemmTM) * (kGemmBN / kGemmTN);  // 256
inline constexpr int kGemmRun = 4, kGemmRunGap = 64;                             // a thread's rows/columns
inline constexpr int kGemmStaged = kGemmBK * kGemmBM / kGemmThreads;             // 4 of A and 4 of B per slab
// Shared rows are padded to 132 floats: a slab stored k-fast (8 threads writing one tile row's 8 k) lands in 8
// different banks, and every 4-float run stays 16-byte aligned.
inline constexpr int kGemmPitch = kGemmBM + 4;

struct GemmShared {
  // Two slabs, alternating: the block reads slab s from one while its threads stage slab s + 1 into the other.
  alignas(16) float a[2][kGemmBK][kGemmPitch];  // a[buf][kk][i] = A(row0 + i, k0 + kk)
  alignas(16) float b[2][kGemmBK][kGemmPitch];  // b[buf][kk][j] = B(k0 + kk, col0 + j)
};

struct GemmRegs {
  float acc[kGemmTM][kGemmTN];  // one chain per output
  float next_a[kGemmStaged], next_b[kGemmStaged];  // the next slab's elements, in flight during this slab's fmas
  int64_t a_at, b_at;  // the walk's offsets into A and B (gemm_staged_walk): element 0 of the next slab to fetch
};

// A thread's row (or column) i in [0, 8) of the tile.
OLMOREF_HD inline int gemm_local(int t16, int i) { return (i / kGemmRun) * kGemmRunGap + t16 * kGemmRun + i % kGemmRun; }

// Four consecutive shared floats: one 16-byte load on the device.
OLMOREF_HD inline void gemm_load4(const float* p, float* out) {
#if defined(__CUDA_ARCH__)
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
#else
  for (int i = 0; i < 4; ++i) out[i] = p[i];
#endif
}

// Thread t's staged elements of a slab: element s in [0, kGemmStaged) is e = t + s·256 of the slab's BK·BM, taken as
// (kk, i) so that consecutive threads walk the operand's unit-stride direction and the global loads coalesce whether
// the tile's k or its rows/columns are contiguous in memory. With k contiguous (kk = e % BK, i = e / BK) a thread keeps
// its kk and steps 32 rows; otherwise (kk = e / BM, i = e % BM) it keeps its row and steps 2 k. So a thread's elements
// are one base address and one step apart, the same in every slab.
struct GemmStagedWalk {
  int kk0, i0;  // element 0
  int dkk, di;  // from element s to s + 1
};
OLMOREF_HD inline GemmStagedWalk gemm_staged_walk(int t, bool k_contiguous) {
  if (k_contiguous) return {t % kGemmBK, t / kGemmBK, 0, kGemmThreads / kGemmBK};
  return {t / kGemmBM, t % kGemmBM, kGemmThreads / kGemmBM, 0};
}

// Where thread t's walk starts in A and B for the tile at (row0, col0): the slab at k = 0.
OLMOREF_HD inline void gemm_fetch_start(const GemmArgs& g, int64_t row0, int64_t col0, int t, GemmRegs& r) {
  const GemmStagedWalk wa = gemm_staged_walk(t, g.a_col == 1), wb = gemm_staged_walk(t, g.b_row == 1);
  r.a_at = (row0 + wa.i0) * g.a_row + wa.kk0 * g.a_col;
  r.b_at = wb.kk0 * g.b_row + (col0 + wb.i0) * g.b_col;
}

// Thread t's staged elements of the next slab (kn valid k), from global memory; the walk then moves on one slab.
// Past the matrix: 0, never read into a chain (the chains stop at kn, rows and columns past the matrix are never
// stored). A whole slab of an interior tile (every row, column and k inside the matrix: the same for every thread of
// the block, so no lane diverges) loads without the bounds tests, the same elements. An element's address is the
// walk's offset plus s steps, not a 64-bit product per element: that took the kernel from 180 registers to 125
// (kernels/gemm_exact.cu), under the 128 of two blocks an SM.
OLMOREF_HD inline void gemm_fetch_slab(const GemmArgs& g, int64_t row0, int64_t col0, int kn, int t, GemmRegs& r) {
  const GemmStagedWalk wa = gemm_staged_walk(t, g.a_col == 1), wb = gemm_staged_walk(t, g.b_row == 1);
  const int64_t a_at = r.a_at, a_step = wa.di * g.a_row + wa.dkk * g.a_col;
  const int64_t b_at = r.b_at, b_step = wb.dkk * g.b_row + wb.di * g.b_col;
  r.a_at += kGemmBK * g.a_col, r.b_at += kGemmBK * g.b_row;
  if (kn == kGemmBK && row0 + kGemmBM <= g.M && col0 + kGemmBN <= g.N) {
    OLMOREF_UNROLL
    for (int s = 0; s < kGemmStaged; ++s) r.next_a[s] = g.A[a_at + s * a_step], r.next_b[s] = g.B[b_at + s * b_step];
    return;
  }
  OLMOREF_UNROLL
  for (int s = 0; s < kGemmStaged; ++s) {
    r.next_a[s] = wa.kk0 + s * wa.dkk < kn && row0 + wa.i0 + s * wa.di < g.M ? g.A[a_at + s * a_step] : 0.0f;
    r.next_b[s] = wb.kk0 + s * wb.dkk < kn && col0 + wb.i0 + s * wb.di < g.N ? g.B[b_at + s * b_step] : 0.0f;
  }
}

OLMOREF_HD inline void gemm_store_slab(const GemmArgs& g, GemmShared& sh, int buf, int t, const GemmRegs& r) {
  const GemmStagedWalk wa = gemm_staged_walk(t, g.a_col == 1), wb = gemm_staged_walk(t, g.b_row == 1);
  OLMOREF_UNROLL
  for (int s = 0; s < kGemmStaged; ++s) {
    sh.a[buf][wa.kk0 + s * wa.dkk][wa.i0 + s * wa.di] = r.next_a[s];
    sh.b[buf][wb.kk0 + s * wb.dkk][wb.i0 + s * wb.di] = r.next_b[s];
  }
}

// Block (bi, bj) of the grid: output rows [bi*BM, ...), columns [bj*BN, ...). Per slab, k outside the thread's 8 x 8
// outputs: a k-row's 8 A values and 8 B values come into registers once and feed 64 fmas, each output's chain going
// on in ascending k exactly as the reference's.
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void gemm_exact_block(Block& blk, GemmShared& sh, const GemmArgs& g, int64_t bi, int64_t bj) {
  const int64_t row0 = bi * kGemmBM, col0 = bj * kGemmBN;
  constexpr int tcols = kGemmBN / kGemmTN;  // 16 threads across a tile row
  const int64_t slabs = (g.K + kGemmBK - 1) / kGemmBK;
  auto slab_len = [&](int64_t s) { return static_cast<int>(g.K - s * kGemmBK < kGemmBK ? g.K - s * kGemmBK : kGemmBK); };
  blk.phase([&](int t, GemmRegs& r) {
    OLMOREF_UNROLL
    for (int i = 0; i < kGemmTM; ++i)
      OLMOREF_UNROLL
      for (int j = 0; j < kGemmTN; ++j) {
        const int64_t row = row0 + gemm_local(t / tcols, i), col = col0 + gemm_local(t % tcols, j);
        r.acc[i][j] = g.accumulate && row < g.M && col < g.N ? g.C[row * g.ldc + col] : 0.0f;
      }
    if (slabs > 0) {
      gemm_fetch_start(g, row0, col0, t, r);
      gemm_fetch_slab(g, row0, col0, slab_len(0), t, r);
      gemm_store_slab(g, sh, 0, t, r);
    }
  });
  for (int64_t s = 0; s < slabs; ++s) {
    const int buf = static_cast<int>(s & 1), kn = slab_len(s);
    const bool more = s + 1 < slabs;
    blk.phase([&](int t, GemmRegs& r) {
      if (more) gemm_fetch_slab(g, row0, col0, slab_len(s + 1), t, r);
      const int tr = (t / tcols) * kGemmRun, tc = (t % tcols) * kGemmRun;
#if !defined(__CUDA_ARCH__)
      if (g.debug_split_k) {  // TEST ONLY (host): the slab's chains start fresh and are added afterwards
        OLMOREF_UNROLL
        for (int i = 0; i < kGemmTM; ++i)
          OLMOREF_UNROLL
          for (int j = 0; j < kGemmTN; ++j) {
            float part = 0.0f;
            for (int kk = 0; kk < kn; ++kk)
              part = hd_fma(sh.a[buf][kk][gemm_local(t / tcols, i)], sh.b[buf][kk][gemm_local(t % tcols, j)], part);
            r.acc[i][j] = r.acc[i][j] + part;
          }
      } else
#endif
        for (int kk = 0; kk < kn; ++kk) {
          float a[kGemmTM], b[kGemmTN];
          gemm_load4(&sh.a[buf][kk][tr], a);
          gemm_load4(&sh.a[buf][kk][kGemmRunGap + tr], a + kGemmRun);
          gemm_load4(&sh.b[buf][kk][tc], b);
          gemm_load4(&sh.b[buf][kk][kGemmRunGap + tc], b + kGemmRun);
          OLMOREF_UNROLL
          for (int i = 0; i < kGemmTM; ++i)
            OLMOREF_UNROLL
            for (int j = 0; j < kGemmTN; ++j) r.acc[i][j] = hd_fma(a[i], b[j], r.acc[i][j]);
        }
      // The other buffer was last read in the previous phase, before its barrier.
      if (more) gemm_store_slab(g, sh, buf ^ 1, t, r);
    });
  }
  blk.phase([&](int t, GemmRegs& r) {
    OLMOREF_UNROLL
    for (int i = 0; i < kGemmTM; ++i)
      OLMOREF_UNROLL
      for (int j = 0; j < kGemmTN; ++j) {
        const int64_t row = row0 + gemm_local(t / tcols, i), col = col0 + gemm_local(t % tcols, j);
        if (row < g.M && col < g.N) gemm_store(g, row * g.ldc + col, r.acc[i][j]);
      }
  });
}

inline int64_t gemm_grid_rows(int64_t M) { return (M + kGemmBM - 1) / kGemmBM; }
inline int64_t gemm_grid_cols(int64_t N) { return (N + kGemmBN - 1) / kGemmBN; }

// The kernel's decomposition executed on the host, block by block (kernels/gemm_exact_host.cpp). Bit for bit
// what the device computes; CI compares it with ref/gemm.h's reference.
void gemm_exact_host(const GemmArgs& g);

// The CUDA launch on device pointers (kernels/gemm_exact.cu); only with a CUDA build.
void gemm_exact_device(const GemmArgs& g);

// What the device makes of the kernel (only with a CUDA build): ptxas's registers a thread and the blocks an SM holds
// at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor), for bench/gemm_bench's rows and tests/gpu's check that the
// second block an SM is there.
struct GemmDeviceFit {
  int registers = 0, blocks_per_sm = 0;
};
GemmDeviceFit gemm_exact_device_fit();

// BENCH ONLY: the same kernel, the same grid and the same bits, launched with dynamic shared memory it never touches,
// enough that an SM holds one block: what bench/gemm_bench measures the second block against.
void gemm_exact_device_one_block_per_sm(const GemmArgs& g);

// Only the listed blocks (bi, bj) of the grid, each as gemm_exact_host computes it: blocks are independent, so a
// sample of a real shape's tiles is checked on the host in seconds where the whole grid would take hours.
void gemm_exact_host_tiles(const GemmArgs& g, const std::vector<std::pair<int64_t, int64_t>>& blocks);

}  // namespace olmoref::kernels
