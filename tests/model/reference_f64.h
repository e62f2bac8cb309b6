// tests/model/reference_f64.h — an independent, naive fp64 implementation of the Olmo 3 forward pass
// and loss, written straight from the spec (no shared code with ref/ beyond the parameter layout).
// Gradient checks take central finite differences of it in double precision.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/model_config.h"
#include "core/params.h"

namespace olmoref::testing {

using Vec = std::vector<double>;

inline Vec to64(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// d/dx of f at x (fp64), central differences.
inline Vec finite_diff(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// ||ours − ref|| / ||ref||, the figure the gradient checks bound.
inline double rel_err(const float* ours, const Vec& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (ours[i] - ref[i]) * (ours[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline double dot64(const Vec& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// y[r, :] = w ⊙ x[r, :] / sqrt(mean(x²) + eps)
inline Vec rmsnorm64(const Vec& x, const double* w, int64_t R, int64_t n, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < n; ++c) ss += x[r * n + c] * x[r * n + c];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t c = 0; c < n; ++c) y[r * n + c] = w[c] * (x[r * n + c] * inv);
  }
  return y;
}

// Y[R, N] = X[R, K] · W[N, K]ᵀ
inline Vec linear64(const Vec& x, const double* w, int64_t R, int64_t N, int64_t K) {
  Vec y(static_cast<size_t>(R * N), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += x[r * K + k] * w[n * K + k];
      y[r * N + n] = acc;
    }
  return y;
}

// Rotate-half RoPE at positions r % T, inv_freq = θ^(-2j/hd).
inline void rope64(Vec& x, int64_t R, int64_t T, int64_t heads, int64_t hd, double theta) {
  const int64_t half = hd / 2;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < half; ++j) {
        const double ang = static_cast<double>(r % T) * std::pow(theta, -2.0 * j / hd);
        double& a = x[r * heads * hd + h * hd + j];
        double& b = x[r * heads * hd + h * hd + j + half];
        const double na = a * std::cos(ang) - b * std::sin(ang), nb = b * std::cos(ang) + a * std::sin(ang);
        a = na;
        b = nb;
      }
}

// Causal attention, window counting the query itself (0 = full), GQA head h uses kv head h / (H/KV).
inline Vec attention64(const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t hd, int64_t window) {
  Vec out(q.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t lo = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        std::vector<double> s;
        double m = -1e300;
        for (int64_t j = lo; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < hd; ++d) acc += q[(b * T + i) * H * hd + h * hd + d] * k[(b * T + j) * KV * hd + g * hd + d];
          s.push_back(acc * scale);
          m = std::max(m, acc * scale);
        }
        double l = 0;
        for (double& x : s) l += (x = std::exp(x - m));
        for (int64_t j = lo; j <= i; ++j)
          for (int64_t d = 0; d < hd; ++d)
            out[(b * T + i) * H * hd + h * hd + d] += s[j - lo] / l * v[(b * T + j) * KV * hd + g * hd + d];
      }
    }
  return out;
}

inline double silu64(double x) { return x / (1.0 + std::exp(-x)); }

// (Σ ce + z_coef Σ lse²) / n_targets over shifted labels; last position of each instance ignored.
inline double loss_from_logits64(const Vec& logits, const uint32_t* tokens, int64_t B, int64_t T, int64_t V,
                                 double z_coef, double n_targets) {
  double total = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) {
      const double* x = logits.data() + (b * T + t) * V;
      double m = -1e300;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, x[v]);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(x[v] - m);
      const double lse = m + std::log(s);
      total += (lse - x[tokens[b * T + t + 1]]) + z_coef * lse * lse;
    }
  return total / n_targets;
}

// Smallest gap, over every row, between the k-th and (k+1)-th router score: finite differences are only
// meaningful where a perturbation cannot change the top-k set (gradient checks require it to be wide).
inline double& moe_min_gap64() {
  static double gap = 1e300;
  return gap;
}

// The mixture-of-experts feed-forward from OLMo-core's definition (dropless, softmax gating, the top-k weights
// optionally divided by their p-norm, optional shared expert mixed as shared/(k+1) + routed·k/(k+1)), on B instances of T rows h [B·T, d]; adds the
// weighted auxiliary-loss sums (load balancing over the configured unit: an instance, or all B·T rows as one
// micro-batch; router z-loss) to aux.
inline Vec moe64(const ModelConfig& cfg, const BlockOffsets& o, const Vec& p, const Vec& h, int64_t B, int64_t T,
                 double& aux) {
  const MoEConfig& m = cfg.moe;
  const int64_t R = B * T, d = cfg.d_model, E = m.n_experts, k = m.top_k, hh = m.hidden, Fs = m.shared_hidden;
  const double layers = m.scale_loss_by_num_layers ? static_cast<double>(cfg.n_layers) : 1.0;
  const double lb_coef = m.lb_loss_weight / layers * static_cast<double>(E) / static_cast<double>(k);
  const double z_coef = m.z_loss_weight / layers;
  const Vec logits = linear64(h, &p[o.moe_router], R, E, d);
  std::vector<double> norm(static_cast<size_t>(R), 1.0);  // the top-k weights' divisor (1: no normalisation)
  Vec scores(static_cast<size_t>(R * E));
  std::vector<int64_t> top(static_cast<size_t>(R * k));
  for (int64_t r = 0; r < R; ++r) {
    double mx = -1e300, s = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, logits[r * E + e]);
    for (int64_t e = 0; e < E; ++e) s += std::exp(logits[r * E + e] - mx);
    for (int64_t e = 0; e < E; ++e) scores[r * E + e] = std::exp(logits[r * E + e] - mx) / s;
    const double lse = mx + std::log(s);
    aux += z_coef * lse * lse;
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[r * E + a] > scores[r * E + b]; });
    for (int64_t j = 0; j < k; ++j) top[r * k + j] = order[j];
    if (m.normalize_expert_weights != 0) {
      double acc = 0;
      for (int64_t j = 0; j < k; ++j) acc += std::pow(scores[r * E + order[j]], m.normalize_expert_weights);
      norm[r] = std::pow(acc, 1.0 / m.normalize_expert_weights);
    }
    if (k < E) moe_min_gap64() = std::min(moe_min_gap64(), scores[r * E + order[k - 1]] - scores[r * E + order[k]]);
  }
  // Load balancing: per unit, Σ_e (choices of e in the unit) · (Σ_{r in unit} score[r, e]) / rows of the unit.
  const int64_t unit = m.lb_granularity == MoELbGranularity::instance ? T : R;
  for (int64_t u0 = 0; u0 < R; u0 += unit) {
    for (int64_t e = 0; e < E; ++e) {
      double c = 0, col = 0;
      for (int64_t r = u0; r < u0 + unit; ++r) {
        col += scores[r * E + e];
        for (int64_t j = 0; j < k; ++j) c += top[r * k + j] == e ? 1.0 : 0.0;
      }
      aux += lb_coef * c * col / static_cast<double>(unit);
    }
  }
  Vec f(static_cast<size_t>(R * d), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = top[r * k + j];
      const double w = scores[r * E + e] / norm[r];
      const double* w1 = &p[o.moe_w1 + e * hh * d];
      const double* w3 = &p[o.moe_w3 + e * hh * d];
      const double* w2 = &p[o.moe_w2 + e * hh * d];  // [h, d]: [in, out]
      for (int64_t i = 0; i < hh; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < d; ++c) g += w1[i * d + c] * h[r * d + c], u += w3[i * d + c] * h[r * d + c];
        const double a = silu64(g) * u;
        for (int64_t c = 0; c < d; ++c) f[r * d + c] += w * a * w2[i * d + c];
      }
    }
  if (Fs > 0) {
    Vec g = linear64(h, &p[o.shared_w1], R, Fs, d), u = linear64(h, &p[o.shared_w3], R, Fs, d);
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu64(g[i]) * u[i];
    const Vec sh = linear64(g, &p[o.shared_w2], R, d, Fs);
    for (size_t i = 0; i < f.size(); ++i)
      f[i] = sh[i] / static_cast<double>(k + 1) + f[i] * static_cast<double>(k) / static_cast<double>(k + 1);
  }
  return f;
}

inline double model_loss64(const ModelConfig& cfg, const ParamLayout& L, const Vec& p, const uint32_t* tokens,
                           int64_t B, int64_t T, double n_targets) {
  const int64_t d = cfg.d_model, R = B * T, qd = cfg.q_dim(), kd = cfg.kv_dim(), F = cfg.ffn_hidden, V = cfg.vocab_size;
  const double eps = cfg.norm_eps;
  double aux = 0;  // MoE: the weighted load-balancing and router z-loss sums, all layers
  Vec x(static_cast<size_t>(R * d));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < d; ++c) x[r * d + c] = p[L.embeddings + tokens[r] * d + c];
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const BlockOffsets& o = L.blocks[l];
    Vec q = rmsnorm64(linear64(x, &p[o.w_q], R, qd, d), &p[o.q_norm], R, qd, eps);
    Vec k = rmsnorm64(linear64(x, &p[o.w_k], R, kd, d), &p[o.k_norm], R, kd, eps);
    Vec v = linear64(x, &p[o.w_v], R, kd, d);
    rope64(q, R, T, cfg.n_heads, cfg.head_dim, cfg.rope_theta);
    rope64(k, R, T, cfg.n_kv_heads, cfg.head_dim, cfg.rope_theta);
    Vec att = attention64(q, k, v, B, T, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.window(l));
    Vec an = rmsnorm64(linear64(att, &p[o.w_out], R, d, qd), &p[o.attn_norm], R, d, eps);
    Vec h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = x[i] + an[i];
    Vec f;
    if (cfg.moe.enabled()) {
      f = moe64(cfg, o, p, h, B, T, aux);
    } else {
      Vec g = linear64(h, &p[o.w1], R, F, d), u = linear64(h, &p[o.w3], R, F, d);
      for (size_t i = 0; i < g.size(); ++i) g[i] = silu64(g[i]) * u[i];
      f = linear64(g, &p[o.w2], R, d, F);
    }
    Vec fn = rmsnorm64(f, &p[o.ffn_norm], R, d, eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] = h[i] + fn[i];
  }
  Vec hn = rmsnorm64(x, &p[L.final_norm], R, d, eps);
  Vec logits = linear64(hn, &p[L.lm_head], R, V, d);
  return loss_from_logits64(logits, tokens, B, T, V, 1e-5, n_targets) + aux / n_targets;
}

}  // namespace olmoref::testing
