// tests/kernels/case_loops.h — the case loops of the doctest programs that compare executors op by op
// (tests/kernels/test_decomposition.cpp, tests/ref/test_fused.cpp): each case's sizes are CAPTUREd for the failure
// message and its operands made from the seed every such test uses. (tests/gpu is no doctest program: it loops itself.)
#pragma once

#include <doctest.h>

#include <cstdint>

#include "tests/kernels/attention_cases.h"
#include "tests/kernels/norm_cases.h"

namespace olmoref::testing {

// fn(case, q/k/v operands) for every attention case (or every one of `cases`).
template <class Fn>
void for_each_attention_case(const Fn& fn, const std::vector<AttentionCase>& cases = attention_cases()) {
  for (const AttentionCase& c : cases) {
    CAPTURE(c.T);
    CAPTURE(c.H);
    CAPTURE(c.KV);
    CAPTURE(c.hd);
    CAPTURE(c.window);
    CAPTURE(c.bf16);
    CAPTURE(c.docs);
    fn(c, attention_operands(c, static_cast<uint32_t>(c.T * 7 + c.hd)));
  }
}

// fn(case, operands) for every fused-RMSNorm case, the operands rounded to bf16 when bf16.
template <class Fn>
void for_each_fused_norm_case(bool bf16, const Fn& fn) {
  for (const NormCase& c : norm_cases()) {
    CAPTURE(c.R);
    CAPTURE(c.n);
    fn(c, fused_operands(c.R, c.n, static_cast<uint32_t>(c.R * 100 + c.n), bf16));
  }
}

// fn(case, operands) for every RMSNorm + RoPE case, the operands rounded to bf16 when bf16.
template <class Fn>
void for_each_fused_rope_norm_case(bool bf16, const Fn& fn) {
  for (const RopeNormCase& c : rope_norm_cases()) {
    CAPTURE(c.R);
    CAPTURE(c.n_heads);
    CAPTURE(c.hd);
    fn(c, fused_operands(c.R, c.n(), static_cast<uint32_t>(c.R + 7 * c.hd), bf16));
  }
}

}  // namespace olmoref::testing
