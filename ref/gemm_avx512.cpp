// ref/gemm_avx512.cpp — AVX-512 micro-kernel for the canonical-order GEMM (built with -mavx512f -mavx512vl
// -mavx512bw -mavx512dq -mfma, selected at run time by ref/gemm.cpp only where the CPU has them). The tile itself
// is ref/gemm_simd_tile.h's template.
//
// Register tile: MR = 14 rows x NR = 32 columns = 28 zmm accumulators, + 2 zmm for the B row + 1 broadcast
// = 31 of 32 registers. Per K step: 2 vector loads of B, 14 broadcasts of A, 28 FMAs; with 2 FMA pipes that
// is 14 cycles of FMA against 16 loads, so the FMA units stay the bottleneck.
#include <immintrin.h>

#include "ref/gemm_simd_tile.h"

namespace olmoref::gemm_detail {
namespace {

struct Avx512 {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr int W = 16, MR = 14, NV = 2;

  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec load_masked(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_masked(float* p, Mask m, Vec v) { _mm512_mask_storeu_ps(p, m, v); }
  static Vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  // The first `rem` (1..16) lanes.
  static Mask tail_mask(int rem) { return static_cast<__mmask16>(rem != 16 ? (1u << rem) - 1u : 0xFFFFu); }
};

struct Avx512Kernel {
  static constexpr int MR = Avx512::MR, NR = Avx512::W * Avx512::NV;
  // Measured on Zen 5 (48 KiB L1d, 1 MiB L2): KC = 512 beat 192/256 and matched 384/768 on the training shapes
  // though the KC x NR B panel (64 KiB) then streams from L2 rather than sitting in L1: the L2 keeps up with 2 loads
  // per 14 cycles, and fewer K blocks mean fewer C round trips (K = 384 runs as one block). The MC x KC block
  // of A (252 x 512 x 4 = 504 KiB) stays in L2 across the jr loop; the KC x NC block of B (4 MiB) in L3.
  static constexpr int64_t MC = 18 * MR, KC = 512, NC = 2048;
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

  static constexpr auto tile = &simd_tile<Avx512>;
};

}  // namespace

const GemmKernelInfo& gemm_kernel_avx512() { return gemm_kernel_info<Avx512Kernel>(); }

}  // namespace olmoref::gemm_detail
