#include "ref/optim.h"

#include <algorithm>
#include <cmath>

#include "ref/elementwise.h"
#include "ref/mathfn.h"
#include "ref/parallel.h"
#include "ref/reduce.h"

namespace olmoref {

namespace {
// x^n by binary exponentiation: a fixed sequence of IEEE multiplications, so the same bits on every
// platform (libm's pow makes no such promise).
double powi(double x, int64_t n) {
  double result = 1.0;
  while (n > 0) {
    if (n & 1) result *= x;
    x *= x;
    n >>= 1;
  }
  return result;
}
}  // namespace

void adamw_step(const AdamWConfig& cfg, const ParamLayout& layout, int64_t step, double lr, float* params,
                const float* grad, float* m, float* v, ThreadPool* pool) {
  adamw_step_range(cfg, layout, step, lr, 0, layout.total, params, grad, m, v, pool);
}

elem::AdamWScalars adamw_scalars(const AdamWConfig& cfg, int64_t step, double lr) {
  // Scalars are formed in fp64 and rounded once, as PyTorch passes Python floats into fp32 kernels.
  const double bc1 = 1.0 - powi(cfg.beta1, step);
  const double bc2 = 1.0 - powi(cfg.beta2, step);
  return {static_cast<float>(lr / bc1),      static_cast<float>(std::sqrt(bc2)), static_cast<float>(1.0 - cfg.beta1),
          static_cast<float>(cfg.beta2),     static_cast<float>(1.0 - cfg.beta2), static_cast<float>(cfg.eps)};
}

float adamw_decay(const AdamWConfig& cfg, const ParamInfo& p, double lr) {
  return p.weight_decay ? static_cast<float>(1.0 - lr * cfg.weight_decay) : 1.0f;
}

std::vector<AdamWPiece> adamw_pieces(const AdamWConfig& cfg, const ParamLayout& layout, int64_t lo, int64_t hi,
                                     double lr) {
  std::vector<AdamWPiece> out;
  for (const ParamInfo& p : layout.params) {
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a < b) out.push_back({a - lo, b - a, adamw_decay(cfg, p, lr)});
  }
  return out;
}

void adamw_elements(const elem::AdamWScalars& s, float decay, const float* grad, float* p, float* m, float* v,
                    int64_t n, ThreadPool* pool) {
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) elem::adamw(s, decay, grad[i], p[i], m[i], v[i]);
  };
  if (pool) pool->parallel_for(n, 1 << 14, body); else body(0, n);
}

void adamw_step_range(const AdamWConfig& cfg, const ParamLayout& layout, int64_t step, double lr, int64_t lo,
                      int64_t hi, float* params, const float* grad, float* m, float* v, ThreadPool* pool) {
  const elem::AdamWScalars s = adamw_scalars(cfg, step, lr);
  for (const AdamWPiece& q : adamw_pieces(cfg, layout, lo, hi, lr))
    adamw_elements(s, q.decay, grad + q.begin, params + q.begin, m + q.begin, v + q.begin, q.n, pool);
}

void grad_norm_chunks(const float* grad, int64_t n, int64_t c0, int64_t c1, double* out, ThreadPool* pool) {
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = (c0 + c) * kNormChunk, hi = std::min(n, lo + kNormChunk);
      out[c] = canonical_sumsq_f64(grad + lo, hi - lo);
    }
  };
  if (pool) pool->parallel_for(c1 - c0, 1, body); else body(0, c1 - c0);
}

double grad_norm(const float* grad, int64_t n, ThreadPool* pool) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
  grad_norm_chunks(grad, n, 0, chunks, part.data(), pool);
  double total = 0.0;
  for (double x : part) total += x;
  return std::sqrt(total);
}

int64_t count_zeros(const float* x, int64_t n, ThreadPool* pool) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<int64_t> part(static_cast<size_t>(chunks), 0);
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = c * kNormChunk, hi = std::min(n, lo + kNormChunk);
      int64_t z = 0;
      for (int64_t i = lo; i < hi; ++i) z += x[i] == 0.0f;
      part[static_cast<size_t>(c)] = z;
    }
  };
  if (pool) pool->parallel_for(chunks, 1, body); else body(0, chunks);
  int64_t total = 0;
  for (int64_t z : part) total += z;
  return total;
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

void scale_inplace(float* x, int64_t n, float s, ThreadPool* pool) {
  if (s == 1.0f) return;
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = x[i] * s;
  };
  if (pool) pool->parallel_for(n, 1 << 14, body); else body(0, n);
}

double scheduled_lr(const ScheduleConfig& s, double peak_lr, int64_t step, int64_t total_steps) {
  if (step < s.warmup) return peak_lr * static_cast<double>(step) / static_cast<double>(s.warmup);
  if (s.kind == "constant") return peak_lr;
  // OLMo-core CosWithWarmup: after warmup, cosine from peak to peak·alpha_f over t_max − warmup steps.
  const double t_max = static_cast<double>(s.t_max > 0 ? s.t_max : total_steps);
  const double lr_min = peak_lr * s.alpha_f;
  const double w = static_cast<double>(s.warmup);
  const double cur = static_cast<double>(step) - w, span = t_max - w;
  if (span <= 0.0 || cur >= span) return lr_min;
  return lr_min + (peak_lr - lr_min) * (1.0 + det::cos(3.141592653589793 * cur / span)) / 2.0;
}

}  // namespace olmoref
