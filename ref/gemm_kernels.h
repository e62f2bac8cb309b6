// ref/gemm_kernels.h — private to ref/gemm*.cpp: the blocked driver shared by every ISA path.
//
// Each ISA translation unit (gemm.cpp scalar, gemm_avx2.cpp, gemm_avx512.cpp) includes this header and
// instantiates gemm_drive<Kern> with a kernel type declared in its own anonymous namespace. That gives every
// instantiation internal linkage, so code compiled with -mavx512f can never be picked by the linker for a
// caller in a baseline translation unit (the classic ODR trap of per-file ISA flags). For the same reason
// this header uses no out-of-line standard library templates, only plain loops.
//
// Blocking (GotoBLAS/BLIS order), for the thread's output rectangle C[m0:m1, n0:n1]:
//   for jc (NC columns):  for pc (K blocks of <= KC, IN ORDER):  B[pc:pc+kc, jc:jc+nc] -> NR-wide panels
//     for ic (MC rows):  A[ic:ic+mc, pc:pc+kc] read in place where one of its strides is 1
//       for jr (NR):  for ir (MR):  micro-kernel: an MR x NR register tile runs kc FMA steps.
// Per product (M tokens, W[N,K]):
//   forward  Y = X·Wᵀ    A = X read in place (row-major),     B = Wᵀ packed (a transpose, reused by all rows)
//   bwd-in   dX = dY·W   A = dY read in place (row-major),    B = W packed (a copy)
//   bwd-w    dW = dYᵀ·X  A = dYᵀ (column-major) packed into MR panels (AVX-512 always, AVX2 when N is a
//                        multiple of 1024; otherwise read in place),
//                        B = X rows read in place (few row tiles) or packed
// A generic strided A is packed into MR-tall panels. The K blocks of one C tile are visited in increasing
// pc, and between blocks the accumulator is stored to C and reloaded (load_c), which keeps the fp32 bits: so
// every C[i,j] is still one fmaf chain over p = 0..K-1.
#pragma once

#include <cstdint>

#include "ref/gemm.h"

namespace olmoref::gemm_detail {

// One thread's share of a product: the rectangle [m0,m1) x [n0,n1) of C over the full K.
struct GemmTask {
  int64_t m0, m1, n0, n1, K;
  MatView A, B;
  float* C;
  int64_t ldc;
  bool accumulate;
  float* pack_a;  // >= (mc + mr) * (kc + 16) floats, 64-byte aligned, private to the thread
  float* pack_b;  // >= (nc + nr) * kc floats, 64-byte aligned, private to the thread
  const GemmEpilogue* epilogue;  // null: none
};

// What the dispatcher needs to know about an ISA path: tile and block sizes (for the thread split and the
// pack buffers) and the driver itself.
struct GemmKernelInfo {
  int mr, nr;
  int64_t mc, kc, nc;
  void (*drive)(const GemmTask&);
};

#if defined(__x86_64__) || defined(_M_X64)
const GemmKernelInfo& gemm_kernel_avx2();    // ref/gemm_avx2.cpp, compiled with -mavx2 -mfma
const GemmKernelInfo& gemm_kernel_avx512();  // ref/gemm_avx512.cpp, compiled with -mavx512{f,vl,bw,dq}
#endif
const GemmKernelInfo& gemm_kernel_scalar();  // ref/gemm.cpp, no ISA flags beyond the project's

static inline int64_t gd_min(int64_t a, int64_t b) { return a < b ? a : b; }

// B[pc:pc+kc, j0:j0+nc] -> NR-wide panels, panel q holds columns j0+q*NR.. as dst[q*kc*NR + p*NR + j].
// Columns past nc are zero so the micro-kernel can always run full-width vectors (their lanes are dropped).
template <int NR>
static inline void pack_b_panels(const MatView& B, int64_t pc, int64_t kc, int64_t j0, int64_t nc, float* dst) {
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int64_t nn = gd_min(NR, nc - jr);
    float* d = dst + jr * kc;
    const float* s = B.data + pc * B.row_stride + (j0 + jr) * B.col_stride;
    if (B.col_stride == 1 && nn == NR) {
      // dX = dY·W, dW = dYᵀ·X: rows of B are contiguous; a straight copy the compiler vectorises.
      for (int64_t p = 0; p < kc; ++p)
        for (int j = 0; j < NR; ++j) d[p * NR + j] = s[p * B.row_stride + j];
    } else if (B.row_stride == 1) {
      // Y = X·Wᵀ: B(p,j) = W[j,p], so columns are contiguous; read each column along p (a transpose).
      // Done once per KC x NC block and reused by every row tile, so it is a small share of the work.
      for (int64_t j = 0; j < nn; ++j)
        for (int64_t p = 0; p < kc; ++p) d[p * NR + j] = s[j * B.col_stride + p];
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t j = nn; j < NR; ++j) d[p * NR + j] = 0.0f;
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        for (int64_t j = 0; j < nn; ++j) d[p * NR + j] = s[p * B.row_stride + j * B.col_stride];
        for (int64_t j = nn; j < NR; ++j) d[p * NR + j] = 0.0f;
      }
    }
  }
}

// A[i0:i0+mc, pc:pc+kc] -> MR-tall panels, panel q holds rows i0+q*MR.. as dst[q*kc*MR + p*MR + r].
// Rows past mc are never read by the micro-kernel (it is instantiated per row count), so they stay unset.
template <int MR>
static inline void pack_a_panels(const MatView& A, int64_t i0, int64_t mc, int64_t pc, int64_t kc, float* dst) {
  for (int64_t ir = 0; ir < mc; ir += MR) {
    const int64_t mm = gd_min(MR, mc - ir);
    float* d = dst + ir * kc;
    const float* s = A.data + (i0 + ir) * A.row_stride + pc * A.col_stride;
    if (A.row_stride == 1 && mm == MR) {
      // dW = dYᵀ·X: each K step is MR contiguous floats of one dY row.
      for (int64_t p = 0; p < kc; ++p)
        for (int r = 0; r < MR; ++r) d[p * MR + r] = s[p * A.col_stride + r];
    } else {
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < mm; ++r) d[p * MR + r] = s[r * A.row_stride + p * A.col_stride];
    }
  }
}

// A[i0:i0+mc, pc:pc+kc] (row-major) -> rows of stride kc + 16 floats: dst[r*(kc+16) + p].
static inline void copy_a_block(const MatView& A, int64_t i0, int64_t mc, int64_t pc, int64_t kc, float* dst) {
  for (int64_t r = 0; r < mc; ++r) {
    const float* s = A.data + (i0 + r) * A.row_stride + pc;
    float* d = dst + r * (kc + 16);
    for (int64_t p = 0; p < kc; ++p) d[p] = s[p];
  }
}

// How the micro-kernel addresses A: kARow: A(r,p) = a[r*lda + p] (row-major: forward X, backward-input dY);
// kACol: A(r,p) = a[p*lda + r] (backward-weight dYᵀ read in place with lda = N, or a packed panel, lda = MR).
// Broadcasts do not care about layout, so neither needs a transpose.
enum AMode { kARow = 0, kACol = 1 };

// Kern provides MR, NR, MC, KC, NC, B_DIRECT_MAX_ROWS, PACK_A_4K_COLS, PACK_A_COLS (pack column-major A at any
// stride), PACK_A_ROWS (pack row-major A too) and
//   tile(mm, nn, kc, amode, a, lda, b, ldb, c, ldc, load_c, c_next)
// computing C[0:mm, 0:nn] (ldc) = (load_c ? C : 0) + fmaf chain over p = 0..kc-1 of A(r,p)·b[p*ldb + j],
// with B either an NR-wide packed panel (ldb = NR, zero beyond nn) or B's own rows (ldb = row stride; the
// kernel then must not read past column nn). c_next (may be null) is the tile that comes next, to prefetch.
template <class Kern>
static void gemm_drive(const GemmTask& t) {
  constexpr int MR = Kern::MR, NR = Kern::NR;
  // A is read in place when one stride is 1. Column-major A (dYᵀ) whose K step is a multiple of 4 KiB
  // (N = 1024, 4096) puts the kc lines of one micro-panel into one L1 set; kernels that suffer from that
  // (Kern::PACK_A_4K_COLS, measured) pack the panel (a contiguous MR-float copy per K step). Generic strides
  // are always packed.
  const AMode amode = t.A.col_stride == 1 ? kARow : kACol;
  const bool pack_a =
      (t.A.col_stride == 1 && Kern::PACK_A_ROWS) ||
      (t.A.col_stride != 1 && (t.A.row_stride != 1 || Kern::PACK_A_COLS || (Kern::PACK_A_4K_COLS && t.A.col_stride % 1024 == 0)));
  const int64_t lda = pack_a ? MR : amode == kARow ? t.A.row_stride : t.A.col_stride;
  const AMode tile_mode = pack_a ? kACol : amode;  // a packed panel is p-major: A(r,p) = panel[p*MR + r]
  // Row-major A whose row stride is a multiple of 4 KiB (e.g. X[M, 1024]) would put all MR rows of a tile in
  // one L1 set: copy the MC x KC block to rows of stride kc + 16 floats instead (a straight copy, no transpose).
  const bool copy_a_rows = !pack_a && amode == kARow && t.A.row_stride % 1024 == 0;
  // B rows are read in place when they are contiguous and this thread has few row tiles to share a packed copy
  // across (backward-weight: C is N x K, B = X with M = 4096+ rows): there packing would be a full extra pass
  // over X for little reuse. Otherwise pack: a panel in L1 with no cache-set conflicts pays off over many
  // row tiles.
  const bool pack_b = t.B.col_stride != 1 || t.m1 - t.m0 > Kern::B_DIRECT_MAX_ROWS;
  // Equal K blocks of at most KC (e.g. K = 384 -> one block, K = 600 -> 3 x 200), visited in order.
  const int64_t nkb = (t.K + Kern::KC - 1) / Kern::KC;
  const int64_t kb = (t.K + nkb - 1) / nkb;
  for (int64_t jc = t.n0; jc < t.n1; jc += Kern::NC) {
    const int64_t nc = gd_min(Kern::NC, t.n1 - jc);
    for (int64_t pc = 0; pc < t.K; pc += kb) {
      const int64_t kc = gd_min(kb, t.K - pc);
      const bool load_c = t.accumulate || pc > 0;  // later K blocks continue the chain stored in C
      const bool last_k = pc + kc == t.K;
      if (pack_b) pack_b_panels<NR>(t.B, pc, kc, jc, nc, t.pack_b);
      for (int64_t ic = t.m0; ic < t.m1; ic += Kern::MC) {
        const int64_t mc = gd_min(Kern::MC, t.m1 - ic);
        if (pack_a) pack_a_panels<MR>(t.A, ic, mc, pc, kc, t.pack_a);
        if (copy_a_rows) copy_a_block(t.A, ic, mc, pc, kc, t.pack_a);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int nn = static_cast<int>(gd_min(NR, nc - jr));
          const float* bp = pack_b ? t.pack_b + jr * kc : t.B.data + pc * t.B.row_stride + jc + jr;
          const int64_t ldb = pack_b ? NR : t.B.row_stride;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int mm = static_cast<int>(gd_min(MR, mc - ir));
            float* c = t.C + (ic + ir) * t.ldc + jc + jr;
            const float* a = pack_a        ? t.pack_a + ir * kc
                             : copy_a_rows   ? t.pack_a + ir * (kc + 16)
                             : amode == kARow ? t.A.data + (ic + ir) * t.A.row_stride + pc
                                              : t.A.data + pc * t.A.col_stride + ic + ir;
            const float* c_next = ir + MR < mc ? c + MR * t.ldc : nullptr;
            Kern::tile(mm, nn, kc, tile_mode, a, copy_a_rows ? kc + 16 : lda, bp, ldb, c, t.ldc, load_c, c_next);
            // The tile's chains are complete after the last K block: the epilogue reads them from L1.
            if (last_k && t.epilogue)
              for (int r = 0; r < mm; ++r) t.epilogue->apply(t.epilogue->ctx, c + r * t.ldc, ic + ir + r, jc + jr, nn);
          }
        }
      }
    }
  }
}

// The dispatcher's view of one ISA path; a function-local static per Kern (each TU's own anonymous type).
template <class Kern>
static const GemmKernelInfo& gemm_kernel_info() {
  static const GemmKernelInfo info{Kern::MR, Kern::NR, Kern::MC, Kern::KC, Kern::NC, &gemm_drive<Kern>};
  return info;
}

}  // namespace olmoref::gemm_detail
