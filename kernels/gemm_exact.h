// kernels/gemm_exact.h — the exact-mode GEMM (docs/canonical/matmul.md), one source for the CUDA kernel and
// its host execution.
//
// C[M,N] (=|+=) A[M,K]·B[K,N] with strided views. Every output element is ONE accumulator, a chain of
// fma over k = 0, 1, ..., K-1 in order, starting from 0 or from C (accumulate). The block computes a
// BM x BN tile: for each K-slab of BK it stages A[row0.., k0..] and B[k0.., col0..] in shared memory, then
// each of its 256 threads continues the chains of its TM x TN outputs over the slab's kk = 0..kn-1 in order.
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

inline constexpr int kGemmBM = 64, kGemmBN = 64, kGemmBK = 16, kGemmTM = 4, kGemmTN = 4;
inline constexpr int kGemmThreads = (kGemmBM / kGemmTM) * (kGemmBN / kGemmTN);  // 256

struct GemmShared {
  float a[kGemmBK][kGemmBM];  // a[kk][i] = A(row0 + i, k0 + kk)
  float b[kGemmBK][kGemmBN];  // b[kk][j] = B(k0 + kk, col0 + j)
};

struct GemmRegs {
  float acc[kGemmTM][kGemmTN];
};

// Block (bi, bj) of the grid: output rows [bi*BM, ...), columns [bj*BN, ...).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable  // instantiated with DeviceBlock on the device, HostBlock on the host
#endif
template <class Block>
OLMOREF_HD void gemm_exact_block(Block& blk, GemmShared& sh, const GemmArgs& g, int64_t bi, int64_t bj) {
  const int64_t row0 = bi * kGemmBM, col0 = bj * kGemmBN;
  constexpr int tcols = kGemmBN / kGemmTN;  // threads across a tile row
  // Thread t owns outputs rows row0 + (t / tcols)*TM + i, columns col0 + (t % tcols)*TN + j.
  blk.phase([&](int t, GemmRegs& r) {
    for (int i = 0; i < kGemmTM; ++i)
      for (int j = 0; j < kGemmTN; ++j) {
        const int64_t row = row0 + (t / tcols) * kGemmTM + i, col = col0 + (t % tcols) * kGemmTN + j;
        r.acc[i][j] = g.accumulate && row < g.M && col < g.N ? g.C[row * g.ldc + col] : 0.0f;
      }
  });
  for (int64_t k0 = 0; k0 < g.K; k0 += kGemmBK) {
    const int kn = static_cast<int>(g.K - k0 < kGemmBK ? g.K - k0 : kGemmBK);
    // Stage the slab: BK*BM + BK*BN elements, 8 per thread. Rows/columns past the matrix are never stored.
    blk.phase([&](int t, GemmRegs&) {
      for (int e = t; e < kGemmBK * kGemmBM; e += kGemmThreads) {
        const int kk = e / kGemmBM, i = e % kGemmBM;
        const int64_t row = row0 + i;
        sh.a[kk][i] = kk < kn && row < g.M ? g.A[row * g.a_row + (k0 + kk) * g.a_col] : 0.0f;
      }
      for (int e = t; e < kGemmBK * kGemmBN; e += kGemmThreads) {
        const int kk = e / kGemmBN, j = e % kGemmBN;
        const int64_t col = col0 + j;
        sh.b[kk][j] = kk < kn && col < g.N ? g.B[(k0 + kk) * g.b_row + col * g.b_col] : 0.0f;
      }
    });
    // Continue every chain over the slab, kk ascending.
    blk.phase([&](int t, GemmRegs& r) {
      const int ti = (t / tcols) * kGemmTM, tj = (t % tcols) * kGemmTN;
      for (int i = 0; i < kGemmTM; ++i)
        for (int j = 0; j < kGemmTN; ++j) {
          float acc = g.debug_split_k ? 0.0f : r.acc[i][j];
          for (int kk = 0; kk < kn; ++kk) acc = hd_fma(sh.a[kk][ti + i], sh.b[kk][tj + j], acc);
          r.acc[i][j] = g.debug_split_k ? r.acc[i][j] + acc : acc;
        }
    });
  }
  blk.phase([&](int t, GemmRegs& r) {
    for (int i = 0; i < kGemmTM; ++i)
      for (int j = 0; j < kGemmTN; ++j) {
        const int64_t row = row0 + (t / tcols) * kGemmTM + i, col = col0 + (t % tcols) * kGemmTN + j;
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

}  // namespace olmoref::kernels
