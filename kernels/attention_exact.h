// kernels/attention_exact.h — sliding-window causal GQA attention in exact mode (docs/canonical/attention.md), one
// source for the CUDA kernels and their host execution.
//
// Forward: a fixed grid of 32-thread blocks strides over the query rows (b, h, i), keys j in [lo(i), i]. Thread t
// takes keys lo+t, lo+t+32, ...: each score one fma chain over d from 0, times scale; the row max is the first
// occurrence of the largest score (what the CPU's sequential max gives, ±0 included); e_j = expf(s_j − m) and the
// denominator l is the 32-lane sum with lane = (j − lo) mod 32 and the lane tree; P_j = e_j / l (bf16: rounded).
// Then thread t computes output dims d = t, t+32, ...: one fma chain over j ascending of P_j·v_jd. A block keeps
// its row's scores in its own scratch row of T floats (global memory), so scratch is [blocks in flight, T]: linear in
// T, where a block per row would need [B·H·T, T] (17 GiB at Olmo 3 7B, seq 8192, micro-batch 2).
//
// Backward, three kernels in the order of attention.md: (1) the query blocks, striding over the rows as the forward
// does: P recomputed with the forward's operations, dP_j (chain over d), D (chain over d, one thread; kept as
// [B, H, T]), dS_j = (P_j·(dP_j − D))·scale, the bf16 roundings, and dq (chain over j per d); the dS row is the
// block's scratch row. (2) a block per (instance, query head, key j), thread per d: dk_h and dv_h as chains over
// the queries i = j..hi(j) ascending, 32 queries at a time: thread t recomputes P_ij and dS_ij of query i0 + t with
// (1)'s very operations (attention_prob_grad) from the saved m, l, D, and the chains go on through the stored
// accumulators (an fp32 store and reload keeps the bits), so no [B·H·T, T] P or dS is ever stored. (3) per KV head
// the group sum over its query heads in ascending order.
#pragma once

#include <cstdint>

#include "kernels/block.h"
#include "core/bf16.h"
#include "core/hd.h"
#include "core/mathfn_impl.h"

namespace olmoref::kernels {

// Blocks in flight over the query rows (forward and backward's query kernel), each with its own scratch row of T
// floats. A fixed count from the shape alone (never the SM count): enough to fill an H200 (132 SMs, at most 32
// resident blocks each), and the rows a block takes never change a bit, since each row is computed whole by one
// block. At T = 8192 the scratch is 128 MiB.
inline constexpr int64_t kAttentionRowBlocks = 4096;

struct AttentionArgs {
  int64_t B = 0, T = 0, H = 0, KV = 0, hd = 0, window = 0;  // window 0: full causal
  float scale = 1.0f;
  bool bf16 = false;
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // [B·T, H·hd], [B·T, KV·hd] ×2
  float* out = nullptr;                                  // [B·T, H·hd]
  float *row_max = nullptr, *row_sum = nullptr;          // [B, H, T]
  // [attention_row_blocks, T]: a block's row of forward scores/P or backward dS
  float* scratch = nullptr;
  int64_t row_blocks = kAttentionRowBlocks;  // at most this many blocks in flight (tests take fewer to stride more)
  // backward only
  const float* dout = nullptr;                           // [B·T, H·hd]
  float* dq = nullptr;                                   // [B·T, H·hd]
  float *dk = nullptr, *dv = nullptr;                    // [B·T, KV·hd]
  float* row_d = nullptr;                                // [B, H, T]: D_i = chain over d of dO_id·o_id
  float *dk_head = nullptr, *dv_head = nullptr;          // [B, H, T, hd]
};

// The blocks in flight over the B·H·T query rows, and so the rows of scratch: [attention_row_blocks, T].
OLMOREF_HD inline int64_t attention_row_blocks(const AttentionArgs& a) {
  const int64_t rows = a.B * a.H * a.T;
  return rows < a.row_blocks ? rows : a.row_blocks;
}

struct AttentionShared {
  float lane[32];
  int64_t first[32];
  float m;
};
// The key kernel's 32 queries in flight: their P_ij and dS_ij for the block's key j.
struct AttentionKeyShared {
  float p[32], ds[32];
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

// P_j and dS_j of query row `row` at key j (0-based from qr.lo), from the saved m, l and D = dO·o: P with exactly
// the forward's operations, so it has the forward's bits. Both kernels of the backward that use them (the query
// kernel's dq, the key kernel's dk/dv) call this one function, so they see the same bits. bf16: both rounded, as
// they enter the dq/dk/dv products as bf16 operands.
struct ProbGrad {
  float p, ds;
};
OLMOREF_HD inline ProbGrad attention_prob_grad(const AttentionArgs& a, const QueryRow& qr, int64_t row, int64_t j,
                                               float D) {
  const float* qi = a.q + (qr.b * a.T + qr.i) * qr.qw + qr.h * a.hd;
  const float* doi = a.dout + (qr.b * a.T + qr.i) * qr.qw + qr.h * a.hd;
  const float* vj = a.v + (qr.b * a.T + qr.lo + j) * qr.kw + qr.g * a.hd;
  float dp = 0.0f;
  for (int64_t d = 0; d < a.hd; ++d) dp = hd_fma(doi[d], vj[d], dp);
  const float p = det::impl::expf(attention_score(a, qr, qi, j) - a.row_max[row]) / a.row_sum[row];
  const float ds = (p * (dp - D)) * a.scale;
  return {a.bf16 ? round_bf16(p) : p, a.bf16 ? round_bf16(ds) : ds};
}

// Query row `row` with the block's scratch row s [T].
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_forward_row(Block& blk, AttentionShared& sh, const AttentionArgs& a, int64_t row, float* s) {
  const QueryRow qr = query_row(a, row);
  const int64_t i = qr.i, b = qr.b, h = qr.h, g = qr.g, lo = qr.lo, n = qr.n, qw = qr.qw, kw = qr.kw;
  const float* qi = a.q + (b * a.T + i) * qw + h * a.hd;
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

// Backward (1): query row `row` = (b·H + h)·T + i with the block's scratch row [T] for its dS.
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_backward_query(Block& blk, AttentionShared& sh, const AttentionArgs& a, int64_t row,
                                         float* scratch_row) {
  const QueryRow qr = query_row(a, row);
  const int64_t i = qr.i, b = qr.b, h = qr.h, g = qr.g, lo = qr.lo, n = qr.n, qw = qr.qw, kw = qr.kw;
  const float* doi = a.dout + (b * a.T + i) * qw + h * a.hd;
  const float* oi = a.out + (b * a.T + i) * qw + h * a.hd;
  float* dS = scratch_row;  // keys lo..i
  blk.phase([&](int t, auto&) {
    if (t == 0) {  // D = chain over d of dO_d·o_d
      float acc = 0.0f;
      for (int64_t d = 0; d < a.hd; ++d) acc = hd_fma(doi[d], oi[d], acc);
      sh.m = acc;
      a.row_d[row] = acc;  // for the key kernel's dS
    }
  });
  blk.phase([&](int t, auto&) {
    for (int64_t j = t; j < n; j += 32) dS[j] = attention_prob_grad(a, qr, row, j, sh.m).ds;
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

// Block `block` of `blocks` in flight: the query rows block, block + blocks, ... with scratch row `block`, through
// body(row, scratch_row) (attention_forward_row or attention_backward_query).
OLMOREF_BLOCK_BODY
template <class RowBody>
OLMOREF_HD void attention_block_rows(const AttentionArgs& a, int64_t block, int64_t blocks, RowBody&& body) {
  float* scratch_row = a.scratch + block * a.T;
  for (int64_t row = block; row < a.B * a.H * a.T; row += blocks) body(row, scratch_row);
}

// Backward (2): key `key` = (b·H + h)·T + j, per query head; thread t takes d = t, t+32, ...
OLMOREF_BLOCK_BODY
template <class Block>
OLMOREF_HD void attention_backward_key(Block& blk, AttentionKeyShared& sh, const AttentionArgs& a, int64_t key) {
  const int64_t j = key % a.T, bh = key / a.T, h = bh % a.H, b = bh / a.H;
  const int64_t hi = a.window > 0 && j + a.window - 1 < a.T - 1 ? j + a.window - 1 : a.T - 1;
  const int64_t qw = a.H * a.hd;
  for (int64_t i0 = j; i0 <= hi; i0 += 32) {
    const int64_t n = hi - i0 + 1 < 32 ? hi - i0 + 1 : 32;
    blk.phase([&](int t, auto&) {
      if (t >= n) return;
      const int64_t row = bh * a.T + i0 + t;
      const QueryRow qr = query_row(a, row);
      const ProbGrad pg = attention_prob_grad(a, qr, row, j - qr.lo, a.row_d[row]);
      sh.p[t] = pg.p, sh.ds[t] = pg.ds;
    });
    blk.phase([&](int t, auto&) {
      const bool last = i0 + 32 > hi;  // the chains end here: the bf16 rounding
      for (int64_t d = t; d < a.hd; d += 32) {
        float* dk_out = a.dk_head + key * a.hd + d;
        float* dv_out = a.dv_head + key * a.hd + d;
        float dk = i0 == j ? 0.0f : *dk_out, dv = i0 == j ? 0.0f : *dv_out;
        for (int64_t c = 0; c < n; ++c) {
          const int64_t at = (b * a.T + i0 + c) * qw + h * a.hd + d;
          dk = hd_fma(sh.ds[c], a.q[at], dk);
          dv = hd_fma(sh.p[c], a.dout[at], dv);
        }
        *dk_out = last && a.bf16 ? round_bf16(dk) : dk;
        *dv_out = last && a.bf16 ? round_bf16(dv) : dv;
      }
    });
  }
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
