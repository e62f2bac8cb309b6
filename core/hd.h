// core/hd.h — code that compiles for the CPU (g++) and the GPU (nvcc) from one source.
//
// The arithmetic of every CUDA kernel lives in OLMOREF_HD functions shared with the CPU side, so the bits
// are defined once (docs/canonical/). Only IEEE-754 operations with one specified rounding appear in them:
// +, -, *, /, sqrt (nvcc: -prec-div=true -prec-sqrt=true), and fma written out as hd_fma.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OLMOREF_HD __host__ __device__
#else
#define OLMOREF_HD
#endif
// Before a loop whose bounds are constants, where a register array is indexed by the loop variable: unrolled in
// device code, the array stays in registers instead of the stack. Order and arithmetic are unchanged. (The host
// compiler, nvcc's host pass included, does not know the pragma.)
#if defined(__CUDA_ARCH__)
#define OLMOREF_UNROLL _Pragma("unroll")
#else
#define OLMOREF_UNROLL
#endif

#include <cmath>

namespace olmoref {

OLMOREF_HD inline float hd_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
OLMOREF_HD inline double hd_fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
// IEEE square root (nvcc: -prec-sqrt=true).
OLMOREF_HD inline float hd_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}
// Round to the nearest integer, ties to even (the default rounding mode; never changed by olmoref).
OLMOREF_HD inline float hd_rint(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
OLMOREF_HD inline double hd_rint(double x) {
#if defined(__CUDA_ARCH__)
  return rint(x);
#else
  return std::nearbyint(x);
#endif
}
OLMOREF_HD inline uint32_t hd_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
OLMOREF_HD inline float hd_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
OLMOREF_HD inline uint64_t hd_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
#endif
}
OLMOREF_HD inline double hd_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, 8);
  return x;
#endif
}

}  // namespace olmoref
