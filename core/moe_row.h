// core/moe_row.h — the serial per-row steps of the mixture of experts' routing and router backward
// (docs/canonical/moe.md), OLMOREF_HD so that ref/moe.cpp (the CPU definition) and kernels/moe_exact.h (the CUDA
// kernel and its host execution) run one source: the row max, the top-k scans, the weights' normalisation and the
// gradient through it. The reductions over E around them are the canonical 32-lane sums, which each executor
// spreads its own way (core/reduce.h on the CPU, a warp and its tree in kernels/moe_exact.h).
//
// Shapes, for one row: E experts, k choices; scores s [E], top [k] (expert indices in rank order), weight w [k].
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace olmoref::moe_row {

// max over l [E] scanned in index order: with equal values (+0 and -0) the first stays, so the bits of the max, and
// of everything computed from it, do not depend on how another executor would split the scan.
OLMOREF_HD inline float row_max(const float* l, int64_t E) {
  float m = l[0];
  for (int64_t e = 1; e < E; ++e) m = l[e] > m ? l[e] : m;
  return m;
}

// top [k], weight [k] = the k highest of s [E] by repeated scans: strictly greater wins, so of equal scores the lower
// expert index ranks first. O(E·k²) per row, which is nothing at router widths (E ≤ a few hundred, k ≤ 8).
OLMOREF_HD inline void select_top_k(const float* s, int64_t E, int64_t k, int32_t* top, float* weight) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || top[i] == e;
      if (taken) continue;
      if (best < 0 || s[e] > s[best]) best = e;
    }
    top[j] = static_cast<int32_t>(best);
    weight[j] = s[best];
  }
}

// n of the chosen scores s[top[j]] for normalize_p 1 (Σ_j s) or 2 (sqrtf(Σ_j s·s)), j in rank order.
OLMOREF_HD inline float chosen_norm(const float* s, const int32_t* top, int64_t k, int normalize_p) {
  float acc = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    const float v = s[top[j]];
    acc = normalize_p == 1 ? acc + v : acc + v * v;
  }
  return normalize_p == 1 ? acc : hd_sqrt(acc);
}

// weight [k] = s[top[j]] / n (OLMo-core's normalize_expert_weights); normalize_p 0 leaves the scores.
OLMOREF_HD inline void normalize_weights(const float* s, const int32_t* top, int64_t k, int normalize_p, float* weight) {
  if (normalize_p == 0) return;
  const float n = chosen_norm(s, top, k, normalize_p);
  for (int64_t j = 0; j < k; ++j) weight[j] = weight[j] / n;
}

// ds [E] += the combine's ∂weight dw [k] at each chosen expert, first through the normalisation when there is one:
// w_j = s_j / n gives ∂L/∂s_j = (dw_j − w_j^(p−1) · dot) / n, dot = Σ_i dw_i·w_i in rank order (w the normalised
// weights). The k experts are distinct, so each slot of ds takes exactly one addition.
OLMOREF_HD inline void add_chosen_grad(const float* s, const int32_t* top, const float* w, const float* dw, int64_t k,
                                       int normalize_p, float* ds) {
  if (normalize_p == 0) {
    for (int64_t j = 0; j < k; ++j) ds[top[j]] = ds[top[j]] + dw[j];
    return;
  }
  const float n = chosen_norm(s, top, k, normalize_p);
  float dot = 0.0f;
  for (int64_t j = 0; j < k; ++j) dot = dot + dw[j] * w[j];
  for (int64_t j = 0; j < k; ++j) ds[top[j]] = ds[top[j]] + (dw[j] - (normalize_p == 1 ? dot : w[j] * dot)) / n;
}

// ∂logit_e from the softmax backward s_e · (ds_e − dot), dot = canonical_dot(s, ds) over the row, and the z-loss term
// zl · s_e, zl = fl32(z_grad · lse_r); without a z-loss (z_grad 0) the term is not added at all, so a -0 stays -0.
OLMOREF_HD inline float logit_grad(float s, float ds, float dot, float zl, float z_grad) {
  const float soft = s * (ds - dot);
  return z_grad != 0.0f ? soft + zl * s : soft;
}

}  // namespace olmoref::moe_row
