// ref/moe.h — the mixture-of-experts feed-forward's routing, dispatch and combine, as docs/canonical/moe.md
// defines them. The experts themselves are SwiGLU feed-forwards run by the executor's GEMMs over the dispatched
// rows; everything here is per-row arithmetic on host memory over the plan of core/moe_plan.h, in one fixed order,
// with no atomics.
//
// Shapes: R token rows of one micro-batch (instance-major: row = b·T + t), E experts, k choices per token
// (top_k), d the model width. A "slot" is one (row r, choice j) pair, r·k + j.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/moe_plan.h"
#include "core/op_types.h"

namespace olmoref {

class ThreadPool;

namespace moe {

// Router forward of R rows: logits [R, E] ->
//   scores [R, E]  softmax over the experts (max, det::expf, canonical_sum, divide);
//   lse [R]        log-sum-exp of the logits, max + det::logf(sum), for the router z-loss;
//   top [R, k]     the k experts of highest score in rank order, ties to the lower expert index;
//   weight [R, k]  their scores (OLMo-core's expert weights), or with normalize_p = 1 or 2 (OLMo-core's
//                  normalize_expert_weights) those scores divided by their L1 / L2 norm over the k choices:
//                  n = Σ_j s_j, or sqrtf(Σ_j s_j·s_j), j in rank order.
// The CPU executor's moe_route; the serial steps of a row are core/moe_row.h's, which the CUDA kernel runs too.
void route(const float* logits, int64_t R, int64_t E, int64_t k, float* scores, float* lse, int32_t* top,
           float* weight, ThreadPool* pool, int normalize_p = 0);


// The plan as the executor's MoE ops read it (host memory: the plan's own vectors).
inline MoEDispatch dispatch_of(const Plan& plan) { return {plan.R, plan.k, plan.row_of.data(), plan.position.data()}; }

// gather, combine and scatter_add are the CPU executor's moe_dispatch, moe_combine and moe_scatter_add.
// xg [R·k, d]: position p holds x's row row_of[p].
void gather(const float* x, const MoEDispatch& plan, int64_t d, float* xg, ThreadPool* pool);
// out [R, d]: row r = Σ_j weight[r, j] · y[position(r, j)], one fma chain over j = 0..k-1 from 0.
void combine(const float* y, const float* weight, const MoEDispatch& plan, int64_t d, float* out, ThreadPool* pool);
// Its backward (the CPU executor's moe_combine_backward): dy [R·k, d] at p = position(r, j) = weight[r, j] · dout[r];
// dweight [R, k] = canonical_dot(dout[r], y[p]) over d.
void combine_backward(const float* dout, const float* y, const float* weight, const MoEDispatch& plan, int64_t d,
                      float* dy, float* dweight, ThreadPool* pool);
// dx [R, d] row r = (((dx[r] + dxg[position(r, 0)]) + dxg[position(r, 1)]) + ...), j in order.
void scatter_add(const float* dxg, const MoEDispatch& plan, int64_t d, float* dx, ThreadPool* pool);

// TEST ONLY negative controls (`train --debug-moe-unordered-combine`): the combine and the input-gradient scatter
// as an atomic scatter kernel would order them, each expert's outputs added into their rows as the experts are
// processed (expert-major), not in each row's rank order j. Same values up to rounding, different bits: the
// determinism tests must see the difference.
void combine_unordered_for_test(const float* y, const float* weight, const Plan& plan, int64_t d, float* out);
void scatter_add_unordered_for_test(const float* dxg, const Plan& plan, int64_t d, float* dx);

// The shared expert's combine (OLMo-core MoEBase.forward): out = shared / (k+1) + routed · fl(k/(k+1)), each
// operation rounded; its backward: dshared = dout / (k+1), drouted = dout · fl(k/(k+1)). Elementwise over n.
void shared_combine(const float* shared, const float* routed, int64_t k, float* out, int64_t n, ThreadPool* pool);
void shared_combine_backward(const float* dout, int64_t k, float* dshared, float* drouted, int64_t n, ThreadPool* pool);

// The auxiliary losses of one unit of rows (an instance, or a micro-batch for the local_batch granularity).
// lb_coef = lb weight (already divided by n_layers where configured) · E / k; z_coef = z weight likewise.
// Per instance b with rows [r0, r1) of a unit with counts c [E] over n_unit rows:
//   lb_b = lb_coef · Σ_e c_e · (Σ_{r in b} scores[r, e]) / n_unit      (fp64, r then e in order)
//   z_b  = z_coef · Σ_{r in b} lse_r²                                   (fp64, r in order)
// Both are sums: the step divides them by its global target count N, as the cross-entropy.
double lb_value(const float* scores, int64_t row_begin, int64_t row_end, int64_t E, const std::vector<int64_t>& unit_counts,
                int64_t n_unit, double lb_coef);
double z_value(const float* lse, int64_t row_begin, int64_t row_end, double z_coef);
// ∂(lb / N)/∂scores[r, e] for every row of the unit: fl32(lb_coef · c_e / (n_unit · N)), the products in fp64.
std::vector<float> lb_grad(const std::vector<int64_t>& unit_counts, int64_t n_unit, double lb_coef, int64_t global_n);

// Router backward (the CPU executor's moe_router_backward), row r of a.R: ds = a.lb_grad's row of r's unit + the
// combine's dweight at each chosen expert (with normalize_p, first through the normalisation: ds_j = (dw_j −
// w_j^(p−1)·dot) / n, dot = Σ_j dw_j·w_j in rank order, w the normalised weights); then the softmax backward
// dl_e = s_e · (ds_e − canonical_dot(s, ds)) and the z-loss term + fl32(z_grad · lse_r) · s_e, z_grad =
// fl32(2 · z_coef / N). dlogits [R, E].
void router_backward(const MoERouterBackward& a, float* dlogits, ThreadPool* pool);

}  // namespace moe
}  // namespace olmoref
