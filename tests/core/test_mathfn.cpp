// The project's portable math functions: accuracy against libm in fp64, and a few exact values.
// (Their bits are the contract; accuracy only has to be good, not libm-identical.)
#include <doctest.h>

#include <cmath>
#include <random>

#include "core/mathfn.h"
#include "core/reduce.h"
#include "core/rng.h"

using namespace olmoref;

namespace {
double ulp_err_f(float got, double want) {
  const double ulp = std::nextafter(static_cast<float>(want), INFINITY) - static_cast<float>(want);
  return std::abs(static_cast<double>(got) - want) / ulp;
}
}  // namespace

TEST_CASE("expf within 2 ulp over the softmax range") {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-87.0f, 88.0f);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = dist(rng);
    worst = std::max(worst, ulp_err_f(det::expf(x), std::exp(static_cast<double>(x))));
  }
  MESSAGE("expf worst error: " << worst << " ulp");
  CHECK(worst < 2.0);
  CHECK(det::expf(0.0f) == 1.0f);
  CHECK(det::expf(-100.0f) == 0.0f);
  CHECK(std::isinf(det::expf(100.0f)));
}

TEST_CASE("fp64 exp, log, sin, cos close to libm") {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> ex(-700, 700), lg(1e-300, 1e300), tr(-70000, 70000);
  double we = 0, wl = 0, ws = 0, wc = 0;
  for (int i = 0; i < 100000; ++i) {
    const double a = ex(rng), b = std::exp(std::uniform_real_distribution<double>(-690, 690)(rng)), c = tr(rng);
    we = std::max(we, std::abs(det::exp(a) - std::exp(a)) / std::exp(a));
    wl = std::max(wl, std::abs(det::log(b) - std::log(b)) / std::max(1.0, std::abs(std::log(b))));
    ws = std::max(ws, std::abs(det::sin(c) - std::sin(c)));
    wc = std::max(wc, std::abs(det::cos(c) - std::cos(c)));
  }
  (void)lg;
  MESSAGE("exp " << we << ", log " << wl << ", sin " << ws << ", cos " << wc);
  CHECK(we < 1e-15);
  CHECK(wl < 1e-15);
  CHECK(ws < 1e-14);
  CHECK(wc < 1e-14);
}

TEST_CASE("silu and sigmoid at the extremes") {
  CHECK(det::siluf(0.0f) == 0.0f);
  CHECK(det::siluf(100.0f) == 100.0f);
  CHECK(det::siluf(-100.0f) == -0.0f);
  CHECK(det::sigmoidf(0.0f) == 0.5f);
}

TEST_CASE("canonical row reduction is the 32-lane scheme, not a serial sum") {
  // Values chosen so the serial sum and the lane scheme round differently.
  std::vector<float> x(100);
  for (int i = 0; i < 100; ++i) x[i] = (i % 2 ? 1e8f : 1.0f) * (i % 3 ? 1.0f : -1.0f) + 0.37f * i;
  float serial = 0;
  for (float v : x) serial += v;
  float lane[32] = {};
  for (int i = 0; i < 100; ++i) lane[i % 32] += x[i];
  for (int w = 16; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  CHECK(canonical_sum(x.data(), 100) == lane[0]);
  CHECK(canonical_sum(x.data(), 100) != serial);  // the order matters for these inputs
}

TEST_CASE("Philox4x32-10 known-answer test (Random123 kat_vectors)") {
  // philox4x32_10: counter {0,0,0,0}, key {0,0} -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8
  const Philox4x32 r = philox4x32_10(0, 0, 0, 0, 0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  // counter all ones, key all ones -> 408f276d 41c83b0e a20bc7c6 6d5451fd
  const Philox4x32 s = philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  CHECK(s.v[0] == 0x408f276du);
  CHECK(s.v[1] == 0x41c83b0eu);
  CHECK(s.v[2] == 0xa20bc7c6u);
  CHECK(s.v[3] == 0x6d5451fdu);
}
