// core/lanes.h — the few operations the shared arithmetic (core/mathfn_impl.h, core/elementwise.h) needs beyond C++'s
// + - * /, for a plain float (CPU and GPU) and, in translation units compiled for them, for AVX-512 (__m512) and
// AVX2 (__m256) registers. A formula written once as a template over the lane type then gives the same bits one
// element at a time and 16 or 8 at a time: each lane performs exactly the scalar operations (IEEE +, -, *, /,
// fma, round-to-nearest-even), and GCC's vector extensions give __m512/__m256 the arithmetic operators (a scalar
// operand is broadcast, which is exact). With -ffp-contract=off nothing is fused behind the formula's back.
//
// The vector overloads exist only where __AVX512F__ / __AVX2__ is defined (ref/simd_*.cpp, or a -march=native
// build); nothing outside those files instantiates them (docs/canonical/math.md, "SIMD").
#pragma once

#include "core/hd.h"

#if !defined(__CUDACC__) && ((defined(__AVX2__) && defined(__FMA__)) || defined(__AVX512F__))
#include <immintrin.h>
#endif

namespace olmoref {

// ---- one float, one double ----
OLMOREF_HD inline float lanes_fma(float a, float b, float c) { return hd_fma(a, b, c); }
OLMOREF_HD inline double lanes_fma(double a, double b, double c) { return hd_fma(a, b, c); }
OLMOREF_HD inline float lanes_rint(float x) { return hd_rint(x); }
// A constant in every lane (float constants for float lanes, double constants for double lanes).
template <class V>
OLMOREF_HD inline V lanes_splat(float c);
template <class V>
OLMOREF_HD inline V lanes_splat(double c);
template <>
OLMOREF_HD inline float lanes_splat<float>(float c) { return c; }
template <>
OLMOREF_HD inline double lanes_splat<double>(double c) { return c; }

#if !defined(__CUDACC__) && defined(__AVX512F__)
// ---- 16 floats ----
inline __m512 lanes_fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
inline __m512 lanes_rint(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
template <>
inline __m512 lanes_splat<__m512>(float c) { return _mm512_set1_ps(c); }
inline __m512d lanes_fma(__m512d a, __m512d b, __m512d c) { return _mm512_fmadd_pd(a, b, c); }
template <>
inline __m512d lanes_splat<__m512d>(double c) { return _mm512_set1_pd(c); }
#endif

#if !defined(__CUDACC__) && defined(__AVX2__) && defined(__FMA__)
// ---- 8 floats ----
inline __m256 lanes_fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
inline __m256 lanes_rint(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
template <>
inline __m256 lanes_splat<__m256>(float c) { return _mm256_set1_ps(c); }
inline __m256d lanes_fma(__m256d a, __m256d b, __m256d c) { return _mm256_fmadd_pd(a, b, c); }
template <>
inline __m256d lanes_splat<__m256d>(double c) { return _mm256_set1_pd(c); }
#endif

}  // namespace olmoref
