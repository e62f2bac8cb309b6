// tests/kernels/moe_cases.h — the mixture-of-experts ops (moe_dispatch, moe_combine and its backward,
// moe_scatter_add, moe_shared_combine and its backward) on awkward shapes, for the CPU/cuda-host test
// (tests/kernels/test_executor.cpp) and the device check (tests/gpu/test_gpu_kernels.cpp): E not a multiple of any
// block, k = 1..4, uneven expert loads with empty experts (every row chooses among the first k + 1 experts, expert 0
// in most rows), row widths that fill no launch evenly. The routing ops (moe_route, moe_router_backward) have their
// own cases (moe_route_cases): logits that tie.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/executor.h"
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

// ---- Each case through one executor, in its own memory (host or device), with host vectors in and out, so the
// cuda-host test and the device check run the very same sequence against the CPU executor.

template <typename T>
Buffer<T> executor_copy(Executor& ex, const std::vector<T>& host, const char* what) {
  Buffer<T> b(ex, static_cast<int64_t>(host.size()), what);
  if (!host.empty()) b.upload(host.data(), static_cast<int64_t>(host.size()));
  return b;
}

template <typename T>
std::vector<float> host_bits(const Buffer<T>& b) {  // the buffer's bytes as floats, for a bitwise comparison
  static_assert(sizeof(T) == sizeof(float), "compared as 32-bit words");
  std::vector<T> h(static_cast<size_t>(b.size()));
  if (!h.empty()) b.download(h.data(), b.size());
  std::vector<float> out(h.size());
  if (!h.empty()) std::memcpy(out.data(), h.data(), h.size() * sizeof(T));
  return out;
}

// dispatch, combine, combine's backward (with x as its output gradient dout [R, d]), scatter_add, and the shared
// mix written over its routed input as the model does. Returns xg, out, dx, dshared, drouted, dy, dweight.
inline std::vector<std::vector<float>> run_moe_ops(Executor& ex, const MoECase& c) {
  const int64_t R = c.R, d = c.d, k = c.k;
  Buffer<int64_t> row_of = executor_copy(ex, c.plan.row_of, "row_of"), position = executor_copy(ex, c.plan.position, "position");
  const MoEDispatch view{R, k, row_of.data(), position.data()};
  Buffer<float> x = executor_copy(ex, c.x, "x"), y = executor_copy(ex, c.y, "y"), weight = executor_copy(ex, c.weight, "weight");
  Buffer<float> dxg = executor_copy(ex, c.dxg, "dxg"), dx = executor_copy(ex, c.dx0, "dx"), shared = executor_copy(ex, c.shared, "shared");
  Buffer<float> xg(ex, static_cast<int64_t>(c.y.size()), "xg"), out(ex, R * d, "out"), dshared(ex, R * d, "dshared");
  Buffer<float> drouted(ex, R * d, "drouted"), dy(ex, static_cast<int64_t>(c.y.size()), "dy");
  Buffer<float> dweight(ex, static_cast<int64_t>(c.weight.size()), "dweight");
  ex.moe_dispatch(view, x.data(), xg.data(), d);
  ex.moe_combine(view, y.data(), weight.data(), out.data(), d);
  ex.moe_combine_backward(view, x.data(), y.data(), weight.data(), dy.data(), dweight.data(), d);
  ex.moe_scatter_add(view, dxg.data(), dx.data(), d);
  ex.moe_shared_combine(shared.data(), out.data(), k, out.data(), R * d);
  ex.moe_shared_combine_backward(shared.data(), k, dshared.data(), drouted.data(), R * d);
  return {host_bits(xg), host_bits(out), host_bits(dx), host_bits(dshared), host_bits(drouted), host_bits(dy),
          host_bits(dweight)};
}

// moe_route, then moe_router_backward reading the executor's own routing, as in the model. Returns scores, lse,
// top (its int32 bits), weight, dlogits.
inline std::vector<std::vector<float>> run_moe_routing(Executor& ex, const MoERouteCase& c) {
  const int64_t R = c.R, E = c.E, k = c.k;
  Buffer<float> logits = executor_copy(ex, c.logits, "logits"), dweight = executor_copy(ex, c.dweight, "dweight");
  Buffer<float> lb_grad = executor_copy(ex, c.lb_grad, "lb_grad");
  Buffer<float> scores(ex, R * E, "scores"), lse(ex, R, "lse"), weight(ex, R * k, "weight"), dlogits(ex, R * E, "dlogits");
  Buffer<int32_t> top(ex, R * k, "top");
  ex.moe_route(logits.data(), R, E, k, c.normalize_p, scores.data(), lse.data(), top.data(), weight.data());
  MoERouterBackward a;
  a.R = R, a.E = E, a.k = k, a.normalize_p = c.normalize_p;
  a.scores = scores.data(), a.lse = lse.data(), a.top = top.data(), a.weight = weight.data();
  a.dweight = dweight.data(), a.lb_grad = lb_grad.data(), a.lb_rows = c.lb_rows, a.z_grad = c.z_grad;
  ex.moe_router_backward(a, dlogits.data());
  return {host_bits(scores), host_bits(lse), host_bits(top), host_bits(weight), host_bits(dlogits)};
}

}  // namespace olmoref::testing
