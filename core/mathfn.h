// core/mathfn.h — the project's own portable math functions.
//
// Why: libm's expf/logf/sinf differ between glibc versions, CPUs and CUDA's libdevice, so the same
// formula would give different bits on different executors. Every function here is built only from
// IEEE-754 +, -, *, /, sqrt, explicit fma, round-to-integer and exponent-bit manipulation, all of
// which are exactly specified; given the same inputs it returns the same bits on every CPU and on the
// GPU (kernels/ mirrors this file). docs/canonical/math.md states the algorithms.
#pragma once

#include <cstdint>
#include <cstring>

namespace olmoref::det {

// ---- fp32, hot paths (softmax, SiLU, cross-entropy) ----
float expf(float x);            // ~1 ulp; 0 below -87.5 (denormal results are flushed to 0 by definition)
float logf(float x);            // via the fp64 log, rounded once
float sigmoidf(float x);        // 1 / (1 + expf(-x))
float siluf(float x);           // x * sigmoidf(x), written as x / (1 + expf(-x))

// ---- fp64, setup paths (RoPE tables, initialisation, schedules) ----
double exp(double x);           // |rel err| < 2e-16
double log(double x);           // x > 0
double sin(double x);           // |x| < 2^20
double cos(double x);
double pow(double base, double e);  // base > 0, as exp(e * log(base))

inline uint32_t bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float from_bits(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }
inline uint64_t bits(double x) { uint64_t u; std::memcpy(&u, &x, 8); return u; }

}  // namespace olmoref::det
