// ref/gemm_avx2.cpp — AVX2+FMA micro-kernel for the canonical-order GEMM (built with -mavx2 -mfma, selected
// at run time by ref/gemm.cpp only where the CPU has them). The tile itself is ref/gemm_simd_tile.h's template.
//
// Register tile: MR = 6 rows x NR = 16 columns = 12 ymm accumulators + 2 for the B row + 1 broadcast = 15 of
// 16 registers (the classic Haswell shape). Each accumulator lane is one C[i,j]; the K loop runs in order.
#include <immintrin.h>

#include "ref/gemm_simd_tile.h"

namespace olmoref::gemm_detail {
namespace {

struct Avx2 {
  using Vec = __m256;
  using Mask = __m256i;
  static constexpr int W = 8, MR = 6, NV = 2;

  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec load_masked(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void store_masked(float* p, Mask m, Vec v) { _mm256_maskstore_ps(p, m, v); }
  static Vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  // Lane mask for the last vector of a row holding `rem` (1..8) valid columns.
  static Mask tail_mask(int rem) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lanes);
  }
};

struct Avx2Kernel {
  static constexpr int MR = Avx2::MR, NR = Avx2::W * Avx2::NV;
  // Measured on Zen 5 against 256: KC = 512 (B panel 32 KiB in L1, A block 120 x 512 x 4 = 240 KiB in L2),
  // and B always packed (reading contiguous B rows in place, as the AVX-512 path does for short outputs,
  // measured slower here).
  static constexpr int64_t MC = 20 * MR, KC = 512, NC = 2048;
  static constexpr int64_t B_DIRECT_MAX_ROWS = 0;
  // dYᵀ with a 4 KiB K step is packed: read in place it measured ~30% slower (N = 1024/4096).
  static constexpr bool PACK_A_4K_COLS = true;
  static constexpr bool PACK_A_COLS = false;
  static constexpr bool PACK_A_ROWS = false;

  static constexpr auto tile = &simd_tile<Avx2>;
};

}  // namespace

const GemmKernelInfo& gemm_kernel_avx2() { return gemm_kernel_info<Avx2Kernel>(); }

}  // namespace olmoref::gemm_detail
