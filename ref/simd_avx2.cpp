// ref/simd_avx2.cpp — the AVX2 path of ref/simd_ops.h (built with -mavx2 -mfma, picked at run time only where the
// CPU has them). The register traits; the kernels are ref/simd_ops_impl.h's templates.
#include <immintrin.h>

#include "ref/simd_ops_impl.h"

namespace olmoref::simd {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int kScoreRows = 4, kScoreVecs = 2;  // 8 accumulators + 2 key registers + 1 broadcast
  static constexpr int kChainRegs = 8;

  static __m256i first(int64_t cnt) {
    const int c = cnt >= 8 ? 8 : static_cast<int>(cnt);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V load_first(const float* p, int64_t cnt) { return _mm256_maskload_ps(p, first(cnt)); }
  static void store_first(float* p, V v, int64_t cnt) { _mm256_maskstore_ps(p, first(cnt), v); }
  static V add_first(V acc, V x, int64_t cnt) {
    return _mm256_blendv_ps(acc, _mm256_add_ps(acc, x), _mm256_castsi256_ps(first(cnt)));
  }
  static V blend_first(V old, V now, int64_t cnt) { return _mm256_blendv_ps(old, now, _mm256_castsi256_ps(first(cnt))); }
  static V round_bf16(V x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)),
                                       _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                            _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static V max_keep(V x, V m) { return _mm256_max_ps(x, m); }
};

}  // namespace

const SimdOps& simd_ops_avx2() {
  static const SimdOps ops = make_simd_ops<Avx2>("avx2");
  return ops;
}

}  // namespace olmoref::simd
