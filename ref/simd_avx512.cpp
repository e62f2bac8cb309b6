// ref/simd_avx512.cpp — the AVX-512 path of ref/simd_ops.h (built with -mavx512f -mavx512vl -mavx512bw -mavx512dq
// -mfma, picked at run time only where the CPU has them). The register traits; the kernels are
// ref/simd_ops_impl.h's templates.
#include <immintrin.h>

#include "ref/simd_ops_impl.h"

namespace olmoref::simd {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int W = 16;
  static constexpr int kScoreRows = 4, kScoreVecs = 4;  // 16 accumulators + 4 key registers + 1 broadcast
  static constexpr int kChainRegs = 16;

  static __mmask16 first(int64_t cnt) {
    return cnt >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << cnt) - 1u);
  }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // The first cnt lanes from p (the rest 0, never read), and stored to p.
  static V load_first(const float* p, int64_t cnt) { return _mm512_maskz_loadu_ps(first(cnt), p); }
  static void store_first(float* p, V v, int64_t cnt) { _mm512_mask_storeu_ps(p, first(cnt), v); }
  // acc + x in the first cnt lanes, acc unchanged in the others.
  static V add_first(V acc, V x, int64_t cnt) { return _mm512_mask_add_ps(acc, first(cnt), acc, x); }
  static V blend_first(V old, V now, int64_t cnt) { return _mm512_mask_blend_ps(first(cnt), old, now); }
  // (x > m) ? x : m per lane: m is kept on NaN x and on ties, as the sequential (m < x) ? x : m.
  // core/bf16.h's round_bf16 per lane: u + 0x7fff + bit 16 of u, low 16 bits cleared; NaN -> 0x7FC00000.
  static V round_bf16(V x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)),
                                       _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(r),
                                _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
  }
  static V max_keep(V x, V m) { return _mm512_max_ps(x, m); }
};

}  // namespace

const SimdOps& simd_ops_avx512() {
  static const SimdOps ops = make_simd_ops<Avx512>("avx512");
  return ops;
}

}  // namespace olmoref::simd
