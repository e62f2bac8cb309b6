// core/bf16.h — bfloat16 rounding and the precision switch (docs/canonical/bf16.md).
//
// bf16 values are kept in fp32 storage: a "bf16 tensor" is an fp32 array whose every element is exactly
// representable in bfloat16 (the low 16 bits of its pattern are zero). Rounding to bf16 is IEEE
// round-to-nearest-even on the 16 dropped bits, as PyTorch's `tensor.to(torch.bfloat16)` does
// (c10::BFloat16 round_to_nearest_even); widening back to fp32 is exact. Because every kernel already
// computes in fp32 on fp32 storage, "fp32 accumulation over bf16 inputs" is the fp32 kernel fed with
// bf16-valued operands, and "output rounded to bf16" is one round_bf16 pass over the result.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/hd.h"
#include "core/parallel.h"

namespace olmoref {

// fp32: every tensor fp32 (parity with other frameworks in fp32). bf16: the Olmo 3 recipe — fp32 master
// weights and optimizer, bf16 parameter copies, activations and activation/parameter gradients, fp32
// norm/RoPE/softmax/loss math (docs/canonical/bf16.md lists every rounding point).
enum class Precision { fp32, bf16 };

inline Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  throw std::invalid_argument("config key 'train.precision': must be \"fp32\" or \"bf16\" (got \"" + s + "\")");
}
inline const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

// The bf16 bit pattern nearest to x, ties to even. NaN (any sign or payload) becomes the positive quiet
// NaN 0x7FC0, as in PyTorch; ±inf stay ±inf; finite values beyond the largest bf16 round to ±inf exactly
// as IEEE rounding does (the carry runs into the exponent); subnormals round like normal numbers.
// OLMOREF_HD: the CUDA kernels round with these very functions.
OLMOREF_HD inline uint16_t bf16_bits(float x) {
  uint32_t u = hd_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The fp32 value of a bf16 pattern (exact).
OLMOREF_HD inline float bf16_to_float(uint16_t b) { return hd_float(static_cast<uint32_t>(b) << 16); }

// x rounded to the nearest bf16, returned as fp32.
OLMOREF_HD inline float round_bf16(float x) { return bf16_to_float(bf16_bits(x)); }

// Rounds x[0..n) to bf16 in place (elementwise: no order, any threading gives the same bits).
inline void round_bf16_inplace(float* x, int64_t n, ThreadPool* pool) {
  auto body = [x](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = round_bf16(x[i]);
  };
  if (pool) pool->parallel_for(n, 1 << 14, body); else body(0, n);
}

// out[i] = round_bf16(in[i]).
inline void copy_round_bf16(const float* in, float* out, int64_t n, ThreadPool* pool) {
  auto body = [in, out](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = round_bf16(in[i]);
  };
  if (pool) pool->parallel_for(n, 1 << 14, body); else body(0, n);
}

}  // namespace olmoref
