// core/op_types.h — the shapes and results the op table (core/executor.h) passes, shared by both executors.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

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
  // Intra-document masking (docs/canonical/documents.md): each position's document's first and last position, [B, T]
  // in the executor's memory (core/attention_band.h reads them); null: one document per instance.
  const int32_t* doc_start = nullptr;
  const int32_t* doc_end = nullptr;
  // Context parallelism: the part of each instance this call computes, in absolute positions (every tensor stays
  // [B, T, ...]; nothing outside the part is written). Forward: out and the row statistics of queries [q_begin,
  // q_end), reading those queries and the keys and values of their bands. Backward: dq of those queries and dk, dv of
  // keys [k_begin, k_end), reading q, out, dout and the statistics of the queries attention_backward_queries names
  // (core/attention_band.h) and the keys and values of their bands. Other rows may be loaded, never used. An end of
  // -1 is T: the defaults are the whole instance. Every value written has the bits the whole-instance call gives it:
  // no chain of docs/canonical/attention.md runs from one query (or key) to another.
  int64_t q_begin = 0, q_end = -1;
  int64_t k_begin = 0, k_end = -1;
  int64_t query_end() const { return q_end < 0 ? T : q_end; }
  int64_t key_end() const { return k_end < 0 ? T : k_end; }
};

// Throws std::invalid_argument when the shape's queries or keys (q_begin .. k_end) leave the instance's positions.
inline void check_attention_parts(const AttentionShape& s) {
  const auto inside = [&](int64_t begin, int64_t end) { return 0 <= begin && begin <= end && end <= s.T; };
  if (!inside(s.q_begin, s.query_end()) || !inside(s.k_begin, s.key_end()))
    throw std::invalid_argument("attention: the queries [" + std::to_string(s.q_begin) + ", " +
                                std::to_string(s.query_end()) + ") and keys [" + std::to_string(s.k_begin) + ", " +
                                std::to_string(s.key_end()) + ") computed must lie in the instance's " +
                                std::to_string(s.T) + " positions");
}

// A mixture-of-experts dispatch plan (core/moe_plan.h Plan) as the MoE ops read it, in executor memory: R token
// rows, k choices each, S = R·k slots in (expert, row) order (docs/canonical/moe.md).
struct MoEDispatch {
  int64_t R = 0, k = 0;
  const int64_t* row_of = nullptr;    // [S]: the token row of position p
  const int64_t* position = nullptr;  // [S]: the position of slot r·k + j
};

// The router backward's operands (docs/canonical/moe.md), executor memory: the forward's routing of R rows over E
// experts with k choices, the combine's ∂weight, and the load-balancing loss's gradient per unit of rows, which is
// one row of E values for each instance (lb granularity "instance": lb_rows = T) or for the micro-batch ("local_batch":
// lb_rows = R), so only [R / lb_rows, E] floats of it are made on the host.
struct MoERouterBackward {
  int64_t R = 0, E = 0, k = 0;
  int normalize_p = 0;              // 0, 1 or 2: as the forward's moe_route normalised the weights
  const float* scores = nullptr;    // [R, E]  softmax of the router logits
  const float* lse = nullptr;       // [R]     log-sum-exp of the router logits
  const int32_t* top = nullptr;     // [R, k]  chosen experts, rank order
  const float* weight = nullptr;    // [R, k]  their (normalised) weights
  const float* dweight = nullptr;   // [R, k]  ∂loss/∂weight from moe_combine_backward
  const float* lb_grad = nullptr;   // [R / lb_rows, E]: row r reads row r / lb_rows
  int64_t lb_rows = 1;
  float z_grad = 0.0f;              // fl32(2 · z_coef / N); 0 without a router z-loss
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
