// kernels/loss_exact.h — cross-entropy + z-loss (docs/canonical/loss.md) and the fp64 gradient-norm chunks
// (docs/canonical/step.md) in exact mode, one source for the CUDA kernels and their host execution.
//
// Loss: one warp-sized block per row of logits [R, V]. Lane j takes the vocabulary entries j, j+32, ...:
// their max (order-free), then e_v = expf(x_v − m) in place and the lane sums, the 32-lane tree, and each lane
// writes its entries' gradient. Thread 0 writes the row's fp64 terms; instance totals are the 32-lane fp64 sum
// of an instance's T row terms (one block per instance). Norm chunks: one block per chunk of 65,536 floats,
// lanes summing fma(g, g) in fp64.
#pragma once

#include <cstdint>

#include "kernels/block.h"
#include "core/hd.h"
#include "core/mathfn_impl.h"

namespace olmoref::kernels {

struct LossArgs {
  // R rows, the first at position t0 of its instance: whole instances (t0 = 0, R = instances · T), or a run of rows
  // of one instance (t0 + R <= T) when the head works in row chunks.
  int64_t R = 0, T = 0, V = 0, t0 = 0;
  float* logits = nullptr;      // [R, V], replaced by ∂loss/∂logits
  const uint32_t* tokens = nullptr;  // from the first row's instance start; row r's target is tokens[t0 + r + 1]
  float z_coef = 0.0f;
  int64_t global_n_targets = 1;
  double* ce_terms = nullptr;   // [R]
  double* z_terms = nullptr;    // [R]
  double* ce_total = nullptr;   // [R / T]: per instance, whole instances only; nullptr: no totals
  double* z_total = nullptr;
};

struct LossShared {
  float lane[32];
  double lane64[32];
};

OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void cross_entropy_row(Block& blk, LossShared& sh, const LossArgs& a, int64_t row) {
  float* x = a.logits + row * a.V;
  const int64_t t_pos = (a.t0 + row) % a.T;
  if (t_pos == a.T - 1) {  // no target: a zero gradient row and zero terms
    blk.phase([&](int t, auto&) {
      for (int64_t v = t; v < a.V; v += 32) x[v] = 0.0f;
      if (t == 0) a.ce_terms[row] = 0.0, a.z_terms[row] = 0.0;
    });
    return;
  }
  const int64_t y = a.tokens[a.t0 + row + 1];
  blk.phase([&](int t, auto&) {  // lane maxima (order-free: max ignores the order of its operands)
    float m = -hd_float(0x7f800000u);
    for (int64_t v = t; v < a.V; v += 32) m = m < x[v] ? x[v] : m;
    sh.lane[t] = m;
  });
  blk.phase([&](int t, auto&) {
    if (t == 0) {
      float m = sh.lane[0];
      for (int j = 1; j < 32; ++j) m = m < sh.lane[j] ? sh.lane[j] : m;
      sh.lane64[0] = static_cast<double>(m);  // the row max, kept exactly
      sh.lane64[1] = static_cast<double>(x[y]);
    }
  });
  blk.phase([&](int t, auto&) {
    const float m = static_cast<float>(sh.lane64[0]);
    float acc = 0.0f;
    for (int64_t v = t; v < a.V; v += 32) {
      x[v] = det::impl::expf(x[v] - m);
      acc = acc + x[v];
    }
    sh.lane[t] = acc;
  });
  lane_tree_phases(blk, sh.lane);
  blk.phase([&](int t, auto&) {
    const float m = static_cast<float>(sh.lane64[0]), xy = static_cast<float>(sh.lane64[1]);
    const float S = sh.lane[0];
    const float lse = m + det::impl::logf(S);
    const float inv_n = 1.0f / static_cast<float>(a.global_n_targets);
    const float coef = 1.0f + 2.0f * a.z_coef * lse;
    if (t == 0) {
      a.ce_terms[row] = static_cast<double>(lse - xy);
      a.z_terms[row] = static_cast<double>(a.z_coef) * static_cast<double>(lse) * static_cast<double>(lse);
    }
    for (int64_t v = t; v < a.V; v += 32)
      x[v] = v == y ? ((x[v] / S) * coef - 1.0f) * inv_n : ((x[v] / S) * coef) * inv_n;
  });
}

// Instance b's totals: 32 fp64 lanes over its T row terms, then the lane tree.
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void loss_instance_totals(Block& blk, LossShared& sh, const LossArgs& a, int64_t b) {
  for (int which = 0; which < 2; ++which) {
    const double* terms = (which == 0 ? a.ce_terms : a.z_terms) + b * a.T;
    blk.phase([&](int t, auto&) {
      double acc = 0.0;
      for (int64_t r = t; r < a.T; r += 32) acc = acc + terms[r];
      sh.lane64[t] = acc;
    });
    lane_tree_phases(blk, sh.lane64);
    blk.phase([&](int t, auto&) {
      if (t == 0) (which == 0 ? a.ce_total : a.z_total)[b] = sh.lane64[0];
    });
  }
}

// One fp64 total per chunk c of a flat float vector [0, n) (chunk = 65,536 floats): 32 lanes, lane t folding
// elements lo + t, lo + t + 32, ... with `fold`, then the lane tree. Shared by the gradient norm and the zero count.
OLMOREF_BLOCK_BODY
template <class Block, class Fold>
OLMOREF_HD void chunk_lane_total(Block& blk, LossShared& sh, const float* x, int64_t n, int64_t chunk, double* out,
                                 int64_t c, Fold fold) {
  const int64_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
  blk.phase([&](int t, auto&) {
    double acc = 0.0;
    for (int64_t i = lo + t; i < hi; i += 32) acc = fold(acc, x[i]);
    sh.lane64[t] = acc;
  });
  lane_tree_phases(blk, sh.lane64);
  blk.phase([&](int t, auto&) {
    if (t == 0) out[c] = sh.lane64[0];
  });
}

// Σ g² of chunk c of the flat gradient: 32 fp64 fma lanes and the lane tree.
struct NormChunkArgs {
  const float* grad = nullptr;
  int64_t n = 0, chunk = 65536;
  double* out = nullptr;  // [chunks]
};
struct SumOfSquares {
  OLMOREF_HD double operator()(double acc, float g) const { return hd_fma(double(g), double(g), acc); }
};
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void grad_norm_chunk(Block& blk, LossShared& sh, const NormChunkArgs& a, int64_t c) {
  chunk_lane_total(blk, sh, a.grad, a.n, a.chunk, a.out, c, SumOfSquares{});
}

// Zeros of chunk c of x (Megatron's num-zeros of the clipped gradient; -0 counts, NaN does not). Counts are
// integers below 2^53, exact in fp64, so neither the lanes nor the tree can change the total.
struct ZeroCountArgs {
  const float* x = nullptr;
  int64_t n = 0, chunk = 65536;
  double* out = nullptr;  // [chunks]
};
struct CountZeros {
  OLMOREF_HD double operator()(double acc, float x) const { return acc + (x == 0.0f ? 1.0 : 0.0); }
};
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void zero_count_chunk(Block& blk, LossShared& sh, const ZeroCountArgs& a, int64_t c) {
  chunk_lane_total(blk, sh, a.x, a.n, a.chunk, a.out, c, CountZeros{});
}

void cross_entropy_host(const LossArgs& a);  // rows, then per-instance totals (when asked for)
void cross_entropy_device(const LossArgs& a);
void grad_norm_chunks_host(const NormChunkArgs& a);
void grad_norm_chunks_device(const NormChunkArgs& a);
void zero_count_chunks_host(const ZeroCountArgs& a);
void zero_count_chunks_device(const ZeroCountArgs& a);

}  // namespace olmoref::kernels
