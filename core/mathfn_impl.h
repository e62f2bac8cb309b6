// core/mathfn_impl.h — the definitions of core/mathfn.h, compiled for the CPU and the GPU from this one source
// (docs/canonical/math.md). Only +, -, *, /, fma, round-to-integer and exponent-bit manipulation: the same
// bits on every executor. Host code calls det::expf etc. (core/mathfn.h); kernels call det::impl:: directly.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/lanes.h"

namespace olmoref::det::impl {

OLMOREF_HD inline double log(double x);

// 2^k for integer k in the normal range, built from exponent bits (exact).
OLMOREF_HD inline float pow2f(int k) { return hd_float(static_cast<uint32_t>(k + 127) << 23); }
OLMOREF_HD inline double pow2(int64_t k) {
  return hd_double(static_cast<uint64_t>(k + 1023) << 52);
}

// The domain limits of expf: above kExpfMax the result is +inf, below kExpfMin it is 0 (denormal results are
// flushed by definition).
constexpr float kExpfMax = 88.72283935546875f;
constexpr float kExpfMin = -87.5f;

// expf's arithmetic on the normal path, one source for a float and for SIMD lanes (core/lanes.h):
// kf = round(x / ln2), and p = exp(r) for r = x - kf*ln2 in [-ln2/2, ln2/2] (Cody–Waite: the high part of ln2
// has trailing zero bits so kf*ln2_hi is exact for |k| < 256), so that exp(x) = p * 2^kf.
template <class V>
OLMOREF_HD inline V expf_exponent(V x) {
  return lanes_rint(x * 1.44269502162933349609375f);
}
template <class V>
OLMOREF_HD inline V expf_mantissa(V x, V kf) {
  V r = lanes_fma(kf, lanes_splat<V>(-0.693145751953125f), x);
  r = lanes_fma(kf, lanes_splat<V>(-1.428606765330187045e-06f), r);
  // Taylor polynomial to degree 7 (truncation < 6e-9 relative on |r| <= 0.347), Horner with fma.
  V p = lanes_splat<V>(1.98412698412698412698e-4f);          // 1/5040
  p = lanes_fma(p, r, lanes_splat<V>(1.38888888888888888889e-3f));  // 1/720
  p = lanes_fma(p, r, lanes_splat<V>(8.33333333333333333333e-3f));  // 1/120
  p = lanes_fma(p, r, lanes_splat<V>(4.16666666666666666667e-2f));  // 1/24
  p = lanes_fma(p, r, lanes_splat<V>(1.66666666666666666667e-1f));  // 1/6
  p = lanes_fma(p, r, lanes_splat<V>(0.5f));
  p = lanes_fma(p, r, lanes_splat<V>(1.0f));
  p = lanes_fma(p, r, lanes_splat<V>(1.0f));
  return p;
}

OLMOREF_HD inline float expf(float x) {
  if (x != x) return x;
  if (x > kExpfMax) return hd_float(0x7f800000u);
  if (x < kExpfMin) return 0.0f;
  const float kf = expf_exponent(x);
  const float p = expf_mantissa(x, kf);
  const int k = static_cast<int>(kf);
  // k in [-126, 128] on this domain: split the scale so each factor is a normal power of two.
  if (k > 127) return p * pow2f(127) * 2.0f;
  if (k < -126) return p * pow2f(-126) * pow2f(k + 126);
  return p * pow2f(k);
}

#if !defined(__CUDACC__) && defined(__AVX512F__)
// 16 lanes of expf, each bit-identical to expf(float) above (tests/ref/test_simd.cpp checks every special value
// and a dense sample of the fp32 range). k < -126 cannot occur on [kExpfMin, kExpfMax], so only k = 128 needs the
// split scale: p * 2^127 * 2, and p * 2^k * 1 (exact) otherwise.
inline __m512 expf(__m512 x) {
  const __m512 kf = expf_exponent(x);
  const __m512 p = expf_mantissa(x, kf);
  const __m512i k = _mm512_cvtps_epi32(kf);
  const __m512i k1 = _mm512_min_epi32(k, _mm512_set1_epi32(127));
  const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, _mm512_set1_epi32(127)), 23));
  const __mmask16 big = _mm512_cmpgt_epi32_mask(k, _mm512_set1_epi32(127));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, scale), _mm512_mask_blend_ps(big, _mm512_set1_ps(1.0f), _mm512_set1_ps(2.0f)));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpfMin), _CMP_LT_OQ), y, _mm512_setzero_ps());
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpfMax), _CMP_GT_OQ), y,
                           _mm512_castsi512_ps(_mm512_set1_epi32(0x7f800000)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}
#endif

#if !defined(__CUDACC__) && defined(__AVX2__) && defined(__FMA__)
// 8 lanes of expf, as the 16-lane version.
inline __m256 expf(__m256 x) {
  const __m256 kf = expf_exponent(x);
  const __m256 p = expf_mantissa(x, kf);
  const __m256i k = _mm256_cvtps_epi32(kf);
  const __m256i k1 = _mm256_min_epi32(k, _mm256_set1_epi32(127));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23));
  const __m256 big = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, _mm256_set1_epi32(127)));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, scale), _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(2.0f), big));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(kExpfMin), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000)),
                       _mm256_cmp_ps(x, _mm256_set1_ps(kExpfMax), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
#endif

OLMOREF_HD inline float logf(float x) { return static_cast<float>(log(static_cast<double>(x))); }

// Templates over the lane type (float, or a SIMD register where core/lanes.h provides one): the same formula per lane.
template <class V>
OLMOREF_HD inline V sigmoidf(V x) { return 1.0f / (1.0f + expf(-x)); }

template <class V>
OLMOREF_HD inline V siluf(V x) { return x / (1.0f + expf(-x)); }

OLMOREF_HD inline double exp(double x) {
  if (x != x) return x;
  if (x > 709.782712893384) return hd_double(0x7ff0000000000000ull);
  if (x < -708.3) return 0.0;
  const double kd = hd_rint(x * 1.4426950408889634074);
  // ln2 split so that kd * ln2_hi is exact for |k| < 2^11.
  double r = hd_fma(kd, -6.93147180369123816490e-01, x);
  r = hd_fma(kd, -1.90821492927058770002e-10, r);
  // Taylor to degree 13: truncation < 1e-17 on |r| <= 0.347.
  const double inv_fact[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                                    1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,       1.0 / 720.0,
                                    1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,          0.5,
                                    1.0,                1.0};
  double p = inv_fact[0];
  for (int i = 1; i < 14; ++i) p = hd_fma(p, r, inv_fact[i]);
  return p * pow2(static_cast<int64_t>(kd));
}

// log's arithmetic once the argument is split as x = m · 2^e with m in [sqrt(1/2), sqrt(2)) (ed = e as a double):
// log(m) = 2 atanh(s), s = (m-1)/(m+1), odd series to s^25 (truncation < 1e-19), plus e·ln2 as two fmas. One
// source for a double and for SIMD lanes of doubles (the vector logf below).
template <class V>
OLMOREF_HD inline V log_reduced(V m, V ed) {
  const V s = (m - 1.0) / (m + 1.0);
  const V s2 = s * s;
  V q = lanes_splat<V>(1.0 / 25.0);
  for (int k = 23; k >= 1; k -= 2) q = lanes_fma(q, s2, lanes_splat<V>(1.0 / k));
  const V log_m = 2.0 * s * q;
  return lanes_fma(ed, lanes_splat<V>(6.93147180369123816490e-01),
                   lanes_fma(ed, lanes_splat<V>(1.90821492927058770002e-10), log_m));
}

OLMOREF_HD inline double log(double x) {
  if (x != x || x < 0.0) return hd_double(0x7ff8000000000000ull);
  if (x == 0.0) return -hd_double(0x7ff0000000000000ull);
  if (x == hd_double(0x7ff0000000000000ull)) return x;
  int64_t e = 0;
  uint64_t u = hd_bits(x);
  if ((u >> 52) == 0) {  // subnormal: scale into the normal range first (exact)
    x *= pow2(54);
    e -= 54;
    u = hd_bits(x);
  }
  e += static_cast<int64_t>((u >> 52) & 0x7ff) - 1023;
  u = (u & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;  // mantissa m in [1, 2)
  double m = hd_double(u);
  if (m > 1.4142135623730951) {  // keep m in [sqrt(1/2), sqrt(2)) so |s| <= 0.1716
    m *= 0.5;
    e += 1;
  }
  return log_reduced(m, static_cast<double>(e));
}

#if !defined(__CUDACC__) && defined(__AVX512F__) && defined(__AVX512DQ__)
// 8 lanes of log(double) for arguments that are floats widened to double (so never subnormal as doubles): the
// exponent split as above, the sqrt(2) adjustment as a blend (m·0.5 and e + 1 are exact either way).
inline __m512d log_of_float_lanes(__m512d x) {
  const __m512i u = _mm512_castpd_si512(x);
  const __m512d ed0 = _mm512_cvtepi64_pd(
      _mm512_sub_epi64(_mm512_and_si512(_mm512_srli_epi64(u, 52), _mm512_set1_epi64(0x7ff)), _mm512_set1_epi64(1023)));
  const __m512d m0 = _mm512_castsi512_pd(_mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi64(0x000fffffffffffffLL)),
                                                         _mm512_set1_epi64(0x3ff0000000000000LL)));
  const __mmask8 big = _mm512_cmp_pd_mask(m0, _mm512_set1_pd(1.4142135623730951), _CMP_GT_OQ);
  const __m512d m = _mm512_mask_blend_pd(big, m0, _mm512_mul_pd(m0, _mm512_set1_pd(0.5)));
  const __m512d ed = _mm512_mask_blend_pd(big, ed0, _mm512_add_pd(ed0, _mm512_set1_pd(1.0)));
  __m512d y = log_reduced(m, ed);
  y = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_set1_pd(0.0), _CMP_EQ_OQ), y,
                           _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<long long>(0xfff0000000000000ull))));
  y = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, _mm512_castsi512_pd(_mm512_set1_epi64(0x7ff0000000000000LL)), _CMP_EQ_OQ),
                           y, x);
  const __mmask8 nan = _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q) | _mm512_cmp_pd_mask(x, _mm512_set1_pd(0.0), _CMP_LT_OQ);
  return _mm512_mask_blend_pd(nan, y, _mm512_castsi512_pd(_mm512_set1_epi64(0x7ff8000000000000LL)));
}
// 16 lanes of logf = float(log(double(x))).
inline __m512 logf(__m512 x) {
  const __m512d lo = log_of_float_lanes(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
  const __m512d hi = log_of_float_lanes(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
}
#endif

#if !defined(__CUDACC__) && defined(__AVX2__) && defined(__FMA__)
// 4 lanes of log(double) for floats widened to double, as the AVX-512 version (AVX2 has no int64 -> double
// conversion: the biased exponent b < 2^11 becomes a double exactly as bits(2^52 + b) − 2^52).
inline __m256d log_of_float_lanes(__m256d x) {
  const __m256i u = _mm256_castpd_si256(x);
  const __m256i b = _mm256_and_si256(_mm256_srli_epi64(u, 52), _mm256_set1_epi64x(0x7ff));
  const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
  const __m256d bd = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(b, _mm256_castpd_si256(two52))), two52);
  const __m256d ed0 = _mm256_sub_pd(bd, _mm256_set1_pd(1023.0));
  const __m256d m0 = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi64x(0x000fffffffffffffLL)),
                                                         _mm256_set1_epi64x(0x3ff0000000000000LL)));
  const __m256d big = _mm256_cmp_pd(m0, _mm256_set1_pd(1.4142135623730951), _CMP_GT_OQ);
  const __m256d m = _mm256_blendv_pd(m0, _mm256_mul_pd(m0, _mm256_set1_pd(0.5)), big);
  const __m256d ed = _mm256_blendv_pd(ed0, _mm256_add_pd(ed0, _mm256_set1_pd(1.0)), big);
  __m256d y = log_reduced(m, ed);
  y = _mm256_blendv_pd(y, _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(0xfff0000000000000ull))),
                       _mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_EQ_OQ));
  y = _mm256_blendv_pd(y, x, _mm256_cmp_pd(x, _mm256_castsi256_pd(_mm256_set1_epi64x(0x7ff0000000000000LL)), _CMP_EQ_OQ));
  const __m256d nan = _mm256_or_pd(_mm256_cmp_pd(x, x, _CMP_UNORD_Q), _mm256_cmp_pd(x, _mm256_setzero_pd(), _CMP_LT_OQ));
  return _mm256_blendv_pd(y, _mm256_castsi256_pd(_mm256_set1_epi64x(0x7ff8000000000000LL)), nan);
}
// 8 lanes of logf = float(log(double(x))).
inline __m256 logf(__m256 x) {
  const __m256d lo = log_of_float_lanes(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
  const __m256d hi = log_of_float_lanes(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(lo)), _mm256_cvtpd_ps(hi), 1);
}
#endif

// sin and cos on |r| <= pi/4 by Taylor series (truncation < 1e-19).
OLMOREF_HD inline double sin_kernel(double r) {
  const double r2 = r * r;
  // Coefficients (-1)^n / (2n+1)! for n = 8 .. 0.
  const double k[] = {1.0 / 355687428096000.0,   -1.0 / 1307674368000.0, 1.0 / 6227020800.0,
                             -1.0 / 39916800.0,         1.0 / 362880.0,         -1.0 / 5040.0,
                             1.0 / 120.0,               -1.0 / 6.0,             1.0};
  double q = k[0];
  for (int i = 1; i < 9; ++i) q = hd_fma(q, r2, k[i]);
  return r * q;
}

OLMOREF_HD inline double cos_kernel(double r) {
  const double r2 = r * r;
  // Coefficients (-1)^n / (2n)! for n = 9 .. 0.
  const double k[] = {-1.0 / 6402373705728000.0, 1.0 / 20922789888000.0, -1.0 / 87178291200.0,
                             1.0 / 479001600.0,         -1.0 / 3628800.0,       1.0 / 40320.0,
                             -1.0 / 720.0,              1.0 / 24.0,             -0.5,
                             1.0};
  double q = k[0];
  for (int i = 1; i < 10; ++i) q = hd_fma(q, r2, k[i]);
  return q;
}

// x = n*(pi/2) + r with pi/2 split into three 33-bit pieces (fdlibm's), exact products for |n| < 2^20.
OLMOREF_HD inline double reduce_half_pi(double x, int64_t* quadrant) {
  const double n = hd_rint(x * 6.36619772367581382433e-01);
  double r = hd_fma(-n, 1.57079632673412561417e+00, x);
  r = hd_fma(-n, 6.07710050630396597660e-11, r);
  r = hd_fma(-n, 2.02226624871116645580e-21, r);
  *quadrant = static_cast<int64_t>(n);
  return r;
}

OLMOREF_HD inline double sin(double x) {
  int64_t q;
  const double r = reduce_half_pi(x, &q);
  switch (q & 3) {
    case 0: return sin_kernel(r);
    case 1: return cos_kernel(r);
    case 2: return -sin_kernel(r);
    default: return -cos_kernel(r);
  }
}

OLMOREF_HD inline double cos(double x) {
  int64_t q;
  const double r = reduce_half_pi(x, &q);
  switch (q & 3) {
    case 0: return cos_kernel(r);
    case 1: return -sin_kernel(r);
    case 2: return -cos_kernel(r);
    default: return sin_kernel(r);
  }
}

OLMOREF_HD inline double pow(double base, double e) { return exp(e * log(base)); }

}  // namespace olmoref::det::impl
