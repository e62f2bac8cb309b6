// core/reduce.h — the canonical row reduction (docs/canonical/reductions.md).
//
// A long sum over n terms t_0..t_{n-1} is evaluated in exactly one way:
//   1. 32 lanes: lane j accumulates t_j, t_{j+32}, t_{j+64}, ... in order, starting from 0
//      (for products the accumulation is a fused multiply-add: lane = fma(a_i, b_i, lane));
//   2. a fixed pairwise tree over the lanes: for w = 16, 8, 4, 2, 1: lane[j] = lane[j] + lane[j+w].
// The lane count matches a CUDA warp and two AVX-512 registers, so every executor can follow it
// without shuffling data. Used for RMSNorm's sum of squares, softmax denominators, log-sum-exp over
// the vocabulary, and the fp64 scalar totals (loss, gradient norm).
#pragma once

#include <cmath>
#include <cstdint>

namespace olmoref {

inline constexpr int kReduceLanes = 32;

template <typename T>
inline T lane_tree(T* lane) {
  for (int w = kReduceLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] = lane[j] + lane[j + w];
  return lane[0];
}

// sum_i x[i] in T's arithmetic: the 32 lanes in order, then the tree.
template <typename T>
inline T lane_sum(const T* x, int64_t n) {
  T lane[kReduceLanes] = {};
  int64_t i = 0;
  for (; i + kReduceLanes <= n; i += kReduceLanes)
    for (int j = 0; j < kReduceLanes; ++j) lane[j] = lane[j] + x[i + j];
  for (int j = 0; i + j < n; ++j) lane[j] = lane[j] + x[i + j];
  return lane_tree(lane);
}

// sum_i x[i]
inline float canonical_sum(const float* x, int64_t n) { return lane_sum(x, n); }

// sum_i a[i] * b[i], each lane a fused multiply-add chain.
inline float canonical_dot(const float* a, const float* b, int64_t n) {
  float lane[kReduceLanes] = {};
  int64_t i = 0;
  for (; i + kReduceLanes <= n; i += kReduceLanes)
    for (int j = 0; j < kReduceLanes; ++j) lane[j] = std::fma(a[i + j], b[i + j], lane[j]);
  for (int j = 0; i + j < n; ++j) lane[j] = std::fma(a[i + j], b[i + j], lane[j]);
  return lane_tree(lane);
}

// sum_i x[i]^2 accumulated in fp64 (for whole-model scalars such as the gradient norm).
inline double canonical_sumsq_f64(const float* x, int64_t n) {
  double lane[kReduceLanes] = {};
  int64_t i = 0;
  for (; i + kReduceLanes <= n; i += kReduceLanes)
    for (int j = 0; j < kReduceLanes; ++j) {
      const double v = x[i + j];
      lane[j] = std::fma(v, v, lane[j]);
    }
  for (int j = 0; i + j < n; ++j) {
    const double v = x[i + j];
    lane[j] = std::fma(v, v, lane[j]);
  }
  return lane_tree(lane);
}

// sum_i x[i] in fp64, for per-token loss terms.
inline double canonical_sum_f64(const double* x, int64_t n) { return lane_sum(x, n); }

// The chain used by every contraction that is a matrix product in disguise (attention scores,
// P·V, head-dim dots): one fma chain in index order from 0, exactly ref/gemm.h's contract.
inline float chain_dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(a[i], b[i], acc);
  return acc;
}

}  // namespace olmoref
