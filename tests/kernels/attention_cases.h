// tests/kernels/attention_cases.h — attention shapes shared by the host-decomposition and GPU tests: GQA,
// window 1, a window longer than the sequence, full causal, odd head dims, head dims past one staged chunk of 128,
// one-token sequences, bf16.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/attention_exact.h"
#include "core/bf16.h"
#include "ref/ops.h"

namespace olmoref::testing {

struct AttentionCase {
  int64_t B, T, H, KV, hd, window;
  bool bf16;
};
inline std::vector<AttentionCase> attention_cases() {
  return {{1, 1, 1, 1, 4, 0, false},   {2, 37, 4, 2, 8, 1, false},  {1, 37, 4, 2, 8, 50, false},
          {2, 40, 4, 4, 6, 16, false}, {1, 70, 6, 2, 5, 0, false},  {1, 45, 4, 2, 8, 16, true},
          {1, 33, 2, 1, 40, 7, false},  {1, 40, 2, 1, 136, 9, false}, {1, 35, 2, 2, 160, 0, true}};
}
// Sequences past a thousand keys, more query rows than the kernels' blocks in flight: full causal fp32, GQA with a
// window and bf16.
inline std::vector<AttentionCase> long_attention_cases() {
  return {{1, 1100, 4, 2, 8, 0, false}, {1, 1100, 4, 1, 16, 300, true}};
}
struct AttentionOperands {
  std::vector<float> q, k, v;
};
inline AttentionOperands attention_operands(const AttentionCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  AttentionOperands o;
  auto fill = [&](std::vector<float>& x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x.push_back(c.bf16 ? round_bf16(nd(rng)) : nd(rng));
  };
  fill(o.q, c.B * c.T * c.H * c.hd);
  fill(o.k, c.B * c.T * c.KV * c.hd);
  fill(o.v, c.B * c.T * c.KV * c.hd);
  return o;
}
inline AttentionShape attention_shape(const AttentionCase& c) {
  AttentionShape s{c.B, c.T, c.H, c.KV, c.hd, c.window, 1.0f / std::sqrt(static_cast<float>(c.hd))};
  s.precision = c.bf16 ? Precision::bf16 : Precision::fp32;
  return s;
}

// The kernel arguments of a case (shape fields only; the caller sets the pointers).
inline kernels::AttentionArgs attention_args(const AttentionCase& c) {
  kernels::AttentionArgs a;
  a.B = c.B, a.T = c.T, a.H = c.H, a.KV = c.KV, a.hd = c.hd, a.window = c.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  a.bf16 = c.bf16;
  return a;
}

}  // namespace olmoref::testing
