// ref/simd_ops_impl.h — the SIMD paths of ref/simd_ops.h, written once as templates over an ISA's register traits
// S (ref/simd_avx512.cpp, ref/simd_avx2.cpp instantiate them; nothing else includes this file). Every output is
// one lane of a register and sees exactly the scalar definition's operations in its order (docs/canonical/):
//
//   scores s_j = (chain over d of q_d·k_jd)·scale   lanes = keys j, rows of the tile = queries (kt is K transposed)
//   P·V, dS·K (dq) chains over keys j ascending      lanes = head dims d, one register row per query
//   dk, dv chains over queries i ascending           lanes = head dims d, one register row per key
//   canonical_sum / canonical_dot                    core/reduce.h's 32 lanes = 2 zmm (4 ymm), then its tree
//
// A chain over a band is never padded with zero terms (fma(0, v, acc) is not always acc: -0, inf, NaN): each
// output row starts and stops at its own bounds. Tails are masked so lanes past the end are neither read into a
// sum nor written. Keys outside a query's band may be computed in a lane and are then never used.
//
// ODR: these translation units are compiled with -mavx512f / -mavx2; everything here sits in an anonymous
// namespace or is a template instantiated only on the ISA's register type, and no std:: template or shared
// inline float function is called, so no AVX-512 code can be picked by the linker for the rest of a baseline
// build.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/attention_band.h"
#include "core/elementwise.h"
#include "core/mathfn_impl.h"
#include "ref/simd_ops.h"

namespace olmoref::simd {
namespace {

// The band of core/attention_band.h for instance b of shape s.
inline int64_t lo_of(const AttentionShape& s, int64_t b, int64_t i) {
  return attention_key_lo(s.window, s.doc_start, s.T, b, i);
}
inline int64_t hi_of(const AttentionShape& s, int64_t b, int64_t j) {
  return attention_query_hi(s.window, s.doc_end, s.T, b, j);
}
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

template <class S>
struct Kernels {
  using V = typename S::V;
  static constexpr int W = S::W;
  static constexpr int kLaneRegs = 32 / W;  // registers holding reduce.h's 32 lanes

  // ---- canonical reductions ----
  // core/reduce.h's lane tree over the 32 lanes held in acc[0 .. kLaneRegs): lane[j] = lane[j] + lane[j + w] for
  // w = 16, 8, 4, 2, 1 (restated here: reduce.h's lane_tree<float> instantiated in this ISA's file could be picked
  // by the linker for a baseline caller).
  static float tree32(const V* acc) {
    alignas(64) float lane[32];
    for (int r = 0; r < kLaneRegs; ++r) S::store(lane + r * W, acc[r]);
    for (int w = 16; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) lane[j] = lane[j] + lane[j + w];
    return lane[0];
  }
  static float canonical_sum(const float* x, int64_t n) {
    V acc[kLaneRegs];
    for (int r = 0; r < kLaneRegs; ++r) acc[r] = S::zero();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int r = 0; r < kLaneRegs; ++r) acc[r] = acc[r] + S::load(x + i + r * W);
    for (int r = 0; r < kLaneRegs; ++r) {
      const int64_t cnt = n - i - r * W;
      if (cnt > 0) acc[r] = S::add_first(acc[r], S::load_first(x + i + r * W, cnt), cnt);
    }
    return tree32(acc);
  }

  static float canonical_dot(const float* a, const float* b, int64_t n) {
    V acc[kLaneRegs];
    for (int r = 0; r < kLaneRegs; ++r) acc[r] = S::zero();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int r = 0; r < kLaneRegs; ++r)
        acc[r] = lanes_fma(S::load(a + i + r * W), S::load(b + i + r * W), acc[r]);
    for (int r = 0; r < kLaneRegs; ++r) {
      const int64_t cnt = n - i - r * W;
      if (cnt > 0)
        acc[r] = S::blend_first(acc[r], lanes_fma(S::load_first(a + i + r * W, cnt), S::load_first(b + i + r * W, cnt), acc[r]), cnt);
    }
    return tree32(acc);
  }

  // The sequential max m = (m < x) ? x : m from -inf. Per lane the same rule (max(x, m) keeps m on NaN and on
  // ties); lanes combine to the same value, except that a largest value of zero may differ in its sign between
  // occurrences, so then the sequential pass decides.
  static float row_max(const float* x, int64_t n) {
    V m = S::set1(-__builtin_inff());
    int64_t j = 0;
    for (; j + W <= n; j += W) m = S::max_keep(S::load(x + j), m);
    if (j < n) m = S::blend_first(m, S::max_keep(S::load_first(x + j, n - j), m), n - j);
    alignas(64) float lane[W];
    S::store(lane, m);
    float r = -__builtin_inff();
    for (int l = 0; l < W; ++l) r = r < lane[l] ? lane[l] : r;
    if (r == 0.0f) {
      r = -__builtin_inff();
      for (int64_t t = 0; t < n; ++t) r = r < x[t] ? x[t] : r;
    }
    return r;
  }

  static float exp_shift_sum(float* x, int64_t n, float* m_out) {
    const float m = row_max(x, n);
    const V mv = S::set1(m);
    int64_t j = 0;
    for (; j + W <= n; j += W) S::store(x + j, det::impl::expf(S::load(x + j) - mv));
    if (j < n) S::store_first(x + j, det::impl::expf(S::load_first(x + j, n - j) - mv), n - j);
    *m_out = m;
    return canonical_sum(x, n);
  }

  static void scale_probs(float* x, int64_t n, float sum, float coef, float inv_n) {
    const V sv = S::set1(sum), cv = S::set1(coef), nv = S::set1(inv_n);
    int64_t j = 0;
    for (; j + W <= n; j += W) S::store(x + j, ((S::load(x + j) / sv) * cv) * nv);
    if (j < n) S::store_first(x + j, ((S::load_first(x + j, n - j) / sv) * cv) * nv, n - j);
  }

  // x = round_bf16(x) over n lanes (core/bf16.h's rounding: nearest-even on the 16 dropped bits, NaN -> 0x7FC0).
  static void round_bf16_row(float* x, int64_t n) {
    int64_t j = 0;
    for (; j + W <= n; j += W) S::store(x + j, S::round_bf16(S::load(x + j)));
    if (j < n) S::store_first(x + j, S::round_bf16(S::load_first(x + j, n - j)), n - j);
  }

  // x = x / l over n lanes (softmax probabilities from numerators).
  static void divide(float* x, int64_t n, float l) {
    const V lv = S::set1(l);
    int64_t j = 0;
    for (; j + W <= n; j += W) S::store(x + j, S::load(x + j) / lv);
    if (j < n) S::store_first(x + j, S::load_first(x + j, n - j) / lv, n - j);
  }

  // ---- elementwise ----
  static void swiglu_forward(const float* g, const float* u, float* a, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W) S::store(a + i, elem::swiglu_forward(S::load(g + i), S::load(u + i)));
    if (i < n) S::store_first(a + i, elem::swiglu_forward(S::load_first(g + i, n - i), S::load_first(u + i, n - i)), n - i);
  }
  static void swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n) {
    int64_t i = 0;
    V vdg, vdu;
    for (; i + W <= n; i += W) {
      elem::swiglu_backward(S::load(g + i), S::load(u + i), S::load(da + i), vdg, vdu);
      S::store(dg + i, vdg);
      S::store(du + i, vdu);
    }
    if (i < n) {
      const int64_t c = n - i;
      elem::swiglu_backward(S::load_first(g + i, c), S::load_first(u + i, c), S::load_first(da + i, c), vdg, vdu);
      S::store_first(dg + i, vdg, c);
      S::store_first(du + i, vdu, c);
    }
  }
  template <V (*F)(V)>
  static void map(const float* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + W <= n; i += W) S::store(y + i, F(S::load(x + i)));
    if (i < n) S::store_first(y + i, F(S::load_first(x + i, n - i)), n - i);
  }
  static V expf_v(V x) { return det::impl::expf(x); }
  static V logf_v(V x) { return det::impl::logf(x); }
  static V sigmoid_v(V x) { return det::impl::sigmoidf(x); }
  static V silu_v(V x) { return det::impl::siluf(x); }

  // ---- RMSNorm ----
  // The fused ops' tail (residual add, bf16 rounding) runs on the register the norm just produced, so the row is
  // read and written once.
  static void rmsnorm_forward_rows(const float* res, const float* x, const float* w, float* y, float* inv_rms,
                                   int64_t r0, int64_t r1, int64_t n, float eps, bool bf16) {
    const float inv_n = 1.0f / static_cast<float>(n);
    const auto round = [](V v) { return S::round_bf16(v); };
    const bool residual = res != nullptr;
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      const float* resr = residual ? res + r * n : nullptr;
      const float ms = canonical_dot(xr, xr, n) * inv_n;
      const float ir = 1.0f / __builtin_sqrtf(ms + eps);
      inv_rms[r] = ir;
      float* yr = y + r * n;
      const V irv = S::set1(ir);
      int64_t c = 0;
      for (; c + W <= n; c += W) {
        const V normed = S::load(w + c) * (S::load(xr + c) * irv);
        const V rv = residual ? S::load(resr + c) : S::zero();
        S::store(yr + c, elem::fused_norm_output(normed, rv, residual, bf16, round));
      }
      if (c < n) {
        const int64_t cnt = n - c;
        const V normed = S::load_first(w + c, cnt) * (S::load_first(xr + c, cnt) * irv);
        const V rv = residual ? S::load_first(resr + c, cnt) : S::zero();
        S::store_first(yr + c, elem::fused_norm_output(normed, rv, residual, bf16, round), cnt);
      }
    }
  }

  // dx = r · (g − x̂ · mean(g ⊙ x̂)) with g = dy ⊙ w, x̂ = x · r; mean(g ⊙ x̂) by canonical_dot over the row.
  static void rmsnorm_backward_rows(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx,
                                    int64_t r0, int64_t r1, int64_t n) {
    const float inv_n = 1.0f / static_cast<float>(n);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      const float* dyr = dy + r * n;
      float* dxr = dx + r * n;
      const float ir = inv_rms[r];
      const V irv = S::set1(ir);
      // The dot's 32 lanes over g[c]·x̂[c], with g and x̂ formed on the fly (the same products as stored ones).
      V acc[kLaneRegs];
      for (int q = 0; q < kLaneRegs; ++q) acc[q] = S::zero();
      int64_t c = 0;
      for (; c + 32 <= n; c += 32)
        for (int q = 0; q < kLaneRegs; ++q) {
          const int64_t o = c + q * W;
          acc[q] = lanes_fma(S::load(dyr + o) * S::load(w + o), S::load(xr + o) * irv, acc[q]);
        }
      for (int q = 0; q < kLaneRegs; ++q) {
        const int64_t o = c + q * W, cnt = n - o;
        if (cnt > 0) {
          const V gv = S::load_first(dyr + o, cnt) * S::load_first(w + o, cnt);
          const V xh = S::load_first(xr + o, cnt) * irv;
          acc[q] = S::blend_first(acc[q], lanes_fma(gv, xh, acc[q]), cnt);
        }
      }
      const V mean = S::set1(tree32(acc) * inv_n);
      c = 0;
      for (; c + W <= n; c += W) {
        const V gv = S::load(dyr + c) * S::load(w + c);
        const V xh = S::load(xr + c) * irv;
        S::store(dxr + c, irv * (gv - xh * mean));
      }
      if (c < n) {
        const int64_t cnt = n - c;
        const V gv = S::load_first(dyr + c, cnt) * S::load_first(w + c, cnt);
        const V xh = S::load_first(xr + c, cnt) * irv;
        S::store_first(dxr + c, irv * (gv - xh * mean), cnt);
      }
    }
  }

  // dw[c] = chain over rows r in order of dy[r,c]·(x[r,c]·r_r), for columns [c0, c1); 4 registers of columns at
  // a time so each row's cache lines are read once per pass.
  static void rmsnorm_dw_cols(const float* x, const float* inv_rms, const float* dy, float* dw, int64_t R, int64_t n,
                              int64_t c0, int64_t c1, bool accumulate) {
    constexpr int kCols = 4;
    int64_t c = c0;
    for (; c + kCols * W <= c1; c += kCols * W) {
      V acc[kCols];
      for (int q = 0; q < kCols; ++q) acc[q] = accumulate ? S::load(dw + c + q * W) : S::zero();
      for (int64_t r = 0; r < R; ++r) {
        const V irv = S::set1(inv_rms[r]);
        for (int q = 0; q < kCols; ++q) {
          const int64_t o = r * n + c + q * W;
          acc[q] = lanes_fma(S::load(dy + o), S::load(x + o) * irv, acc[q]);
        }
      }
      for (int q = 0; q < kCols; ++q) S::store(dw + c + q * W, acc[q]);
    }
    for (; c < c1; c += W) {
      const int64_t cnt = min64(W, c1 - c);
      V acc = accumulate ? S::load_first(dw + c, cnt) : S::zero();
      for (int64_t r = 0; r < R; ++r) {
        const V irv = S::set1(inv_rms[r]);
        acc = lanes_fma(S::load_first(dy + r * n + c, cnt), S::load_first(x + r * n + c, cnt) * irv, acc);
      }
      S::store_first(dw + c, acc, cnt);
    }
  }

  // ---- attention ----
  //
  // Score tiles: kScoreRows query rows x kScoreVecs registers of keys, chains over d from 0, then · scale.
  static constexpr int kScoreRows = S::kScoreRows;
  static constexpr int kScoreVecs = S::kScoreVecs;
  static constexpr int64_t kKeyPad = kScoreVecs * W;
  static int64_t padded_T(int64_t T) { return (T + kKeyPad + 15) / 16 * 16; }

  // out[r][j] = (chain over d of a_r[d] · bt[d][j]) · scale for j in [j_begin, j_end] (in whole tiles, so a few
  // columns past j_end are written too: out rows must hold padded_T columns). a_r = a + r * a_stride for the
  // tile's rows (rows past n_rows repeat the last one and are not stored).
  static void score_rows(const float* a, int64_t a_stride, int n_rows, const float* bt, int64_t Tp, int64_t hd,
                         int64_t j_begin, int64_t j_end, float scale, float* out, int64_t out_stride) {
    const V sv = S::set1(scale);
    // Key tiles outer, row tiles inner: one tile of bt (hd x 64 keys, 16 KiB at hd = 64) stays in L1 for every
    // row tile of the block instead of streaming from L2 once per row tile.
    for (int64_t j0 = j_begin; j0 <= j_end; j0 += kKeyPad) {
      for (int r0 = 0; r0 < n_rows; r0 += kScoreRows) {
        const float* ar[kScoreRows];
        for (int r = 0; r < kScoreRows; ++r) ar[r] = a + (r0 + r < n_rows ? r0 + r : n_rows - 1) * a_stride;
        V acc[kScoreRows][kScoreVecs];
#pragma GCC unroll 8
        for (int r = 0; r < kScoreRows; ++r)
#pragma GCC unroll 8
          for (int v = 0; v < kScoreVecs; ++v) acc[r][v] = S::zero();
        const float* bcol = bt + j0;
        for (int64_t d = 0; d < hd; ++d) {
          V bv[kScoreVecs];
#pragma GCC unroll 8
          for (int v = 0; v < kScoreVecs; ++v) bv[v] = S::load(bcol + d * Tp + v * W);
#pragma GCC unroll 8
          for (int r = 0; r < kScoreRows; ++r) {
            const V av = S::set1(ar[r][d]);
#pragma GCC unroll 8
            for (int v = 0; v < kScoreVecs; ++v) acc[r][v] = lanes_fma(av, bv[v], acc[r][v]);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < kScoreRows; ++r) {
          if (r0 + r >= n_rows) break;
          float* o = out + (r0 + r) * out_stride + j0;
#pragma GCC unroll 8
          for (int v = 0; v < kScoreVecs; ++v) S::store(o + v * W, acc[r][v] * sv);
        }
      }
    }
  }

  // Banded chains: for rows r < n_rows, out_r[d] (HV registers) = chain over idx = b[r]..e[r] ascending of
  // coef(r, idx) · src_idx[d], continuing from out_r (load_out) or from 0. coef(r, idx) = coef[r * coef_rs +
  // (idx − idx0) * coef_is], src_idx = src + idx * src_stride. b and e are nondecreasing in r, so where every row
  // is active ([max b, min e]) the loop runs unchecked; elsewhere each row tests its own bounds.
  template <int R, int HV>
  static void banded_chains(int n_rows, const int64_t* b, const int64_t* e, const float* coef, int64_t coef_rs,
                            int64_t coef_is, int64_t idx0, const float* src, int64_t src_stride, float* out,
                            int64_t out_stride, bool load_out) {
    V acc[R][HV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < HV; ++v)
        acc[r][v] = load_out && r < n_rows ? S::load(out + r * out_stride + v * W) : S::zero();
    // Rows may be empty here (b > e: a chunk outside their band); they keep their accumulators untouched.
    int64_t first = INT64_MAX, last = INT64_MIN, mid_lo = b[0], mid_hi = e[0];
    for (int r = 0; r < n_rows; ++r) {
      if (b[r] <= e[r]) {
        first = min64(first, b[r]);
        last = max64(last, e[r]);
      }
      mid_lo = max64(mid_lo, b[r]);
      mid_hi = min64(mid_hi, e[r]);
    }
    // One loop with a per-index test (well predicted) rather than separate prologue/epilogue loops or a helper:
    // the accumulators must never have their address taken, or GCC keeps them in memory.
    const bool full = n_rows == R;
    for (int64_t idx = first; idx <= last; ++idx) {
      V sv[HV];
#pragma GCC unroll 16
      for (int v = 0; v < HV; ++v) sv[v] = S::load(src + idx * src_stride + v * W);
      const float* c = coef + (idx - idx0) * coef_is;
      if (full && idx >= mid_lo && idx <= mid_hi) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const V cv = S::set1(c[r * coef_rs]);
#pragma GCC unroll 16
          for (int v = 0; v < HV; ++v) acc[r][v] = lanes_fma(cv, sv[v], acc[r][v]);
        }
      } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          if (r >= n_rows || idx < b[r] || idx > e[r]) continue;
          const V cv = S::set1(c[r * coef_rs]);
#pragma GCC unroll 16
          for (int v = 0; v < HV; ++v) acc[r][v] = lanes_fma(cv, sv[v], acc[r][v]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      if (r < n_rows)
#pragma GCC unroll 16
        for (int v = 0; v < HV; ++v) S::store(out + r * out_stride + v * W, acc[r][v]);
  }

  // Rows per banded-chain group: up to 16 accumulator registers (AVX-512; 12 for AVX2), at most 8 rows.
  template <int HV>
  static constexpr int chain_rows() {
    constexpr int r = S::kChainRegs / HV;
    return r < 1 ? 1 : (r > 8 ? 8 : r);
  }

  // Chains for rows [0, n) (n <= kMaxChainRows) in groups of chain_rows; the b/e arrays, coef and out are indexed
  // by row. The index range goes in chunks of about 16 KiB of src rows, every group through one chunk before the
  // next, so the chunk is read from L1 by all groups; between chunks each row's accumulators are stored and
  // reloaded (the chain continues with its bits; a row whose band starts later stores its initial zeros).
  template <int HV>
  static void chains_for_rows(int64_t n, const int64_t* b, const int64_t* e, const float* coef, int64_t coef_rs,
                              int64_t coef_is, int64_t idx0, const float* src, int64_t src_stride, float* out,
                              int64_t out_stride, bool load_out) {
    constexpr int R = chain_rows<HV>();
    constexpr int64_t kChunk = 4096 / (HV * W) < 16 ? 16 : 4096 / (HV * W);
    int64_t first = b[0], last = e[0];
    for (int64_t r = 1; r < n; ++r) {
      first = min64(first, b[r]);
      last = max64(last, e[r]);
    }
    int64_t cb[kMaxChainRows], ce[kMaxChainRows];
    for (int64_t c0 = first; c0 <= last; c0 += kChunk) {
      const int64_t c1 = min64(last, c0 + kChunk - 1);
      for (int64_t r = 0; r < n; ++r) {
        cb[r] = max64(b[r], c0);
        ce[r] = min64(e[r], c1);
      }
      for (int64_t r0 = 0; r0 < n; r0 += R) {
        const int nr = static_cast<int>(min64(R, n - r0));
        banded_chains<R, HV>(nr, cb + r0, ce + r0, coef + r0 * coef_rs, coef_rs, coef_is, idx0, src, src_stride,
                             out + r0 * out_stride, out_stride, load_out || c0 > first);
      }
    }
  }

  template <int HV>
  static void chains_dispatch_hv(int64_t n, const int64_t* b, const int64_t* e, const float* coef, int64_t coef_rs,
                                 int64_t coef_is, int64_t idx0, const float* src, int64_t src_stride, float* out,
                                 int64_t out_stride, bool load_out, int64_t hv) {
    if constexpr (HV > 16) {
      (void)n, (void)b, (void)e, (void)coef, (void)coef_rs, (void)coef_is, (void)idx0, (void)src, (void)src_stride,
          (void)out, (void)out_stride, (void)load_out, (void)hv;
    } else if (hv == HV) {
      chains_for_rows<HV>(n, b, e, coef, coef_rs, coef_is, idx0, src, src_stride, out, out_stride, load_out);
    } else {
      chains_dispatch_hv<HV + 1>(n, b, e, coef, coef_rs, coef_is, idx0, src, src_stride, out, out_stride, load_out, hv);
    }
  }

  static constexpr int64_t kMaxHeadRegs = 16;  // hd <= 16 registers (256 with AVX-512, 128 with AVX2)
  static constexpr int64_t kForwardRows = 32;
  static constexpr int64_t kMaxChainRows = 64;  // rows per chains_for_rows call (kBackwardRows, kKeyChunk)
  static constexpr int64_t kBackwardRows = 64;
  static constexpr int64_t kKeyChunk = 64;

  static size_t attention_forward_scratch(const AttentionShape& s) {
    const int64_t Tp = padded_T(s.T);
    return static_cast<size_t>(s.hd * Tp + kForwardRows * Tp + 2 * kForwardRows);
  }

  // Transposes one head of x [B*T, width] (instance b, columns head*hd ..) into xt [hd, Tp], padding zeroed.
  static void transpose_head(const float* x, int64_t b, int64_t T, int64_t Tp, int64_t width, int64_t head,
                             int64_t hd, float* xt) {
    // 16 rows at a time: their hd floats stay in L1 while each xt row gets 16 contiguous floats.
    const float* base = x + b * T * width + head * hd;
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
      const int64_t t1 = min64(T, t0 + 16);
      for (int64_t d = 0; d < hd; ++d) {
        float* dst = xt + d * Tp;
        for (int64_t t = t0; t < t1; ++t) dst[t] = base[t * width + d];
      }
    }
    for (int64_t d = 0; d < hd; ++d)
      for (int64_t t = T; t < Tp; ++t) xt[d * Tp + t] = 0.0f;
  }

  static void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                                float* row_max_out, float* row_sum_out, int64_t tb, int64_t te, float* scratch) {
    const int64_t T = s.T, hd = s.hd, qw = s.H * hd, kw = s.KV * hd, group = s.H / s.KV, Tp = padded_T(T);
    const int64_t hv = hd / W;
    const bool bf16 = s.precision == Precision::bf16;
    float* kt = scratch;
    float* sc = kt + hd * Tp;  // [kForwardRows, Tp], absolute key columns
    int64_t bnd[2][kForwardRows];
    for (int64_t task = tb; task < te; ++task) {
      const int64_t b = task / s.H, h = task % s.H, g = h / group;
      transpose_head(k, b, T, Tp, kw, g, hd, kt);
      const int64_t q_end = s.query_end();
      for (int64_t i0 = s.q_begin; i0 < q_end; i0 += kForwardRows) {
        const int64_t nr = min64(kForwardRows, q_end - i0);
        const int64_t jlo = lo_of(s, b, i0), jhi = i0 + nr - 1;
        score_rows(q + (b * T + i0) * qw + h * hd, qw, static_cast<int>(nr), kt, Tp, hd, jlo, jhi, s.scale, sc, Tp);
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t i = i0 + r, lo = lo_of(s, b, i), n = i - lo + 1;
          float* row = sc + r * Tp + lo;
          float m;
          const float l = exp_shift_sum(row, n, &m);
          divide(row, n, l);
          if (bf16) round_bf16_row(row, n);  // P enters the P·V product as a bf16 operand
          row_max_out[(b * s.H + h) * T + i] = m;
          row_sum_out[(b * s.H + h) * T + i] = l;
          bnd[0][r] = lo;
          bnd[1][r] = i;
        }
        chains_dispatch_hv<1>(nr, bnd[0], bnd[1], sc, Tp, 1, 0, v + b * T * kw + g * hd, kw,
                              out + (b * T + i0) * qw + h * hd, qw, false, hv);
      }
    }
  }

  static size_t attention_backward_scratch(const AttentionShape& s) {
    const int64_t Tp = padded_T(s.T);
    return static_cast<size_t>(2 * s.hd * Tp + 2 * kBackwardRows * Tp + kBackwardRows);
  }

  static void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 const float* out, const float* row_max, const float* row_sum, const float* dout,
                                 float* dq, float* dk_head, float* dv_head, int64_t tb, int64_t te, float* scratch) {
    const int64_t T = s.T, hd = s.hd, qw = s.H * hd, kw = s.KV * hd, group = s.H / s.KV, Tp = padded_T(T);
    const int64_t hv = hd / W;
    const bool bf16 = s.precision == Precision::bf16;
    float* kt = scratch;
    float* vt = kt + hd * Tp;
    float* P = vt + hd * Tp;              // [kBackwardRows, Tp]: row i − i0, absolute key columns
    float* dS = P + kBackwardRows * Tp;   // the same layout: dP, then dsc
    int64_t qb[kBackwardRows], qe[kBackwardRows];
    int64_t kb[kKeyChunk], ke[kKeyChunk];
    for (int64_t task = tb; task < te; ++task) {
      const int64_t b = task / s.H, h = task % s.H, g = h / group;
      transpose_head(k, b, T, Tp, kw, g, hd, kt);
      transpose_head(v, b, T, Tp, kw, g, hd, vt);
      const float* qh = q + b * T * qw + h * hd;      // row i at qh + i * qw
      const float* doh = dout + b * T * qw + h * hd;
      const float* oh = out + b * T * qw + h * hd;
      float* dkh = dk_head + (b * s.H + h) * T * hd;  // row j at dkh + j * hd
      float* dvh = dv_head + (b * s.H + h) * T * hd;
      const float* mh = row_max + (b * s.H + h) * T;
      const float* lh = row_sum + (b * s.H + h) * T;
      const int64_t q_end = s.query_end(), k_end = s.key_end();
      const AttentionQueries rows =
          attention_backward_queries(s.window, s.doc_end, T, b, s.q_begin, q_end, s.k_begin, k_end);
      for (int64_t i0 = rows.begin; i0 < rows.end; i0 += kBackwardRows) {
        const int64_t nr = min64(kBackwardRows, rows.end - i0), i1 = i0 + nr - 1;
        const int64_t jlo = lo_of(s, b, i0);
        score_rows(qh + i0 * qw, qw, static_cast<int>(nr), kt, Tp, hd, jlo, i1, s.scale, P, Tp);
        score_rows(doh + i0 * qw, qw, static_cast<int>(nr), vt, Tp, hd, jlo, i1, 1.0f, dS, Tp);
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t i = i0 + r, lo = lo_of(s, b, i), n = i - lo + 1;
          float* pr = P + r * Tp + lo;
          float* dr = dS + r * Tp + lo;
          // P = expf(s − m) / l with the forward's m and l; D = chain over d of dO·O.
          const V mv = S::set1(mh[i]), lv = S::set1(lh[i]);
          float D = 0.0f;
          for (int64_t d = 0; d < hd; ++d) D = __builtin_fmaf(doh[i * qw + d], oh[i * qw + d], D);
          const V Dv = S::set1(D), sv = S::set1(s.scale);
          int64_t j = 0;
          // bf16: dS and P enter the dq/dk/dv products as bf16 operands (P after its fp32 use in dS).
          for (; j + W <= n; j += W) {
            const V p = det::impl::expf(S::load(pr + j) - mv) / lv;
            const V ds = (p * (S::load(dr + j) - Dv)) * sv;
            S::store(pr + j, bf16 ? S::round_bf16(p) : p);
            S::store(dr + j, bf16 ? S::round_bf16(ds) : ds);
          }
          if (j < n) {
            const int64_t c = n - j;
            const V p = det::impl::expf(S::load_first(pr + j, c) - mv) / lv;
            const V ds = (p * (S::load_first(dr + j, c) - Dv)) * sv;
            S::store_first(pr + j, bf16 ? S::round_bf16(p) : p, c);
            S::store_first(dr + j, bf16 ? S::round_bf16(ds) : ds, c);
          }
          qb[r] = lo;
          qe[r] = i;
        }
        // dq_i = chain over j = lo..i of dsc_ij · k_j, for the block's rows among the queries [q_begin, q_end).
        const int64_t r0 = max64(i0, s.q_begin) - i0, r1 = min64(i1 + 1, q_end) - i0;
        if (r0 < r1) {
          chains_dispatch_hv<1>(r1 - r0, qb + r0, qe + r0, dS + r0 * Tp, Tp, 1, 0, k + b * T * kw + g * hd, kw,
                                dq + (b * T + i0 + r0) * qw + h * hd, qw, false, hv);
          if (bf16)
            for (int64_t r = r0; r < r1; ++r) round_bf16_row(dq + (b * T + i0 + r) * qw + h * hd, hd);
        }
        // dk_j, dv_j continue their chains over this block's queries i in [max(j, i0), min(hi(j), i1)], for the
        // keys j in [jlo, i1] among [k_begin, k_end) this block sees, kKeyChunk keys at a time.
        const int64_t j_last = min64(i1, k_end - 1);
        for (int64_t j0 = max64(jlo, s.k_begin); j0 <= j_last; j0 += kKeyChunk) {
          const int64_t nk = min64(kKeyChunk, j_last - j0 + 1);
          for (int64_t t = 0; t < nk; ++t) {
            const int64_t j = j0 + t;
            kb[t] = max64(j, i0);
            ke[t] = min64(hi_of(s, b, j), i1);
          }
          chains_dispatch_hv<1>(nk, kb, ke, dS + j0, 1, Tp, i0, qh, qw, dkh + j0 * hd, hd, true, hv);
          chains_dispatch_hv<1>(nk, kb, ke, P + j0, 1, Tp, i0, doh, qw, dvh + j0 * hd, hd, true, hv);
        }
      }
      if (bf16 && s.k_begin < k_end) {  // per query head, as flash-attn's bf16 dk/dv_expanded before the GQA sum
        round_bf16_row(dkh + s.k_begin * hd, (k_end - s.k_begin) * hd);
        round_bf16_row(dvh + s.k_begin * hd, (k_end - s.k_begin) * hd);
      }
    }
  }
};

}  // namespace

template <class S>
SimdOps make_simd_ops(const char* name) {
  using K = Kernels<S>;
  SimdOps o{};
  o.name = name;
  o.lanes = S::W;
  o.attention_forward_scratch = &K::attention_forward_scratch;
  o.attention_forward = &K::attention_forward;
  o.attention_backward_scratch = &K::attention_backward_scratch;
  o.attention_backward = &K::attention_backward;
  o.swiglu_forward = &K::swiglu_forward;
  o.swiglu_backward = &K::swiglu_backward;
  o.expf = &K::template map<&K::expf_v>;
  o.logf = &K::template map<&K::logf_v>;
  o.sigmoidf = &K::template map<&K::sigmoid_v>;
  o.siluf = &K::template map<&K::silu_v>;
  o.canonical_sum = &K::canonical_sum;
  o.canonical_dot = &K::canonical_dot;
  o.row_max = &K::row_max;
  o.exp_shift_sum = &K::exp_shift_sum;
  o.scale_probs = &K::scale_probs;
  o.rmsnorm_forward_rows = &K::rmsnorm_forward_rows;
  o.rmsnorm_backward_rows = &K::rmsnorm_backward_rows;
  o.rmsnorm_dw_cols = &K::rmsnorm_dw_cols;
  return o;
}

}  // namespace olmoref::simd
