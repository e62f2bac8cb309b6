// kernels/attention_exact.h — sliding-window causal GQA attention forward in exact mode (docs/canonical/
// attention.md), one source for the CUDA kernel and its host execution. Backward is not written yet.
//
// One 32-thread block per (instance b, head h, query i), keys j in [lo(i), i]. Thread t takes keys lo+t,
// lo+t+32, ...: each score one fma chain over d from 0, times scale; the row max is the first occurrence of
// the largest score (what the CPU's sequential max gives, ±0 included); e_j = expf(s_j − m) and the
// denominator l is the 32-lane sum with lane = (j − lo) mod 32 and the lane tree; P_j = e_j / l (bf16: rounded).
// Then thread t computes output dims d = t, t+32, ...: one fma chain over j ascending of P_j·v_jd.
// Scores/probabilities go to a scratch row of `scratch_stride` floats per block (global memory).
#pragma once

#include <cstdint>

#include "kernels/block.h"
#include "ref/bf16.h"
#include "ref/hd.h"
#include "ref/mathfn_impl.h"

namespace olmoref::kernels {

struct AttentionArgs {
  int64_t B = 0, T = 0, H = 0, KV = 0, hd = 0, window = 0;  // window 0: full causal
  float scale = 1.0f;
  bool bf16 = false;
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // [B·T, H·hd], [B·T, KV·hd] ×2
  float* out = nullptr;                                  // [B·T, H·hd]
  float *row_max = nullptr, *row_sum = nullptr;          // [B, H, T]
  float* scratch = nullptr;                              // [B·H·T, T]
};

struct AttentionShared {
  float lane[32];
  int64_t first[32];
  float m;
};

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Block>
OLMOREF_HD void attention_forward_row(Block& blk, AttentionShared& sh, const AttentionArgs& a, int64_t row) {
  const int64_t i = row % a.T, bh = row / a.T, h = bh % a.H, b = bh / a.H, g = h / (a.H / a.KV);
  const int64_t lo = a.window > 0 && i - a.window + 1 > 0 ? i - a.window + 1 : 0, n = i - lo + 1;
  const int64_t qw = a.H * a.hd, kw = a.KV * a.hd;
  const float* qi = a.q + (b * a.T + i) * qw + h * a.hd;
  float* s = a.scratch + row * a.T;
  blk.phase([&](int t, auto&) {
    float m = -hd_float(0x7f800000u);
    int64_t first = n;
    for (int64_t j = t; j < n; j += 32) {
      const float* kj = a.k + (b * a.T + lo + j) * kw + g * a.hd;
      float acc = 0.0f;
      for (int64_t d = 0; d < a.hd; ++d) acc = hd_fma(qi[d], kj[d], acc);
      s[j] = acc * a.scale;
      if (m < s[j]) m = s[j], first = j;
    }
    sh.lane[t] = m;
    sh.first[t] = first;
  });
  blk.phase([&](int t, auto&) {
    if (t != 0) return;
    float m = -hd_float(0x7f800000u);
    int64_t first = n;
    for (int j = 0; j < 32; ++j)
      if (m < sh.lane[j] || (m == sh.lane[j] && sh.first[j] < first)) m = sh.lane[j], first = sh.first[j];
    sh.m = first < n ? s[first] : m;  // the score itself, with its sign of zero
  });
  blk.phase([&](int t, auto&) {
    float acc = 0.0f;
    for (int64_t j = t; j < n; j += 32) {
      s[j] = det::impl::expf(s[j] - sh.m);
      acc = acc + s[j];
    }
    sh.lane[t] = acc;
  });
  lane_tree_phases(blk, sh.lane);
  blk.phase([&](int t, auto&) {
    const float l = sh.lane[0];
    for (int64_t j = t; j < n; j += 32) s[j] = a.bf16 ? round_bf16(s[j] / l) : s[j] / l;
    if (t == 0) a.row_max[row] = sh.m, a.row_sum[row] = l;
  });
  blk.phase([&](int t, auto&) {
    float* oi = a.out + (b * a.T + i) * qw + h * a.hd;
    for (int64_t d = t; d < a.hd; d += 32) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) acc = hd_fma(s[j], a.v[(b * a.T + lo + j) * kw + g * a.hd + d], acc);
      oi[d] = acc;
    }
  });
}

void attention_forward_host(const AttentionArgs& a);
void attention_forward_device(const AttentionArgs& a);

}  // namespace olmoref::kernels
