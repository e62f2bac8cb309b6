// tests/kernels/moe_cases.h — the mixture-of-experts ops (moe_dispatch, moe_combine, moe_scatter_add,
// moe_shared_combine and its backward) on awkward shapes, for the CPU/cuda-host test (tests/kernels/test_executor.cpp)
// and the device check (tests/gpu/test_gpu_kernels.cpp): E not a multiple of any block, k = 1..4, uneven expert
// loads with empty experts (every row chooses among the first k + 1 experts, expert 0 in most rows), row widths
// that fill no launch evenly.
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

}  // namespace olmoref::testing
