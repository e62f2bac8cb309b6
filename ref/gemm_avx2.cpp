// ref/gemm_avx2.cpp — AVX2+FMA micro-kernel for the canonical-order GEMM (built with -mavx2 -mfma, selected
// at run time by ref/gemm.cpp only where the CPU has them).
//
// Register tile: MR = 6 rows x NR = 16 columns = 12 ymm accumulators + 2 for the B row + 1 broadcast = 15 of
// 16 registers (the classic Haswell shape). Each accumulator lane is one C[i,j]; the K loop runs in order.
#include <immintrin.h>

#include "ref/gemm_kernels.h"

namespace olmoref::gemm_detail {
namespace {

constexpr int kMR = 6;
constexpr int kNV = 2;  // ymm vectors per tile row
constexpr int kNR = 8 * kNV;

// ROWS <= kMR valid rows, NVEC <= kNV vectors. MASKED: the last vector holds fewer than 8 valid columns
// (`last`), so C and (when B is read in place) B are loaded/stored under the mask, never past column nn.
template <int ROWS, int NVEC, int AMODE, bool MASKED>
void micro_tile(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                __m256i last, bool load_c, const float* c_next) {
  if (c_next) {
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) __builtin_prefetch(c_next + r * ldc, 1, 3);
  }
  __m256 acc[ROWS][NVEC];
  if (load_c) {
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v)
        acc[r][v] = MASKED && v == NVEC - 1 ? _mm256_maskload_ps(c + r * ldc + 8 * v, last)
                                            : _mm256_loadu_ps(c + r * ldc + 8 * v);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m256 bv[NVEC];
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v)
      bv[v] = MASKED && v == NVEC - 1 ? _mm256_maskload_ps(b + p * ldb + 8 * v, last)
                                      : _mm256_loadu_ps(b + p * ldb + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      const __m256 av = _mm256_broadcast_ss(AMODE == kARow ? &a[r * lda + p] : &a[p * lda + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) {
      if (MASKED && v == NVEC - 1)
        _mm256_maskstore_ps(c + r * ldc + 8 * v, last, acc[r][v]);
      else
        _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
    }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, __m256i, bool,
                        const float*);

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
    default: return pick_vec<AMODE, 6>(nvec, masked);
  }
}

// Lane mask for the last vector of a row holding `rem` (1..8) valid columns.
inline __m256i lane_mask(int rem) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lanes);
}

struct Avx2Kernel {
  static constexpr int MR = kMR, NR = kNR;
  // Measured on Zen 5 against 256: KC = 512 (B panel 32 KiB in L1, A block 120 x 512 x 4 = 240 KiB in L2),
  // and B always packed (reading contiguous B rows in place, as the AVX-512 path does for short outputs,
  // measured slower here).
  static constexpr int64_t MC = 20 * kMR, KC = 512, NC = 2048;
  static constexpr int64_t B_DIRECT_MAX_ROWS = 0;
  // dYᵀ with a 4 KiB K step is packed: read in place it measured ~30% slower (N = 1024/4096).
  static constexpr bool PACK_A_4K_COLS = true;
  static constexpr bool PACK_A_COLS = false;
  static constexpr bool PACK_A_ROWS = false;

  static void tile(int mm, int nn, int64_t kc, AMode amode, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool load_c, const float* c_next) {
    const int nvec = (nn + 7) / 8, rem = nn - 8 * (nvec - 1);
    const bool masked = rem != 8;
    const __m256i last = lane_mask(rem);
    if (mm == kMR && nvec == kNV && !masked) {
      if (amode == kARow) micro_tile<kMR, kNV, kARow, false>(kc, a, lda, b, ldb, c, ldc, last, load_c, c_next);
      else micro_tile<kMR, kNV, kACol, false>(kc, a, lda, b, ldb, c, ldc, last, load_c, c_next);
    } else {
      (amode == kARow ? pick<kARow>(mm, nvec, masked) : pick<kACol>(mm, nvec, masked))(kc, a, lda, b, ldb, c, ldc,
                                                                                      last, load_c, c_next);
    }
  }
};

void drive(const GemmTask& t) { gemm_drive<Avx2Kernel>(t); }

}  // namespace

const GemmKernelInfo& gemm_kernel_avx2() {
  static const GemmKernelInfo info{Avx2Kernel::MR, Avx2Kernel::NR, Avx2Kernel::MC, Avx2Kernel::KC,
                                   Avx2Kernel::NC, &drive};
  return info;
}

}  // namespace olmoref::gemm_detail
