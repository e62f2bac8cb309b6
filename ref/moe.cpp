#include "ref/moe.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>

#include "core/mathfn.h"
#include "core/moe_row.h"
#include "core/parallel.h"
#include "core/reduce.h"

namespace olmoref::moe {

namespace {

// Rows are independent, so any split over threads gives the same bits.
void for_rows(ThreadPool* pool, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool && pool->size() > 1 && n > grain)
    pool->parallel_for(n, grain, fn);
  else if (n > 0)
    fn(0, n);
}

}  // namespace

void route(const float* logits, int64_t R, int64_t E, int64_t k, float* scores, float* lse, int32_t* top,
           float* weight, ThreadPool* pool, int normalize_p) {
  if (normalize_p != 0 && normalize_p != 1 && normalize_p != 2)
    throw std::invalid_argument("moe::route: normalize_p must be 0, 1 or 2 (model.moe_normalize_expert_weights)");
  for_rows(pool, R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* l = logits + r * E;
      float* s = scores + r * E;
      const float m = moe_row::row_max(l, E);
      for (int64_t e = 0; e < E; ++e) s[e] = det::expf(l[e] - m);
      const float sum = canonical_sum(s, E);
      for (int64_t e = 0; e < E; ++e) s[e] = s[e] / sum;
      lse[r] = m + det::logf(sum);
      moe_row::select_top_k(s, E, k, top + r * k, weight + r * k);
      moe_row::normalize_weights(s, top + r * k, k, normalize_p, weight + r * k);
    }
  });
}

void gather(const float* x, const MoEDispatch& plan, int64_t d, float* xg, ThreadPool* pool) {
  for_rows(pool, plan.R * plan.k, 256, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) std::copy_n(x + plan.row_of[p] * d, d, xg + p * d);
  });
}

void combine(const float* y, const float* weight, const MoEDispatch& plan, int64_t d, float* out, ThreadPool* pool) {
  const int64_t k = plan.k;
  for_rows(pool, plan.R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* o = out + r * d;
      std::fill_n(o, d, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const float w = weight[r * k + j];
        const float* yr = y + plan.position[r * k + j] * d;
        for (int64_t c = 0; c < d; ++c) o[c] = std::fma(w, yr[c], o[c]);
      }
    }
  });
}

void combine_backward(const float* dout, const float* y, const float* weight, const MoEDispatch& plan, int64_t d,
                      float* dy, float* dweight, ThreadPool* pool) {
  const int64_t k = plan.k;
  for_rows(pool, plan.R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = dout + r * d;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = plan.position[r * k + j];
        const float w = weight[r * k + j];
        for (int64_t c = 0; c < d; ++c) dy[p * d + c] = w * g[c];
        dweight[r * k + j] = canonical_dot(g, y + p * d, d);
      }
    }
  });
}

void scatter_add(const float* dxg, const MoEDispatch& plan, int64_t d, float* dx, ThreadPool* pool) {
  const int64_t k = plan.k;
  for_rows(pool, plan.R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < k; ++j) {
        const float* src = dxg + plan.position[r * k + j] * d;
        for (int64_t c = 0; c < d; ++c) dx[r * d + c] = dx[r * d + c] + src[c];
      }
  });
}

void combine_unordered_for_test(const float* y, const float* weight, const Plan& plan, int64_t d, float* out) {
  std::fill_n(out, plan.R * d, 0.0f);
  // Expert-major arrival: slot (r, j) lands when its expert's block is processed, i.e. in position order.
  std::vector<int64_t> slot_of(static_cast<size_t>(plan.R * plan.k));
  for (int64_t i = 0; i < plan.R * plan.k; ++i) slot_of[static_cast<size_t>(plan.position[static_cast<size_t>(i)])] = i;
  for (int64_t p = 0; p < plan.R * plan.k; ++p) {
    const int64_t slot = slot_of[static_cast<size_t>(p)], r = slot / plan.k;
    const float w = weight[slot];
    for (int64_t c = 0; c < d; ++c) out[r * d + c] = std::fma(w, y[p * d + c], out[r * d + c]);
  }
}

void scatter_add_unordered_for_test(const float* dxg, const Plan& plan, int64_t d, float* dx) {
  for (int64_t p = 0; p < plan.R * plan.k; ++p) {
    const int64_t r = plan.row_of[static_cast<size_t>(p)];
    for (int64_t c = 0; c < d; ++c) dx[r * d + c] = dx[r * d + c] + dxg[p * d + c];
  }
}


void shared_combine(const float* shared, const float* routed, int64_t k, float* out, int64_t n, ThreadPool* pool) {
  const float div = static_cast<float>(k + 1), alpha = moe_routed_share(k);
  for_rows(pool, n, 1 << 14, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) out[i] = shared[i] / div + routed[i] * alpha;
  });
}

void shared_combine_backward(const float* dout, int64_t k, float* dshared, float* drouted, int64_t n, ThreadPool* pool) {
  const float div = static_cast<float>(k + 1), alpha = moe_routed_share(k);
  for_rows(pool, n, 1 << 14, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const float g = dout[i];
      dshared[i] = g / div;
      drouted[i] = g * alpha;
    }
  });
}

double lb_value(const float* scores, int64_t row_begin, int64_t row_end, int64_t E, const std::vector<int64_t>& c,
                int64_t n_unit, double lb_coef) {
  double total = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    double col = 0.0;
    for (int64_t r = row_begin; r < row_end; ++r) col += static_cast<double>(scores[r * E + e]);
    total += static_cast<double>(c[static_cast<size_t>(e)]) * col / static_cast<double>(n_unit);
  }
  return lb_coef * total;
}

double z_value(const float* lse, int64_t row_begin, int64_t row_end, double z_coef) {
  double total = 0.0;
  for (int64_t r = row_begin; r < row_end; ++r) total += static_cast<double>(lse[r]) * static_cast<double>(lse[r]);
  return z_coef * total;
}

std::vector<float> lb_grad(const std::vector<int64_t>& c, int64_t n_unit, double lb_coef, int64_t global_n) {
  std::vector<float> g(c.size());
  for (size_t e = 0; e < c.size(); ++e)
    g[e] = static_cast<float>(lb_coef * static_cast<double>(c[e]) /
                              (static_cast<double>(n_unit) * static_cast<double>(global_n)));
  return g;
}

void router_backward(const MoERouterBackward& a, float* dlogits, ThreadPool* pool) {
  const int64_t E = a.E, k = a.k;
  for_rows(pool, a.R, 64, [&](int64_t r0, int64_t r1) {
    std::vector<float> ds(static_cast<size_t>(E));
    for (int64_t r = r0; r < r1; ++r) {
      const float* s = a.scores + r * E;
      const float* lb = a.lb_grad + (r / a.lb_rows) * E;
      std::copy_n(lb, E, ds.data());
      moe_row::add_chosen_grad(s, a.top + r * k, a.weight + r * k, a.dweight + r * k, k, a.normalize_p, ds.data());
      const float dot = canonical_dot(s, ds.data(), E);
      const float zl = a.z_grad * a.lse[r];
      float* dl = dlogits + r * E;
      for (int64_t e = 0; e < E; ++e) dl[e] = moe_row::logit_grad(s[e], ds[static_cast<size_t>(e)], dot, zl, a.z_grad);
    }
  });
}

}  // namespace olmoref::moe
