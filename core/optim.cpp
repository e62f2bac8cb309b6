#include "core/optim.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/elementwise.h"
#include "core/mathfn.h"
#include "core/parallel.h"
#include "core/reduce.h"

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

float adamw_group_decay(double lr, double weight_decay) { return static_cast<float>(1.0 - lr * weight_decay); }

namespace {
// fnmatch.fnmatchcase's translation to a regex, matched directly: '*' any run (dots included), '?' one character,
// '[seq]' / '[!seq]' a set with ranges (a ']' right after the opening is literal), an unclosed '[' literal.
bool match_at(const std::string& p, size_t i, const std::string& s, size_t j) {
  while (i < p.size()) {
    const char c = p[i];
    if (c == '*') {
      while (i < p.size() && p[i] == '*') ++i;
      if (i == p.size()) return true;
      for (size_t k = j; k <= s.size(); ++k)
        if (match_at(p, i, s, k)) return true;
      return false;
    }
    if (c == '[') {
      size_t e = i + 1;
      if (e < p.size() && p[e] == '!') ++e;
      if (e < p.size() && p[e] == ']') ++e;
      while (e < p.size() && p[e] != ']') ++e;
      if (e < p.size()) {  // a set [i+1, e)
        if (j == s.size()) return false;
        size_t a = i + 1;
        const bool negate = p[a] == '!';
        if (negate) ++a;
        bool in = false;
        for (size_t k = a; k < e; ++k) {
          if (k + 2 < e && p[k + 1] == '-') {
            in |= p[k] <= s[j] && s[j] <= p[k + 2];
            k += 2;
          } else {
            in |= p[k] == s[j];
          }
        }
        if (in == negate) return false;
        i = e + 1;
        ++j;
        continue;
      }
      // no closing ']': a literal '['
    }
    if (j == s.size() || (c != '?' && c != s[j])) return false;
    ++i;
    ++j;
  }
  return j == s.size();
}
}  // namespace

bool fnmatch_name(const std::string& pattern, const std::string& name) { return match_at(pattern, 0, name, 0); }

std::vector<ParamGroup> param_groups(const AdamWConfig& cfg, const ParamLayout& layout) {
  std::vector<ParamGroupOverride> overrides = cfg.group_overrides;
  if (!cfg.group_overrides_set) overrides = {ParamGroupOverride{{"embeddings.weight"}, -1, 0.0}};
  const int np = static_cast<int>(layout.params.size());
  std::vector<int> owner(static_cast<size_t>(np), -1);
  std::vector<ParamGroup> groups;
  for (size_t g = 0; g < overrides.size(); ++g) {
    const ParamGroupOverride& o = overrides[g];
    ParamGroup grp{o.lr >= 0 ? o.lr : cfg.lr, o.weight_decay >= 0 ? o.weight_decay : cfg.weight_decay, {}};
    // OLMo-core lists a group's parameters pattern by pattern, each pattern's matches in model order.
    for (const std::string& pat : o.params) {
      int matches = 0;
      for (int i = 0; i < np; ++i) {
        if (!fnmatch_name(pat, layout.params[static_cast<size_t>(i)].name)) continue;
        ++matches;
        if (owner[static_cast<size_t>(i)] == static_cast<int>(g)) continue;
        if (owner[static_cast<size_t>(i)] >= 0)
          throw std::invalid_argument("config key 'optim.group_overrides': parameter '" +
                                      layout.params[static_cast<size_t>(i)].name + "' is matched by group " +
                                      std::to_string(owner[static_cast<size_t>(i)]) + " and group " +
                                      std::to_string(g) + " (PyTorch refuses a parameter in two groups)");
        owner[static_cast<size_t>(i)] = static_cast<int>(g);
        grp.params.push_back(i);
      }
      if (matches == 0)
        throw std::invalid_argument("config key 'optim.group_overrides': group " + std::to_string(g) + " pattern '" +
                                    pat + "' does not match any parameter (OLMo-core names such as embeddings.weight, "
                                    "blocks.0.attention.w_q.weight, blocks.*.attention_norm.weight, lm_head.norm.weight; "
                                    "core/params.h lists them)");
    }
    groups.push_back(std::move(grp));
  }
  ParamGroup rest{cfg.lr, cfg.weight_decay, {}};
  for (int i = 0; i < np; ++i)
    if (owner[static_cast<size_t>(i)] < 0) rest.params.push_back(i);
  groups.push_back(std::move(rest));
  std::vector<ParamGroup> out;
  for (ParamGroup& g : groups)
    if (!g.params.empty()) out.push_back(std::move(g));
  return out;
}

std::vector<GroupPiece> group_pieces(const ParamLayout& layout, const std::vector<ParamGroup>& groups, int64_t lo,
                                     int64_t hi) {
  std::vector<int> group_of(layout.params.size(), -1);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int i : groups[g].params) group_of[static_cast<size_t>(i)] = static_cast<int>(g);
  std::vector<GroupPiece> out;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamInfo& p = layout.params[i];
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a < b) out.push_back({a - lo, b - a, group_of[i]});
  }
  return out;
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

}  // namespace olmoref
