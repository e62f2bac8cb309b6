// ref/gemm_avx512.cpp — AVX-512 micro-kernel for the canonical-order GEMM (built with -mavx512f -mavx512vl
// -mavx512bw -mavx512dq -mfma, selected at run time by ref/gemm.cpp only where the CPU has them).
//
// Register tile: MR = 14 rows x NR = 32 columns = 28 zmm accumulators, + 2 zmm for the B row + 1 broadcast
// = 31 of 32 registers. Per K step: 2 vector loads of B, 14 broadcasts of A, 28 FMAs; with 2 FMA pipes that
// is 14 cycles of FMA against 16 loads, so the FMA units stay the bottleneck. Each accumulator lane is one
// C[i,j] and sees A(i,p)·B(p,j) for p in order: vectorised over j, broadcast over i, never over K.
#include <immintrin.h>

#include "ref/gemm_kernels.h"

namespace olmoref::gemm_detail {
namespace {

constexpr int kMR = 14;
constexpr int kNV = 2;  // zmm vectors per tile row
constexpr int kNR = 16 * kNV;

// ROWS <= kMR valid rows, NVEC <= kNV vectors. MASKED: the last vector holds fewer than 16 valid columns
// (`last`), so C and (when B is read in place) B are loaded/stored under the mask, never past column nn.
template <int ROWS, int NVEC, int AMODE, bool MASKED>
void micro_tile(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                __mmask16 last, bool load_c, const float* c_next) {
  if (c_next) {
    // The next tile's C rows come from L2/L3 (or DRAM for a 4096-wide output); ask for them now so the
    // next tile's first load/store does not wait.
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) __builtin_prefetch(c_next + r * ldc + 16 * v, 1, 3);
  }
  __m512 acc[ROWS][NVEC];
  if (load_c) {
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v)
        acc[r][v] = MASKED && v == NVEC - 1 ? _mm512_maskz_loadu_ps(last, c + r * ldc + 16 * v)
                                            : _mm512_loadu_ps(c + r * ldc + 16 * v);
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[NVEC];
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v)
      bv[v] = MASKED && v == NVEC - 1 ? _mm512_maskz_loadu_ps(last, b + p * ldb + 16 * v)
                                      : _mm512_loadu_ps(b + p * ldb + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const __m512 av = _mm512_set1_ps(AMODE == kARow ? a[r * lda + p] : a[p * lda + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) {
      if (MASKED && v == NVEC - 1)
        _mm512_mask_storeu_ps(c + r * ldc + 16 * v, last, acc[r][v]);
      else
        _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
    }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, __mmask16, bool,
                        const float*);

// Edge tiles (fewer rows or columns) are rare; they go through a table of all instantiations.
template <int AMODE, int ROWS>
constexpr TileFn pick_vec(int nvec, bool masked) {
  return nvec == 1 ? (masked ? &micro_tile<ROWS, 1, AMODE, true> : &micro_tile<ROWS, 1, AMODE, false>)
                   : (masked ? &micro_tile<ROWS, 2, AMODE, true> : &micro_tile<ROWS, 2, AMODE, false>);
}

template <int AMODE>
TileFn pick(int rows, int nvec, bool masked) {
  switch (rows) {
    case 1: return pick_vec<AMODE, 1>(nvec, masked);
    case 2: return pick_vec<AMODE, 2>(nvec, masked);
    case 3: return pick_vec<AMODE, 3>(nvec, masked);
    case 4: return pick_vec<AMODE, 4>(nvec, masked);
    case 5: return pick_vec<AMODE, 5>(nvec, masked);
    case 6: return pick_vec<AMODE, 6>(nvec, masked);
    case 7: return pick_vec<AMODE, 7>(nvec, masked);
    case 8: return pick_vec<AMODE, 8>(nvec, masked);
    case 9: return pick_vec<AMODE, 9>(nvec, masked);
    case 10: return pick_vec<AMODE, 10>(nvec, masked);
    case 11: return pick_vec<AMODE, 11>(nvec, masked);
    case 12: return pick_vec<AMODE, 12>(nvec, masked);
    case 13: return pick_vec<AMODE, 13>(nvec, masked);
    default: return pick_vec<AMODE, 14>(nvec, masked);
  }
}

struct Avx512Kernel {
  static constexpr int MR = kMR, NR = kNR;
  // Measured on Zen 5 (48 KiB L1d, 1 MiB L2): KC = 512 beat 192/256 and matched 384/768 on the training shapes
  // though the KC x NR B panel (64 KiB) then streams from L2 rather than sitting in L1: the L2 keeps up with 2 loads
  // per 14 cycles, and fewer K blocks mean fewer C round trips (K = 384 runs as one block). The MC x KC block
  // of A (252 x 512 x 4 = 504 KiB) stays in L2 across the jr loop; the KC x NC block of B (4 MiB) in L3.
  static constexpr int64_t MC = 18 * kMR, KC = 512, NC = 2048;
  // Up to this many output rows per thread, contiguous B rows are read in place instead of packed: the
  // backward-weight product (C = dW[N, K], B = X[4096+, K]) would otherwise pay a full extra pass over X
  // that only N/14 row tiles reuse. Above it, packing (no L1 set conflicts, aligned loads) wins.
  static constexpr int64_t B_DIRECT_MAX_ROWS = 200;
  // dYᵀ (column-major A, the backward-weight product) is packed into MR-float panels at every N: on the 2-core
  // Intel Xeon (AVX-512) CI machine that took the backward-weight product from 47-66 to 76-93 GFLOP/s on one thread
  // (bench_gemm: 1024^3 and the M = 4096 training shapes), and it closes the gap to OpenBLAS there. (On Zen 5,
  // where the kernel was first tuned, reading dYᵀ in place had measured ~5% faster for N = 1024/4096.) Row-major
  // A (forward, backward-input) stays in place: packing it measured no better.
  static constexpr bool PACK_A_4K_COLS = false;
  static constexpr bool PACK_A_COLS = true;
  static constexpr bool PACK_A_ROWS = false;

  static void tile(int mm, int nn, int64_t kc, AMode amode, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool load_c, const float* c_next) {
    const int nvec = (nn + 15) / 16, rem = nn - 16 * (nvec - 1);
    const bool masked = rem != 16;
    const __mmask16 last = static_cast<__mmask16>(masked ? (1u << rem) - 1u : 0xFFFFu);
    if (mm == kMR && nvec == kNV && !masked) {
      if (amode == kARow) micro_tile<kMR, kNV, kARow, false>(kc, a, lda, b, ldb, c, ldc, last, load_c, c_next);
      else micro_tile<kMR, kNV, kACol, false>(kc, a, lda, b, ldb, c, ldc, last, load_c, c_next);
    } else {
      (amode == kARow ? pick<kARow>(mm, nvec, masked) : pick<kACol>(mm, nvec, masked))(kc, a, lda, b, ldb, c, ldc,
                                                                                      last, load_c, c_next);
    }
  }
};

void drive(const GemmTask& t) { gemm_drive<Avx512Kernel>(t); }

}  // namespace

const GemmKernelInfo& gemm_kernel_avx512() {
  static const GemmKernelInfo info{Avx512Kernel::MR, Avx512Kernel::NR, Avx512Kernel::MC, Avx512Kernel::KC,
                                   Avx512Kernel::NC, &drive};
  return info;
}

}  // namespace olmoref::gemm_detail
