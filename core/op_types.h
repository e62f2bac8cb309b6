// core/op_types.h — the shapes and results the op table (core/executor.h) passes, shared by both executors.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace olmoref {

// Causal (sliding-window) attention with GQA.
// q: [B*T, H*hd], k, v: [B*T, KV*hd] (after QK-norm and RoPE), out: [B*T, H*hd].
// window: keys per query counting the query itself (0 = full causal).
// Saves the softmax row max and denominator: row_max, row_sum [B, H, T].
struct AttentionShape {
  int64_t B, T, H, KV, hd, window;
  float scale;  // 1/sqrt(hd)
  // bf16: q, k, v, dout are bf16-valued; P and dS are rounded to bf16 as matmul operands, dq/dk/dv are
  // rounded to bf16 (docs/canonical/bf16.md). The caller rounds `out`. fp32: none of this happens.
  Precision precision = Precision::fp32;
};

// A mixture-of-experts dispatch plan (core/moe_plan.h Plan) as the MoE ops read it, in executor memory: R token
// rows, k choices each, S = R·k slots in (expert, row) order (docs/canonical/moe.md).
struct MoEDispatch {
  int64_t R = 0, k = 0;
  const int64_t* row_of = nullptr;    // [S]: the token row of position p
  const int64_t* position = nullptr;  // [S]: the position of slot r·k + j
};

// The routed part's share in OLMo-core's shared-expert mix, fl32(k/(k+1)) (the division in fp64).
inline float moe_routed_share(int64_t k) { return static_cast<float>(static_cast<double>(k) / static_cast<double>(k + 1)); }

// The loss totals of one instance (or micro-batch), fp64, before the division by the step's target count.
struct LossSums {
  double ce = 0.0, z = 0.0;
  int64_t n_targets = 0;
  // Mixture of experts: the weighted load-balancing and router z-loss sums (docs/canonical/moe.md), 0 when dense.
  double moe_lb = 0.0, moe_z = 0.0;
};

}  // namespace olmoref
