#include "ref/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/attention_band.h"
#include "core/elementwise.h"
#include "ref/gemm.h"
#include "core/mathfn.h"
#include "core/parallel.h"
#include "core/reduce.h"
#include "ref/simd_ops.h"

namespace olmoref {

namespace {

void run(ThreadPool* pool, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool) pool->parallel_for(n, grain, fn); else fn(0, n);
}

// The SIMD path of an op, where one runs (ref/simd_ops.h); the scalar code below is the definition it matches.
const simd::SimdOps* simd_path() { return simd::active_simd_ops(); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// RMSNorm
// ---------------------------------------------------------------------------------------------

namespace {
// RMSNorm forward of rows [b, e) ending in elem::fused_norm_output (res nullptr and bf16 false: plain RMSNorm). One
// row function for the plain and the fused ops, so they cannot drift apart on any path.
void rmsnorm_rows(const float* res, const float* x, const float* w, float* y, float* inv_rms, int64_t b, int64_t e,
                  int64_t n, float eps, bool bf16) {
  if (const simd::SimdOps* fast = simd_path()) {
    fast->rmsnorm_forward_rows(res, x, w, y, inv_rms, b, e, n, eps, bf16);
    return;
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t r = b; r < e; ++r) {
    const float* xr = x + r * n;
    const float ms = canonical_dot(xr, xr, n) * inv_n;
    const float ir = 1.0f / std::sqrt(ms + eps);
    inv_rms[r] = ir;
    float* yr = y + r * n;
    const float* resr = res ? res + r * n : nullptr;
    for (int64_t c = 0; c < n; ++c)
      yr[c] = elem::fused_norm_output(w[c] * (xr[c] * ir), resr ? resr[c] : 0.0f, resr != nullptr, bf16,
                                      elem::RoundBf16{});
  }
}
}  // namespace

void rmsnorm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n, float eps,
                     ThreadPool* pool) {
  run(pool, R, 16, [&](int64_t b, int64_t e) { rmsnorm_rows(nullptr, x, w, y, inv_rms, b, e, n, eps, false); });
}

void rmsnorm_residual_forward(const float* res, const float* x, const float* w, float* out, float* inv_rms, int64_t R,
                              int64_t n, float eps, bool bf16, ThreadPool* pool) {
  run(pool, R, 16, [&](int64_t b, int64_t e) { rmsnorm_rows(res, x, w, out, inv_rms, b, e, n, eps, bf16); });
}

namespace {
// dx of rows [b, e): per row, with x̂ = x·r and g = dy ⊙ w:  dx = r · (g − x̂ · mean(g ⊙ x̂)).
void rmsnorm_backward_rows(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx, int64_t b,
                           int64_t e, int64_t n) {
  if (const simd::SimdOps* fast = simd_path()) {
    fast->rmsnorm_backward_rows(x, w, inv_rms, dy, dx, b, e, n);
    return;
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  std::vector<float> g(static_cast<size_t>(n)), xh(static_cast<size_t>(n));
  for (int64_t r = b; r < e; ++r) {
    const float* xr = x + r * n;
    const float* dyr = dy + r * n;
    const float ir = inv_rms[r];
    for (int64_t c = 0; c < n; ++c) {
      g[c] = dyr[c] * w[c];
      xh[c] = xr[c] * ir;
    }
    const float mean_gx = canonical_dot(g.data(), xh.data(), n) * inv_n;
    float* dxr = dx + r * n;
    for (int64_t c = 0; c < n; ++c) dxr[c] = ir * (g[c] - xh[c] * mean_gx);
  }
}

// dw: a column reduction over rows, so threads split the columns and each column is one fma chain
// over rows 0..R-1 in order, from +0 or (accumulate) from dw's value.
void rmsnorm_weight_grad(const float* x, const float* inv_rms, const float* dy, float* dw, int64_t R, int64_t n,
                         ThreadPool* pool, bool accumulate) {
  if (const simd::SimdOps* fast = simd_path()) {
    run(pool, n, 64,
        [&](int64_t cb, int64_t ce) { fast->rmsnorm_dw_cols(x, inv_rms, dy, dw, R, n, cb, ce, accumulate); });
    return;
  }
  run(pool, n, 64, [&](int64_t cb, int64_t ce) {
    if (!accumulate)
      for (int64_t c = cb; c < ce; ++c) dw[c] = 0.0f;
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = x + r * n;
      const float* dyr = dy + r * n;
      const float ir = inv_rms[r];
      for (int64_t c = cb; c < ce; ++c) dw[c] = std::fma(dyr[c], xr[c] * ir, dw[c]);
    }
  });
}
}  // namespace

void rmsnorm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx, float* dw,
                      int64_t R, int64_t n, ThreadPool* pool, bool accumulate) {
  run(pool, R, 16, [&](int64_t b, int64_t e) { rmsnorm_backward_rows(x, w, inv_rms, dy, dx, b, e, n); });
  rmsnorm_weight_grad(x, inv_rms, dy, dw, R, n, pool, accumulate);
}

// ---------------------------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------------------------

RopeTable make_rope_table(int64_t seq_len, int64_t head_dim, double theta) {
  return make_rope_table(seq_len, head_dim, theta, RopeScaling{});
}

RopeTable make_rope_table(int64_t seq_len, int64_t head_dim, double theta, const RopeScaling& scaling) {
  RopeTable t;
  t.seq_len = seq_len;
  t.head_dim = head_dim;
  const int64_t half = head_dim / 2;
  // YaRN's ramp bounds, in Python doubles as OLMo-core takes them: the dimension at which the old context makes
  // n_rot rotations, floored (beta_fast) and ceiled (beta_slow), clamped to [0, half - 1].
  auto dim_from_rot = [&](int64_t n_rot) {
    return static_cast<double>(head_dim) *
           det::log(static_cast<double>(scaling.old_context_len) / (static_cast<double>(n_rot) * 2.0 * 3.141592653589793)) /
           (2.0 * det::log(theta));
  };
  const int64_t low = std::max<int64_t>(static_cast<int64_t>(std::floor(dim_from_rot(scaling.beta_fast))), 0);
  const int64_t high = std::min<int64_t>(static_cast<int64_t>(std::ceil(dim_from_rot(scaling.beta_slow))), half - 1);
  const float span = high - low >= 1 ? static_cast<float>(high - low) : 1e-3f;
  const float factor = static_cast<float>(scaling.factor);
  const float attention = static_cast<float>(scaling.attention_factor());
  t.cos.resize(static_cast<size_t>(seq_len * half));
  t.sin.resize(static_cast<size_t>(seq_len * half));
  for (int64_t j = 0; j < half; ++j) {
    const float expo = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    const float pw = static_cast<float>(det::pow(theta, static_cast<double>(expo)));
    float inv_freq = 1.0f / pw;
    if (scaling.on()) {
      // 0: the base frequency (extrapolation), 1: the interpolated one; each fp32 operation rounded, as torch does.
      const float ramp = std::clamp((static_cast<float>(j) - static_cast<float>(low)) / span, 0.0f, 1.0f);
      inv_freq = (inv_freq / factor) * ramp + inv_freq * (1.0f - ramp);
    }
    for (int64_t pos = 0; pos < seq_len; ++pos) {
      const float angle = static_cast<float>(pos) * inv_freq;
      float c = static_cast<float>(det::cos(static_cast<double>(angle)));
      float s = static_cast<float>(det::sin(static_cast<double>(angle)));
      if (scaling.on()) c *= attention, s *= attention;
      t.cos[pos * half + j] = c;
      t.sin[pos * half + j] = s;
    }
  }
  return t;
}

// out_lo = x_lo·c − x_hi·s,  out_hi = x_hi·c + x_lo·s  (each product rounded, then the sum: as PyTorch).
namespace {
// One row [n_heads · hd] in place with its position's table rows c, s [hd/2].
template <bool kBackward>
void rope_row(float* x, int64_t n_heads, int64_t hd, const float* c, const float* s) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* lo = x + h * hd;
    float* hi = lo + half;
    for (int64_t j = 0; j < half; ++j) {
      if constexpr (kBackward) elem::rope_pair_backward(lo[j], hi[j], c[j], s[j]);
      else elem::rope_pair_forward(lo[j], hi[j], c[j], s[j]);
    }
  }
}

template <bool kBackward>
void rope_apply(float* x, int64_t rows, int64_t n_heads, int64_t T, int64_t hd, const float* cos, const float* sin,
                ThreadPool* pool, const int32_t* positions) {
  const int64_t half = hd / 2;
  run(pool, rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t pos = elem::rope_position(positions, r, T);
      rope_row<kBackward>(x + r * n_heads * hd, n_heads, hd, cos + pos * half, sin + pos * half);
    }
  });
}
}  // namespace

void rmsnorm_rope_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t R, int64_t n_heads,
                          int64_t T, int64_t hd, const float* cos, const float* sin, float eps, bool bf16,
                          ThreadPool* pool, const int32_t* positions) {
  const int64_t n = n_heads * hd, half = hd / 2;
  // Row by row, so the rotation and its rounding find the normed row still in cache.
  run(pool, R, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      rmsnorm_rows(nullptr, x, w, y, inv_rms, r, r + 1, n, eps, bf16);
      float* yr = y + r * n;
      const int64_t pos = elem::rope_position(positions, r, T);
      rope_row<false>(yr, n_heads, hd, cos + pos * half, sin + pos * half);
      for (int64_t c = 0; c < n; ++c) yr[c] = elem::as_stored(yr[c], bf16, elem::RoundBf16{});
    }
  });
}

void rope_rmsnorm_backward(const float* x, const float* w, const float* inv_rms, float* dy, float* dx, float* dw,
                           int64_t R, int64_t n_heads, int64_t T, int64_t hd, const float* cos, const float* sin,
                           bool bf16, ThreadPool* pool, const int32_t* positions, bool accumulate) {
  const int64_t n = n_heads * hd, half = hd / 2;
  // A chunk's rows are rotated back and rounded, then normed backward while still in cache.
  run(pool, R, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* dyr = dy + r * n;
      const int64_t pos = elem::rope_position(positions, r, T);
      rope_row<true>(dyr, n_heads, hd, cos + pos * half, sin + pos * half);
      for (int64_t c = 0; c < n; ++c) dyr[c] = elem::as_stored(dyr[c], bf16, elem::RoundBf16{});
    }
    rmsnorm_backward_rows(x, w, inv_rms, dy, dx, b, e, n);
  });
  rmsnorm_weight_grad(x, inv_rms, dy, dw, R, n, pool, accumulate);
}

void rope_forward(float* x, int64_t rows, int64_t n_heads, int64_t T, int64_t hd, const float* cos, const float* sin,
                  ThreadPool* pool, const int32_t* positions) {
  rope_apply<false>(x, rows, n_heads, T, hd, cos, sin, pool, positions);
}
void rope_backward(float* dx, int64_t rows, int64_t n_heads, int64_t T, int64_t hd, const float* cos,
                   const float* sin, ThreadPool* pool, const int32_t* positions) {
  rope_apply<true>(dx, rows, n_heads, T, hd, cos, sin, pool, positions);
}
void rope_forward(float* x, int64_t rows, int64_t n_heads, const RopeTable& t, ThreadPool* pool) {
  rope_forward(x, rows, n_heads, t.seq_len, t.head_dim, t.cos.data(), t.sin.data(), pool);
}
void rope_backward(float* dx, int64_t rows, int64_t n_heads, const RopeTable& t, ThreadPool* pool) {
  rope_backward(dx, rows, n_heads, t.seq_len, t.head_dim, t.cos.data(), t.sin.data(), pool);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU
// ---------------------------------------------------------------------------------------------

void swiglu_forward(const float* g, const float* u, float* a, int64_t n, ThreadPool* pool) {
  if (const simd::SimdOps* fast = simd_path()) {
    run(pool, n, 4096, [&](int64_t b, int64_t e) { fast->swiglu_forward(g + b, u + b, a + b, e - b); });
    return;
  }
  run(pool, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) a[i] = elem::swiglu_forward(g[i], u[i]);
  });
}

// silu'(g) = σ(g)·(1 + g·(1 − σ(g))).
void swiglu_backward(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                     ThreadPool* pool) {
  if (const simd::SimdOps* fast = simd_path()) {
    run(pool, n, 4096, [&](int64_t b, int64_t e) { fast->swiglu_backward(g + b, u + b, da + b, dg + b, du + b, e - b); });
    return;
  }
  run(pool, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) elem::swiglu_backward(g[i], u[i], da[i], dg[i], du[i]);
  });
}

// PyTorch on bf16 tensors: F.silu(g) is one bf16 tensor, `* u` another; their backward kernels compute in
// fp32 and round each result once (docs/canonical/bf16.md).
void swiglu_forward_bf16(const float* g, const float* u, float* a, int64_t n, ThreadPool* pool) {
  run(pool, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) a[i] = elem::swiglu_forward_bf16(g[i], u[i]);
  });
}

void swiglu_backward_bf16(const float* g, const float* u, const float* da, float* dg, float* du, int64_t n,
                          ThreadPool* pool) {
  run(pool, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) elem::swiglu_backward_bf16(g[i], u[i], da[i], dg[i], du[i]);
  });
}

namespace {

// The SwiGLU epilogues' operands: the other tensors at the product's output positions, row stride ld.
struct SwigluEpilogue {
  const float* g;
  const float* u;  // backward only (forward: u is the product itself)
  float* out;      // forward: a; backward: du
  int64_t ld;
  bool bf16;
  const simd::SimdOps* fast;
};

// u_row: the finished product u[i, j0 .. j0+n).
void swiglu_forward_epilogue(const void* ctx, float* u_row, int64_t i, int64_t j0, int64_t n) {
  const auto& e = *static_cast<const SwigluEpilogue*>(ctx);
  const float* g = e.g + i * e.ld + j0;
  float* a = e.out + i * e.ld + j0;
  // The SIMD lanes compute fp32 SwiGLU with swiglu_forward's operations; bf16 stays scalar, as the unfused op.
  if (e.fast && !e.bf16) {
    e.fast->swiglu_forward(g, u_row, a, n);
    return;
  }
  for (int64_t j = 0; j < n; ++j) a[j] = elem::swiglu_forward_from_product(g[j], u_row[j], e.bf16);
}

// da_row: the finished product da[i, j0 .. j0+n), held in dg's storage and replaced by dg.
void swiglu_backward_epilogue(const void* ctx, float* da_row, int64_t i, int64_t j0, int64_t n) {
  const auto& e = *static_cast<const SwigluEpilogue*>(ctx);
  const float* g = e.g + i * e.ld + j0;
  const float* u = e.u + i * e.ld + j0;
  float* du = e.out + i * e.ld + j0;
  if (e.fast && !e.bf16) {
    // In place is safe: each vector of da is loaded before the dg of the same lanes is stored.
    e.fast->swiglu_backward(g, u, da_row, da_row, du, n);
    return;
  }
  for (int64_t j = 0; j < n; ++j) elem::swiglu_backward_from_product(g[j], u[j], da_row[j], e.bf16, da_row[j], du[j]);
}

}  // namespace

void matmul_forward_swiglu(const float* X, const float* W3, const float* g, float* u, float* a, int64_t M, int64_t N,
                           int64_t K, bool bf16, ThreadPool* pool) {
  const SwigluEpilogue ctx{g, nullptr, a, N, bf16, simd_path()};
  const GemmEpilogue epi{&swiglu_forward_epilogue, &ctx};
  matmul_forward(X, W3, u, M, N, K, pool, &epi);
}

void matmul_backward_input_swiglu(const float* dY, const float* W2, const float* g, const float* u, float* dg, float* du,
                                  int64_t M, int64_t N, int64_t K, bool bf16, ThreadPool* pool) {
  const SwigluEpilogue ctx{g, u, du, K, bf16, simd_path()};
  const GemmEpilogue epi{&swiglu_backward_epilogue, &ctx};
  matmul_backward_input(dY, W2, dg, M, N, K, false, pool, &epi);
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------
//
// Per (instance b, head h, query i), keys j in [lo(i), i], lo(i) = max(0, i - window + 1), raised to the start of
// i's document under intra-document masking (core/attention_band.h):
//   s_j = (Σ_d q_d k_jd, one fma chain over d) · scale
//   m = max_j s_j;   e_j = expf(s_j − m);   l = canonical_sum(e, lane = j − lo);   P_j = e_j / l
//   out_d = Σ_j P_j v_jd, one fma chain over j ascending.
// Backward recomputes P_j with exactly the same operations, so it sees the forward's bits.

namespace {

// Scores of query row qi (hd) against keys [lo, hi] of one head; kt is that head's keys transposed,
// [hd, T], so the chain over d runs in the outer loop while keys are vectorised.
void scores_row(const float* qi, const float* kt, int64_t T, int64_t hd, int64_t lo, int64_t hi, float scale,
                float* s) {
  const int64_t n = hi - lo + 1;
  for (int64_t j = 0; j < n; ++j) s[j] = 0.0f;
  for (int64_t d = 0; d < hd; ++d) {
    const float qd = qi[d];
    const float* kd = kt + d * T + lo;
    for (int64_t j = 0; j < n; ++j) s[j] = std::fma(qd, kd[j], s[j]);
  }
  for (int64_t j = 0; j < n; ++j) s[j] = s[j] * scale;
}

// P_j from scores, given the row's max and denominator (forward computes them first).
void probs_from_scores(float* s, int64_t n, float m, float l) {
  for (int64_t j = 0; j < n; ++j) s[j] = det::expf(s[j] - m) / l;
}

// Transposes one head of x [B*T, heads*hd] for instance b into xt [hd, T].
void transpose_head(const float* x, int64_t b, int64_t T, int64_t width, int64_t head, int64_t hd, float* xt) {
  for (int64_t t = 0; t < T; ++t) {
    const float* src = x + (b * T + t) * width + head * hd;
    for (int64_t d = 0; d < hd; ++d) xt[d * T + t] = src[d];
  }
}

// out[0:hd] = Σ_j w[j] · rows[j·stride + 0:hd] for j = 0..n-1: one fmaf chain per element, in j order, kept in
// `acc` (hd floats of scratch) until it is stored.
void weighted_rows(const float* w, int64_t n, const float* rows, int64_t stride, int64_t hd, float* acc, float* out) {
  for (int64_t d = 0; d < hd; ++d) acc[d] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float wj = w[j];
    const float* row = rows + j * stride;
    for (int64_t d = 0; d < hd; ++d) acc[d] = std::fma(wj, row[d], acc[d]);
  }
  for (int64_t d = 0; d < hd; ++d) out[d] = acc[d];
}

// The SIMD path for this shape, if any: a head dim of whole registers (at most 16 of them).
const simd::SimdOps* attention_simd_path(const AttentionShape& s) {
  const simd::SimdOps* fast = simd_path();
  if (!fast || s.hd % fast->lanes != 0 || s.hd / fast->lanes > 16) return nullptr;
  return fast;
}

}  // namespace

void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                       float* row_max, float* row_sum, ThreadPool* pool) {
  check_attention_parts(s);
  if (const simd::SimdOps* fast = attention_simd_path(s)) {
    run(pool, s.B * s.H, 1, [&](int64_t tb, int64_t te) {
      std::vector<float> scratch(fast->attention_forward_scratch(s));
      fast->attention_forward(s, q, k, v, out, row_max, row_sum, tb, te, scratch.data());
    });
    return;
  }
  const int64_t T = s.T, hd = s.hd, qw = s.H * hd, kw = s.KV * hd, group = s.H / s.KV;
  run(pool, s.B * s.H, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> kt(static_cast<size_t>(hd * T)), sc(static_cast<size_t>(T)), acc(static_cast<size_t>(hd));
    for (int64_t task = tb; task < te; ++task) {
      const int64_t b = task / s.H, h = task % s.H, g = h / group;
      transpose_head(k, b, T, kw, g, hd, kt.data());
      for (int64_t i = s.q_begin; i < s.query_end(); ++i) {
        const int64_t lo = attention_key_lo(s.window, s.doc_start, T, b, i), n = i - lo + 1;
        const float* qi = q + (b * T + i) * qw + h * hd;
        scores_row(qi, kt.data(), T, hd, lo, i, s.scale, sc.data());
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, sc[j]);
        for (int64_t j = 0; j < n; ++j) sc[j] = det::expf(sc[j] - m);
        const float l = canonical_sum(sc.data(), n);
        for (int64_t j = 0; j < n; ++j) sc[j] = sc[j] / l;
        if (s.precision == Precision::bf16)  // P enters the P·V product as a bf16 operand
          for (int64_t j = 0; j < n; ++j) sc[j] = round_bf16(sc[j]);
        row_max[(b * s.H + h) * T + i] = m;
        row_sum[(b * s.H + h) * T + i] = l;
        // o_i = Σ_j P_ij v_j
        float* oi = out + (b * T + i) * qw + h * hd;
        weighted_rows(sc.data(), n, v + (b * T + lo) * kw + g * hd, kw, hd, acc.data(), oi);
      }
    }
  });
}

// Backward, per (b, h), with P and dS·scale materialised for the head ([T, T] scratch, band only):
//   dP_ij = Σ_d dO_id v_jd (chain over d);  D_i = Σ_d dO_id O_id (chain over d)
//   dsc_ij = (P_ij · (dP_ij − D_i)) · scale
//   dq_id  = Σ_j dsc_ij k_jd        (chain over j ascending)
//   dk_h,jd = Σ_i dsc_ij q_id       (chain over i ascending)   per query head, then
//   dv_h,jd = Σ_i P_ij dO_id        (chain over i ascending)   per query head, then
//   dk_g = ((dk_h0 + dk_h1) + ...) over the heads of KV group g in ascending order (plain adds).
void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* out,
                        const float* row_max, const float* row_sum, const float* dout, float* dq, float* dk,
                        float* dv, ThreadPool* pool) {
  check_attention_parts(s);
  const int64_t T = s.T, hd = s.hd, qw = s.H * hd, kw = s.KV * hd, group = s.H / s.KV;
  const int64_t q_end = s.query_end(), k_end = s.key_end();
  const bool bf16 = s.precision == Precision::bf16;
  // Per-query-head dk/dv before the group sum: [B, H, T, hd].
  std::vector<float> dk_head(static_cast<size_t>(s.B * s.H * T * hd));
  std::vector<float> dv_head(static_cast<size_t>(s.B * s.H * T * hd));
  if (const simd::SimdOps* fast = attention_simd_path(s)) {
    run(pool, s.B * s.H, 1, [&](int64_t tb, int64_t te) {
      std::vector<float> scratch(fast->attention_backward_scratch(s));
      fast->attention_backward(s, q, k, v, out, row_max, row_sum, dout, dq, dk_head.data(), dv_head.data(), tb, te,
                               scratch.data());
    });
  } else {  // the scalar definition
  run(pool, s.B * s.H, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> kt(static_cast<size_t>(hd * T)), vt(static_cast<size_t>(hd * T));
    std::vector<float> P(static_cast<size_t>(T * T)), dS(static_cast<size_t>(T * T));
    std::vector<float> dp(static_cast<size_t>(T)), acc(static_cast<size_t>(hd));
    for (int64_t task = tb; task < te; ++task) {
      const int64_t b = task / s.H, h = task % s.H, g = h / group;
      transpose_head(k, b, T, kw, g, hd, kt.data());
      transpose_head(v, b, T, kw, g, hd, vt.data());
      const AttentionQueries rows =
          attention_backward_queries(s.window, s.doc_end, T, b, s.q_begin, q_end, s.k_begin, k_end);
      for (int64_t i = rows.begin; i < rows.end; ++i) {
        const int64_t lo = attention_key_lo(s.window, s.doc_start, T, b, i), n = i - lo + 1;
        const float* qi = q + (b * T + i) * qw + h * hd;
        const float* doi = dout + (b * T + i) * qw + h * hd;
        const float* oi = out + (b * T + i) * qw + h * hd;
        float* Pi = P.data() + i * T + lo;  // row i, columns lo..i
        scores_row(qi, kt.data(), T, hd, lo, i, s.scale, Pi);
        probs_from_scores(Pi, n, row_max[(b * s.H + h) * T + i], row_sum[(b * s.H + h) * T + i]);
        // dP over the band, keys vectorised (vt is [hd, T]).
        for (int64_t j = 0; j < n; ++j) dp[j] = 0.0f;
        for (int64_t d = 0; d < hd; ++d) {
          const float g_d = doi[d];
          const float* vd = vt.data() + d * T + lo;
          for (int64_t j = 0; j < n; ++j) dp[j] = std::fma(g_d, vd[j], dp[j]);
        }
        const float D = chain_dot(doi, oi, hd);
        float* dSi = dS.data() + i * T + lo;
        for (int64_t j = 0; j < n; ++j) dSi[j] = (Pi[j] * (dp[j] - D)) * s.scale;
        if (bf16) {  // dS and P enter the dq/dk/dv products as bf16 operands (P after its fp32 use above)
          for (int64_t j = 0; j < n; ++j) {
            dSi[j] = round_bf16(dSi[j]);
            Pi[j] = round_bf16(Pi[j]);
          }
        }
        if (i < s.q_begin || i >= q_end) continue;  // P and dS only, for the keys below
        // dq_i = Σ_j dsc_ij k_j
        float* dqi = dq + (b * T + i) * qw + h * hd;
        weighted_rows(dSi, n, k + (b * T + lo) * kw + g * hd, kw, hd, acc.data(), dqi);
        if (bf16)
          for (int64_t d = 0; d < hd; ++d) dqi[d] = round_bf16(dqi[d]);
      }
      // Per key j: queries i in [j, hi(j)] see it, hi(j) = j + window - 1 (or T-1 for full attention), lowered to the
      // end of j's document under intra-document masking.
      float* dkh = dk_head.data() + (b * s.H + h) * T * hd;
      float* dvh = dv_head.data() + (b * s.H + h) * T * hd;
      for (int64_t j = s.k_begin; j < k_end; ++j) {
        const int64_t hi = attention_query_hi(s.window, s.doc_end, T, b, j);
        float* dkj = dkh + j * hd;
        float* dvj = dvh + j * hd;
        for (int64_t d = 0; d < hd; ++d) {
          dkj[d] = 0.0f;
          dvj[d] = 0.0f;
        }
        for (int64_t i = j; i <= hi; ++i) {
          const float c = dS[i * T + j], p = P[i * T + j];
          const float* qi = q + (b * T + i) * qw + h * hd;
          const float* doi = dout + (b * T + i) * qw + h * hd;
          for (int64_t d = 0; d < hd; ++d) {
            dkj[d] = std::fma(c, qi[d], dkj[d]);
            dvj[d] = std::fma(p, doi[d], dvj[d]);
          }
        }
        if (bf16) {  // per query head, as flash-attn's bf16 dk/dv_expanded before the GQA sum
          for (int64_t d = 0; d < hd; ++d) {
            dkj[d] = round_bf16(dkj[d]);
            dvj[d] = round_bf16(dvj[d]);
          }
        }
      }
    }
  });
  }
  // Group sum over query heads, ascending.
  run(pool, s.B * T, 16, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const int64_t b = r / T, t = r % T;
      if (t < s.k_begin || t >= k_end) continue;
      for (int64_t g = 0; g < s.KV; ++g) {
        float* dkr = dk + r * kw + g * hd;
        float* dvr = dv + r * kw + g * hd;
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t h = g * group + hh;
          const float* sk = dk_head.data() + ((b * s.H + h) * T + t) * hd;
          const float* sv = dv_head.data() + ((b * s.H + h) * T + t) * hd;
          for (int64_t d = 0; d < hd; ++d) {
            dkr[d] = hh == 0 ? sk[d] : dkr[d] + sk[d];
            dvr[d] = hh == 0 ? sv[d] : dvr[d] + sv[d];
          }
        }
        if (bf16) {
          for (int64_t d = 0; d < hd; ++d) {
            dkr[d] = round_bf16(dkr[d]);
            dvr[d] = round_bf16(dvr[d]);
          }
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Embedding
// ---------------------------------------------------------------------------------------------

void embedding_forward(const float* table, const uint32_t* tokens, float* x, int64_t R, int64_t d, ThreadPool* pool) {
  run(pool, R, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) std::memcpy(x + r * d, table + static_cast<int64_t>(tokens[r]) * d, d * sizeof(float));
  });
}

void embedding_backward(const uint32_t* tokens, const float* dx, float* dtable, int64_t R, int64_t V, int64_t d,
                        ThreadPool* pool, bool accumulate) {
  std::vector<int64_t> start, order;
  embedding_position_order(tokens, R, V, start, order);
  run(pool, V, 64, [&](int64_t vb, int64_t ve) {
    for (int64_t v = vb; v < ve; ++v) {
      for (int64_t c = 0; c < d; ++c) {
        float& row = dtable[v * d + c];
        row = elem::embedding_grad(start.data(), order.data(), dx, v, c, d, accumulate ? row : 0.0f);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy with z-loss
// ---------------------------------------------------------------------------------------------
//
// Per valid row with target y:  m = max_v x_v;  e_v = expf(x_v − m);  S = canonical_sum(e);
//   lse = m + logf(S);  ce = lse − x_y;  z = z_coef · lse² (fp64);
//   ∂/∂x_v = (p_v · (1 + 2·z_coef·lse) − [v = y]) · (1/N),  p_v = e_v / S,  N = global target count.
// Rows without a target get a zero gradient. Per-row terms are summed with canonical_sum_f64.

void cross_entropy_rows(float* logits, const uint32_t* tokens, int64_t t0, int64_t rows, int64_t T, int64_t V,
                        float z_coef, int64_t global_n_targets, double* ce_terms, double* z_terms, ThreadPool* pool) {
  const float inv_n = 1.0f / static_cast<float>(global_n_targets);
  const simd::SimdOps* fast = simd_path();
  run(pool, rows, 4, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      float* x = logits + r * V;
      const int64_t t = t0 + r;
      if (t == T - 1) {
        for (int64_t v = 0; v < V; ++v) x[v] = 0.0f;
        ce_terms[r] = 0.0, z_terms[r] = 0.0;
        continue;
      }
      const int64_t y = tokens[t + 1];
      float m, S;
      const float xy = x[y];
      if (fast) {
        S = fast->exp_shift_sum(x, V, &m);
      } else {
        m = -std::numeric_limits<float>::infinity();
        for (int64_t v = 0; v < V; ++v) m = std::max(m, x[v]);
        for (int64_t v = 0; v < V; ++v) x[v] = det::expf(x[v] - m);
        S = canonical_sum(x, V);
      }
      const float lse = m + det::logf(S);
      ce_terms[r] = static_cast<double>(lse - xy);
      z_terms[r] = static_cast<double>(z_coef) * static_cast<double>(lse) * static_cast<double>(lse);
      const float coef = 1.0f + 2.0f * z_coef * lse;
      const float ey = x[y];
      if (fast) fast->scale_probs(x, V, S, coef, inv_n);
      else
        for (int64_t v = 0; v < V; ++v) x[v] = ((x[v] / S) * coef) * inv_n;
      x[y] = ((ey / S) * coef - 1.0f) * inv_n;
    }
  });
}

LossSums cross_entropy_forward_backward(float* logits, const uint32_t* tokens, int64_t B, int64_t T, int64_t V,
                                        float z_coef, int64_t global_n_targets, ThreadPool* pool) {
  const int64_t R = B * T;
  std::vector<double> ce_terms(static_cast<size_t>(R)), z_terms(static_cast<size_t>(R));
  for (int64_t b = 0; b < B; ++b)
    cross_entropy_rows(logits + b * T * V, tokens + b * T, 0, T, T, V, z_coef, global_n_targets,
                       ce_terms.data() + b * T, z_terms.data() + b * T, pool);
  LossSums sums;
  sums.ce = canonical_sum_f64(ce_terms.data(), R);
  sums.z = canonical_sum_f64(z_terms.data(), R);
  sums.n_targets = B * (T - 1);
  return sums;
}

// ---------------------------------------------------------------------------------------------
// The instance tree's add

void tree_add(float* dst, const float* src, int64_t n, ThreadPool* pool) {
  auto body = [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) dst[i] = dst[i] + src[i];
  };
  if (pool && n >= (1 << 16)) pool->parallel_for(n, 1 << 15, body);
  else body(0, n);
}

}  // namespace olmoref
