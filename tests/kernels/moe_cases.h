// tests/kernels/moe_cases.h — the mixture-of-experts ops (moe_dispatch, moe_combine and its backward,
// moe_scatter_add, moe_shared_combine and its backward) on awkward shapes, for the CPU/cuda-host test
// (tests/kernels/test_executor.cpp) and the device check (tests/gpu/test_gpu_kernels.cpp): E not a multiple of any
// block, k = 1..4, uneven expert loads with empty experts (every row chooses among the first k + 1 experts, expert 0
// in most rows), row widths that fill no launch evenly. The routing ops (moe_route, moe_router_backward) have their
// own cases (moe_route_cases): logits that tie.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/moe_plan.h"

namespace olmoref::testing {

struct MoECase {
  int64_t E, k, R, d;
  moe::Plan plan;
  // x, dx0, shared [R, d]; y, dxg [S, d]; weight [R, k] (S = R·k)
  std::vector<float> x, y, weight, dxg, dx0, shared;
};

inline std::vector<MoECase> moe_cases() {
  std::vector<MoECase> out;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  auto draw = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
  };
  for (const int64_t E : {int64_t{5}, int64_t{33}})
    for (int64_t k = 1; k <= 4; ++k)
      for (const int64_t R : {int64_t{1}, int64_t{301}})
        for (const int64_t d : {int64_t{1}, int64_t{67}}) {
          std::vector<int32_t> top(static_cast<size_t>(R * k));
          for (int64_t r = 0; r < R; ++r) {
            std::vector<int32_t> choice(static_cast<size_t>(k + 1));
            for (int64_t e = 0; e <= k; ++e) choice[static_cast<size_t>(e)] = static_cast<int32_t>(e);
            if (r % 3 != 0) std::shuffle(choice.begin() + 1, choice.end(), rng);
            else std::shuffle(choice.begin(), choice.end(), rng);
            for (int64_t j = 0; j < k; ++j) top[static_cast<size_t>(r * k + j)] = choice[static_cast<size_t>(j)];
          }
          const int64_t S = R * k;
          MoECase c{E, k, R, d, moe::make_plan(top.data(), R, k, E), {}, {}, {}, {}, {}, {}};
          c.x = draw(R * d), c.y = draw(S * d), c.weight = draw(S), c.dxg = draw(S * d), c.dx0 = draw(R * d);
          c.shared = draw(R * d);
          out.push_back(std::move(c));
        }
  return out;
}

// moe_route and then moe_router_backward on its outputs. The logits are drawn from a few levels, so most rows tie
// (the top-k must rank equal scores by expert index); row 0 is all equal, row 1 mixes +0 and -0 (the row max must keep
// the first of equal zeros), row 2 puts one logit 200 above the rest (the others' scores underflow to 0 and tie),
// row 3 is continuous. E below, at and past the warp width; normalize_p 0, 1, 2; with and without a z-loss; the lb
// gradient per instance (lb_rows 10) or per micro-batch (lb_rows = R).
struct MoERouteCase {
  int64_t R, E, k, lb_rows;
  int normalize_p;
  float z_grad;
  std::vector<float> logits;   // [R, E]
  std::vector<float> dweight;  // [R, k]
  std::vector<float> lb_grad;  // [R / lb_rows, E]
};

inline std::vector<MoERouteCase> moe_route_cases() {
  std::vector<MoERouteCase> out;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  const float levels[] = {-1.5f, -0.25f, 0.0f, 0.75f, 0.75f, 2.0f};
  std::uniform_int_distribution<int> level(0, 5);
  int variant = 0;
  for (const int64_t E : {int64_t{3}, int64_t{32}, int64_t{33}, int64_t{70}})
    for (const int64_t k : {int64_t{1}, int64_t{2}, int64_t{4}})
      for (int p = 0; p <= 2; ++p) {
        if (k > E) continue;
        const int64_t R = 30, lb_rows = variant % 2 == 0 ? 10 : R;
        MoERouteCase c{R, E, k, lb_rows, p, variant % 3 == 0 ? 0.0f : 1.5e-3f, {}, {}, {}};
        ++variant;
        c.logits.resize(static_cast<size_t>(R * E));
        for (int64_t r = 0; r < R; ++r)
          for (int64_t e = 0; e < E; ++e) {
            float& l = c.logits[static_cast<size_t>(r * E + e)];
            if (r == 0) l = 0.5f;
            else if (r == 1) l = e % 3 == 0 ? 0.0f : (e % 3 == 1 ? -0.0f : -1.0f);
            else if (r == 2) l = e == E / 2 ? 100.0f : -100.0f;
            else if (r == 3) l = u(rng);
            else l = levels[level(rng)];
          }
        for (int64_t i = 0; i < R * k; ++i) c.dweight.push_back(u(rng));
        for (int64_t i = 0; i < (R / lb_rows) * E; ++i) c.lb_grad.push_back(1e-3f * u(rng));
        out.push_back(std::move(c));
      }
  return out;
}

}  // namespace olmoref::testing
