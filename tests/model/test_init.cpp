// Initialisation: truncated normal(0, 0.02) at ±3σ for matrices, ones for norms, a pure function of
// (seed, parameter, index) — so any slice can be initialised alone.
#include <doctest.h>

#include <cmath>

#include "model/init.h"
#include "core/parallel.h"

using namespace olmoref;

TEST_CASE("init: distribution, truncation, norms at one") {
  ModelConfig m{.vocab_size = 1000, .d_model = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                .ffn_hidden = 128, .moe = {}};
  const ParamLayout L(m);
  std::vector<float> p(L.total);
  init_params(m, L, p.data());
  double sum = 0, sq = 0;
  int64_t n = 0;
  for (const auto& info : L.params) {
    for (int64_t i = 0; i < info.numel; ++i) {
      const float x = p[info.offset + i];
      if (info.kind == ParamKind::norm) {
        CHECK(x == 1.0f);
        continue;
      }
      CHECK(std::abs(x) <= 0.06f);
      sum += x;
      sq += static_cast<double>(x) * x;
      ++n;
    }
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  // Truncation at 3σ shrinks the standard deviation by a factor 0.98654.
  CHECK(std::abs(mean) < 3e-4);
  CHECK(sd == doctest::Approx(0.02 * 0.98654).epsilon(0.01));
}

TEST_CASE("init: element values are independent of slicing and threads, and of other parameters") {
  CHECK(init_value(0, 3, 12345, 0.02) == init_value(0, 3, 12345, 0.02));
  CHECK(init_value(0, 3, 12345, 0.02) != init_value(0, 4, 12345, 0.02));
  CHECK(init_value(0, 3, 12345, 0.02) != init_value(1, 3, 12345, 0.02));
  ModelConfig m{.vocab_size = 300, .d_model = 32, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2, .head_dim = 16,
                .ffn_hidden = 64, .moe = {}};
  const ParamLayout L(m);
  std::vector<float> a(L.total), b(L.total);
  set_default_threads(1);
  init_params(m, L, a.data());
  set_default_threads(3);
  init_params(m, L, b.data());
  CHECK(a == b);
  for (int64_t i = 0; i < 50; ++i)
    CHECK(a[L.lm_head + i] == init_value(m.init_seed, static_cast<uint32_t>(L.params.size() - 1), i, m.init_std));
}
