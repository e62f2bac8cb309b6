// kernels/attention_exact.h — sliding-window causal GQA attention forward in exact mode (docs/canonical/
// attention.md), one source for the CUDA kernel and its host execution. Backward is not written yet.
//
// One 32-thread block per (instance b, head h, query i), keys j in [lo(i), i]. Thread t takes keys lo+t,
// lo+t+32, ...: each score one fma chain over d from 0, times scale; the row max is the first occurrence of
// the largest score (what the CPU's sequential max gives, ±0 included); e_j = expf(s_j − m) and the
// denominator l is the 32-lane sum with lane = (j − lo) mod 32 and the lane tree; P_j = e_j / l (bf16: rounded).
// Then thread t computes output dims d = t, t+32, ...: one fma chain over j ascending of P_j·v_jd.
// Scores/probabilities go to a scratch row of T floats per block (global memory).
//
// Backward, three kernels in the order of attention.md: (1) a warp per query recomputes P with the forward's
// operations, dP_j (chain over d), D (chain over d, one thread), dS_j = (P_j·(dP_j − D))·scale, the bf16
// roundings, and dq (chain over j per d); P and dS rows are kept in scratch [B·H·T, T]. (2) a block per
// (instance, query head, key j), thread per d: dk_h and dv_h as chains over the queries i = j..hi(j) ascending.
// (3) per KV head the group sum over its query heads in ascending order.
#pragma once

#include <cstdint>

#include "kernels/block.h"
#include "core/bf16.h"
#include "core/hd.h"
#include "core/mathfn_impl.h"

namespace olmoref::kernels {

struct AttentionArgs {
  int64_t B = 0, T = 0, H = 0, KV = 0, hd = 0, window = 0;  // window 0: full causal
  float scale = 1.0f;
  bool bf16 = false;
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // [B·T, H·hd], [B·T, KV·hd] ×2
  float* out = nullptr;                                  // [B·T, H·hd]
  float *row_max = nullptr, *row_sum = nullptr;          // [B, H, T]
  float* scratch = nullptr;                              // [B·H·T, T]: forward scores/P; backward P
  // backward only
  const float* dout = nullptr;                           // [B·T, H·hd]
  float* dq = nullptr;                                   // [B·T, H·hd]
  float *dk = nullptr, *dv = nullptr;                    // [B·T, KV·hd]
  float* scratch_ds = nullptr;                           // [B·H·T, T]
  float *dk_head = nullptr, *dv_head = nullptr;          // [B, H, T, hd]
};

struct AttentionShared {
  float lane[32];
  int64_t first[32];
  float m;
};

// Query row `row` = (b·H + h)·T + i: its instance, heads, key band [lo, i] (n keys) and row widths.
struct QueryRow {
  int64_t i, b, h, g, lo, n, qw, kw;
};
OLMOREF_HD inline QueryRow query_row(const AttentionArgs& a, int64_t row) {
  QueryRow r;
  r.i = row % a.T;
  r.h = (row / a.T) % a.H;
  r.b = row / a.T / a.H;
  r.g = r.h / (a.H / a.KV);
  r.lo = a.window > 0 && r.i - a.window + 1 > 0 ? r.i - a.window + 1 : 0;
  r.n = r.i - r.lo + 1;
  r.qw = a.H * a.hd;
  r.kw = a.KV * a.hd;
  return r;
}

// Key j (0-based from qr.lo) of the query row: the score chain over d from 0, times scale.
OLMOREF_HD inline float attention_score(const AttentionArgs& a, const QueryRow& qr, const float* qi, int64_t j) {
  const float* kj = a.k + (qr.b * a.T + qr.lo + j) * qr.kw + qr.g * a.hd;
  float acc = 0.0f;
  for (int64_t d = 0; d < a.hd; ++d) acc = hd_fma(qi[d], kj[d], acc);
  return acc * a.scale;
}

OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_forward_row(Block& blk, AttentionShared& sh, const AttentionArgs& a, int64_t row) {
  const QueryRow qr = query_row(a, row);
  const int64_t i = qr.i, b = qr.b, h = qr.h, g = qr.g, lo = qr.lo, n = qr.n, qw = qr.qw, kw = qr.kw;
  const float* qi = a.q + (b * a.T + i) * qw + h * a.hd;
  float* s = a.scratch + row * a.T;
  blk.phase([&](int t, auto&) {
    float m = -hd_float(0x7f800000u);
    int64_t first = n;
    for (int64_t j = t; j < n; j += 32) {
      s[j] = attention_score(a, qr, qi, j);
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

// Backward (1): query row `row` = (b·H + h)·T + i.
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_backward_query(Block& blk, AttentionShared& sh, const AttentionArgs& a, int64_t row) {
  const QueryRow qr = query_row(a, row);
  const int64_t i = qr.i, b = qr.b, h = qr.h, g = qr.g, lo = qr.lo, n = qr.n, qw = qr.qw, kw = qr.kw;
  const float* qi = a.q + (b * a.T + i) * qw + h * a.hd;
  const float* doi = a.dout + (b * a.T + i) * qw + h * a.hd;
  const float* oi = a.out + (b * a.T + i) * qw + h * a.hd;
  float* P = a.scratch + row * a.T + lo;  // row i, columns lo..i
  float* dS = a.scratch_ds + row * a.T + lo;
  blk.phase([&](int t, auto&) {
    if (t == 0) {  // D = chain over d of dO_d·o_d
      float acc = 0.0f;
      for (int64_t d = 0; d < a.hd; ++d) acc = hd_fma(doi[d], oi[d], acc);
      sh.m = acc;
    }
  });
  blk.phase([&](int t, auto&) {
    const float m = a.row_max[row], l = a.row_sum[row], D = sh.m;
    for (int64_t j = t; j < n; j += 32) {
      const float* vj = a.v + (b * a.T + lo + j) * kw + g * a.hd;
      float dp = 0.0f;
      for (int64_t d = 0; d < a.hd; ++d) dp = hd_fma(doi[d], vj[d], dp);
      const float p = det::impl::expf(attention_score(a, qr, qi, j) - m) / l;
      const float ds = (p * (dp - D)) * a.scale;
      P[j] = a.bf16 ? round_bf16(p) : p;  // P and dS enter the dq/dk/dv products as bf16 operands
      dS[j] = a.bf16 ? round_bf16(ds) : ds;
    }
  });
  blk.phase([&](int t, auto&) {
    float* dqi = a.dq + (b * a.T + i) * qw + h * a.hd;
    for (int64_t d = t; d < a.hd; d += 32) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) acc = hd_fma(dS[j], a.k[(b * a.T + lo + j) * kw + g * a.hd + d], acc);
      dqi[d] = a.bf16 ? round_bf16(acc) : acc;
    }
  });
}

// Backward (2): key `key` = (b·H + h)·T + j, per query head; thread t takes d = t, t+32, ...
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_backward_key(Block& blk, const AttentionArgs& a, int64_t key) {
  const int64_t j = key % a.T, bh = key / a.T, h = bh % a.H, b = bh / a.H;
  const int64_t hi = a.window > 0 && j + a.window - 1 < a.T - 1 ? j + a.window - 1 : a.T - 1;
  const int64_t qw = a.H * a.hd;
  blk.phase([&](int t, auto&) {
    for (int64_t d = t; d < a.hd; d += 32) {
      float dk = 0.0f, dv = 0.0f;
      for (int64_t i = j; i <= hi; ++i) {
        const int64_t qrow = bh * a.T + i;
        dk = hd_fma(a.scratch_ds[qrow * a.T + j], a.q[(b * a.T + i) * qw + h * a.hd + d], dk);
        dv = hd_fma(a.scratch[qrow * a.T + j], a.dout[(b * a.T + i) * qw + h * a.hd + d], dv);
      }
      a.dk_head[key * a.hd + d] = a.bf16 ? round_bf16(dk) : dk;
      a.dv_head[key * a.hd + d] = a.bf16 ? round_bf16(dv) : dv;
    }
  });
}

// Backward (3): element e of dk/dv [B·T, KV·hd]: the group's query heads in ascending order.
OLMOREF_HD inline void attention_group_sum(const AttentionArgs& a, int64_t e) {
  const int64_t kw = a.KV * a.hd, r = e / kw, g = (e % kw) / a.hd, d = e % a.hd, b = r / a.T, t = r % a.T;
  const int64_t group = a.H / a.KV;
  float sk = 0.0f, sv = 0.0f;
  for (int64_t hh = 0; hh < group; ++hh) {
    const int64_t src = ((b * a.H + g * group + hh) * a.T + t) * a.hd + d;
    sk = hh == 0 ? a.dk_head[src] : sk + a.dk_head[src];
    sv = hh == 0 ? a.dv_head[src] : sv + a.dv_head[src];
  }
  a.dk[e] = a.bf16 ? round_bf16(sk) : sk;
  a.dv[e] = a.bf16 ? round_bf16(sv) : sv;
}

void attention_forward_host(const AttentionArgs& a);
void attention_backward_host(const AttentionArgs& a);
void attention_backward_device(const AttentionArgs& a);
void attention_forward_device(const AttentionArgs& a);

}  // namespace olmoref::kernels
