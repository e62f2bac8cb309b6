// Gradient checks: every op's hand-written backward, and the whole model's parameter gradients,
// against central finite differences of an independent fp64 implementation (reference_f64.h).
#include <doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "ref/gemm.h"
#include "model/init.h"
#include "model/olmo3.h"
#include "ref/ops.h"
#include "core/parallel.h"
#include "tests/common/test_models.h"
#include "tests/model/reference_f64.h"
#include "train/trainer.h"

using namespace olmoref;
using olmoref::testing::Vec;
using olmoref::testing::dot64;
using olmoref::testing::finite_diff;
using olmoref::testing::rel_err;
using olmoref::testing::to64;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

constexpr double kTol = 1e-4;  // fp32 analytic gradient vs fp64 finite differences

}  // namespace

TEST_CASE("gradcheck: linear layer (all three canonical products)") {
  const int64_t M = 7, N = 5, K = 9;
  auto X = randn(M * K, 1), W = randn(N * K, 2), dY = randn(M * N, 3);
  std::vector<float> dX(M * K), dW(N * K);
  matmul_backward_input(dY.data(), W.data(), dX.data(), M, N, K, false, nullptr);
  matmul_backward_weight(dY.data(), X.data(), dW.data(), M, N, K, false, nullptr);
  const Vec W64 = to64(W), X64 = to64(X);
  auto fx = [&](const Vec& x) { return dot64(olmoref::testing::linear64(x, W64.data(), M, N, K), dY); };
  auto fw = [&](const Vec& w) { return dot64(olmoref::testing::linear64(X64, w.data(), M, N, K), dY); };
  CHECK(rel_err(dX.data(), finite_diff(fx, X64)) < kTol);
  CHECK(rel_err(dW.data(), finite_diff(fw, W64)) < kTol);
}

TEST_CASE("gradcheck: RMSNorm input and weight") {
  const int64_t R = 4, n = 37;
  auto x = randn(R * n, 4, 1.5f), w = randn(n, 5, 0.3f, 1.0f), dy = randn(R * n, 6);
  std::vector<float> y(R * n), rms(R), dx(R * n), dw(n);
  rmsnorm_forward(x.data(), w.data(), y.data(), rms.data(), R, n, 1e-6f, nullptr);
  rmsnorm_backward(x.data(), w.data(), rms.data(), dy.data(), dx.data(), dw.data(), R, n, nullptr);
  const Vec x64 = to64(x), w64 = to64(w);
  CHECK(rel_err(y.data(), olmoref::testing::rmsnorm64(x64, w64.data(), R, n, 1e-6)) < 1e-6);
  auto fx = [&](const Vec& xx) { return dot64(olmoref::testing::rmsnorm64(xx, w64.data(), R, n, 1e-6), dy); };
  auto fw = [&](const Vec& ww) { return dot64(olmoref::testing::rmsnorm64(x64, ww.data(), R, n, 1e-6), dy); };
  CHECK(rel_err(dx.data(), finite_diff(fx, x64)) < kTol);
  CHECK(rel_err(dw.data(), finite_diff(fw, w64)) < kTol);
}

TEST_CASE("gradcheck: RoPE (rotate-half)") {
  const int64_t T = 6, B = 2, heads = 3, hd = 8;
  auto x = randn(B * T * heads * hd, 7), dy = randn(B * T * heads * hd, 8);
  const RopeTable table = make_rope_table(T, hd, 10000.0);
  std::vector<float> y = x, dx = dy;
  rope_forward(y.data(), B * T, heads, table, nullptr);
  rope_backward(dx.data(), B * T, heads, table, nullptr);
  Vec y64 = to64(x);
  olmoref::testing::rope64(y64, B * T, T, heads, hd, 10000.0);
  CHECK(rel_err(y.data(), y64) < 1e-6);
  auto f = [&](const Vec& xx) {
    Vec z = xx;
    olmoref::testing::rope64(z, B * T, T, heads, hd, 10000.0);
    return dot64(z, dy);
  };
  CHECK(rel_err(dx.data(), finite_diff(f, to64(x))) < kTol);
}

TEST_CASE("gradcheck: SwiGLU") {
  const int64_t n = 64;
  auto g = randn(n, 9, 3.0f), u = randn(n, 10), da = randn(n, 11);
  std::vector<float> a(n), dg(n), du(n);
  swiglu_forward(g.data(), u.data(), a.data(), n, nullptr);
  swiglu_backward(g.data(), u.data(), da.data(), dg.data(), du.data(), n, nullptr);
  auto f = [&](const Vec& gu) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += olmoref::testing::silu64(gu[i]) * gu[n + i] * da[i];
    return s;
  };
  Vec gu(2 * n);
  for (int64_t i = 0; i < n; ++i) gu[i] = g[i], gu[n + i] = u[i];
  const Vec fd = finite_diff(f, gu);
  CHECK(rel_err(dg.data(), Vec(fd.begin(), fd.begin() + n)) < kTol);
  CHECK(rel_err(du.data(), Vec(fd.begin() + n, fd.end())) < kTol);
}

TEST_CASE("gradcheck: attention with GQA, full and sliding window") {
  for (int64_t window : {0, 1, 4}) {
    CAPTURE(window);
    const int64_t B = 2, T = 9, H = 4, KV = 2, hd = 8;
    const AttentionShape s{B, T, H, KV, hd, window, 1.0f / std::sqrt(static_cast<float>(hd))};
    auto q = randn(B * T * H * hd, 12), k = randn(B * T * KV * hd, 13), v = randn(B * T * KV * hd, 14);
    auto dout = randn(B * T * H * hd, 15);
    std::vector<float> out(q.size()), mx(B * H * T), sm(B * H * T), dq(q.size()), dk(k.size()), dv(v.size());
    ThreadPool pool(2);
    attention_forward(s, q.data(), k.data(), v.data(), out.data(), mx.data(), sm.data(), &pool);
    attention_backward(s, q.data(), k.data(), v.data(), out.data(), mx.data(), sm.data(), dout.data(), dq.data(),
                       dk.data(), dv.data(), &pool);
    const Vec q64 = to64(q), k64 = to64(k), v64 = to64(v);
    using olmoref::testing::attention64;
    CHECK(rel_err(out.data(), attention64(q64, k64, v64, B, T, H, KV, hd, window)) < 1e-6);
    CHECK(rel_err(dq.data(), finite_diff([&](const Vec& x) { return dot64(attention64(x, k64, v64, B, T, H, KV, hd, window), dout); }, q64)) < kTol);
    CHECK(rel_err(dk.data(), finite_diff([&](const Vec& x) { return dot64(attention64(q64, x, v64, B, T, H, KV, hd, window), dout); }, k64)) < kTol);
    CHECK(rel_err(dv.data(), finite_diff([&](const Vec& x) { return dot64(attention64(q64, k64, x, B, T, H, KV, hd, window), dout); }, v64)) < kTol);
  }
}

TEST_CASE("gradcheck: cross-entropy with z-loss over shifted labels") {
  const int64_t B = 2, T = 5, V = 11;
  auto logits = randn(B * T * V, 16, 2.0f);
  std::vector<uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const int64_t N = B * (T - 1);
  std::vector<float> g = logits;
  const LossSums sums = cross_entropy_forward_backward(g.data(), tokens.data(), B, T, V, 1e-5f, N, nullptr);
  auto f = [&](const Vec& x) { return olmoref::testing::loss_from_logits64(x, tokens.data(), B, T, V, 1e-5, N); };
  const Vec l64 = to64(logits);
  CHECK(std::abs((sums.ce + sums.z) / N - f(l64)) < 1e-6 * std::abs(f(l64)));
  CHECK(rel_err(g.data(), finite_diff(f, l64)) < kTol);
  // The last position of each instance has no target, so no gradient.
  for (int64_t v = 0; v < V; ++v) CHECK(g[(T - 1) * V + v] == 0.0f);
}

TEST_CASE("gradcheck: embedding backward sums positions per token") {
  const int64_t R = 6, V = 5, d = 3;
  std::vector<uint32_t> tokens = {2, 0, 2, 4, 2, 0};
  auto dx = randn(R * d, 17);
  std::vector<float> dt(V * d);
  embedding_backward(tokens.data(), dx.data(), dt.data(), R, V, d, nullptr);
  for (int64_t c = 0; c < d; ++c) {
    CHECK(dt[2 * d + c] == (dx[0 * d + c] + dx[2 * d + c]) + dx[4 * d + c]);
    CHECK(dt[0 * d + c] == dx[1 * d + c] + dx[5 * d + c]);
    CHECK(dt[1 * d + c] == 0.0f);
    CHECK(dt[3 * d + c] == 0.0f);
  }
}

namespace {

ModelConfig gradcheck_model() { return testing::gradcheck_model("gradcheck"); }

// Norm weights away from 1 so their gradients are not degenerate.
void perturb_norms(const ParamLayout& L, std::vector<float>& p) {
  auto noise = randn(static_cast<size_t>(L.total), 99, 0.2f);
  for (const auto& info : L.params)
    if (info.kind == ParamKind::norm)
      for (int64_t i = 0; i < info.numel; ++i) p[info.offset + i] += noise[info.offset + i];
}

}  // namespace

namespace {

// The gradient of one micro-batch of B random instances at init_params (norms perturbed), and the fp64 checks of
// every parameter tensor against finite differences of model_loss64.
struct ModelGradient {
  ParamLayout layout;
  std::vector<float> params, grad;
  std::vector<uint32_t> tokens;
  LossSums sums;
};

ModelGradient model_gradient(const ModelConfig& cfg, int64_t B, int64_t T) {
  Olmo3 model(cfg, B, T);
  ModelGradient g{model.layout(), {}, {}, {}, {}};
  g.params.resize(g.layout.total), g.grad.resize(g.layout.total);
  init_params(cfg, g.layout, g.params.data());
  perturb_norms(g.layout, g.params);
  g.tokens.resize(B * T);
  std::mt19937 rng(5);
  for (auto& t : g.tokens) t = rng() % cfg.vocab_size;
  ThreadPool pool(2);
  g.sums = model.forward_backward(g.params.data(), g.tokens.data(), B * (T - 1), g.grad.data(), &pool);
  return g;
}

void check_every_tensor(const ModelConfig& cfg, const ModelGradient& g, int64_t B, int64_t T) {
  const Vec p64 = to64(g.params);
  for (const ParamInfo& info : g.layout.params) {
    CAPTURE(info.name);
    Vec x(p64.begin() + info.offset, p64.begin() + info.offset + info.numel);
    auto f = [&](const Vec& slice) {
      Vec p = p64;
      std::copy(slice.begin(), slice.end(), p.begin() + info.offset);
      return olmoref::testing::model_loss64(cfg, g.layout, p, g.tokens.data(), B, T, B * (T - 1));
    };
    const double err = rel_err(g.grad.data() + info.offset, finite_diff(f, x));
    CAPTURE(err);
    CHECK(err < kTol);
  }
}

}  // namespace

TEST_CASE("gradcheck: whole model, every parameter tensor (GQA, window < seq, 4 layers)") {
  const ModelConfig cfg = gradcheck_model();
  const int64_t B = 2, T = 10, N = B * (T - 1);
  const ModelGradient g = model_gradient(cfg, B, T);
  const double loss64 = olmoref::testing::model_loss64(cfg, g.layout, to64(g.params), g.tokens.data(), B, T, N);
  CHECK(std::abs((g.sums.ce + g.sums.z) / N - loss64) < 1e-5 * loss64);
  check_every_tensor(cfg, g, B, T);
}

TEST_CASE("gradcheck: step gradient over several micro-batches equals the gradient of the global loss") {
  TrainConfig tc;
  tc.model = gradcheck_model();
  tc.model.n_layers = 2;
  tc.model.swa_pattern = {4, -1};
  tc.train.seq_len = 8;
  tc.train.micro_batch_instances = 1;
  tc.train.global_batch_instances = 3;  // an uneven tree: (0, 1) + 2
  Trainer trainer(tc, 2);
  const ParamLayout& L = trainer.model().layout();
  StepBatch batch;
  std::mt19937 rng(8);
  batch.tokens.resize(3 * 8);
  for (auto& t : batch.tokens) t = rng() % tc.model.vocab_size;
  std::vector<float> grad(L.total);
  const LossSums sums = trainer.compute_gradient(batch, grad.data());
  const int64_t N = 3 * 7;
  const Vec p64(trainer.params(), trainer.params() + L.total);
  CHECK(std::abs((sums.ce + sums.z) / N -
                 olmoref::testing::model_loss64(tc.model, L, p64, batch.tokens.data(), 3, 8, N)) < 1e-5);
  // Spot-check a few tensors (the whole-model test covers every tensor for one micro-batch).
  for (const char* name : {"blocks.0.attention.w_q.weight", "blocks.1.feed_forward.w2.weight", "lm_head.w_out.weight",
                           "embeddings.weight"}) {
    CAPTURE(name);
    const ParamInfo* info = L.find(name);
    REQUIRE(info);
    Vec x(p64.begin() + info->offset, p64.begin() + info->offset + info->numel);
    auto f = [&](const Vec& slice) {
      Vec p = p64;
      std::copy(slice.begin(), slice.end(), p.begin() + info->offset);
      return olmoref::testing::model_loss64(tc.model, L, p, batch.tokens.data(), 3, 8, N);
    };
    CHECK(rel_err(grad.data() + info->offset, finite_diff(f, x)) < kTol);
  }
}

// Mixture of experts (docs/canonical/moe.md): the router (through the expert weights, the load-balancing loss
// and the router z-loss), every expert and the shared expert against fp64 finite differences of moe64, which is
// written from OLMo-core's definition. Only away from top-k ties: the test requires every row's k-th and
// (k+1)-th scores to be far apart compared with what a finite-difference step can move them.
TEST_CASE("gradcheck: mixture of experts, every parameter tensor (router, experts, shared expert, aux losses, "
          "normalised top-k weights)") {
  struct Case {
    int64_t k, shared;
    MoELbGranularity unit;
    double normalize_p;
  };
  for (const Case c : {Case{2, 12, MoELbGranularity::instance, 0}, Case{1, 0, MoELbGranularity::local_batch, 0},
                       Case{3, 0, MoELbGranularity::instance, 2}, Case{2, 12, MoELbGranularity::local_batch, 1}}) {
    CAPTURE(c.k);
    CAPTURE(c.shared);
    CAPTURE(c.normalize_p);
    ModelConfig cfg = gradcheck_model();
    cfg.n_layers = 2;
    cfg.swa_pattern = {3, -1};
    cfg.moe.n_experts = 4;
    cfg.moe.top_k = c.k;
    cfg.moe.hidden = 8;
    cfg.moe.shared_hidden = c.shared;
    cfg.moe.lb_loss_weight = 0.5;  // far above OLMo-core's 0.01 so the router's auxiliary gradients are visible
    cfg.moe.z_loss_weight = 0.05;
    cfg.moe.lb_granularity = c.unit;
    cfg.moe.normalize_expert_weights = c.normalize_p;
    const int64_t B = 2, T = 10, N = B * (T - 1);
    const ModelGradient g = model_gradient(cfg, B, T);
    const Vec p64 = to64(g.params);
    olmoref::testing::moe_min_gap64() = 1e300;
    const double loss64 = olmoref::testing::model_loss64(cfg, g.layout, p64, g.tokens.data(), B, T, N);
    const double gap = olmoref::testing::moe_min_gap64();
    CAPTURE(gap);
    REQUIRE(gap > 1e-4);
    const LossSums& sums = g.sums;
    CHECK(std::abs((sums.ce + sums.z + sums.moe_lb + sums.moe_z) / N - loss64) < 1e-5 * loss64);
    // The auxiliary part alone (the same routing: the weights do not move the scores).
    ModelConfig plain = cfg;
    plain.moe.lb_loss_weight = plain.moe.z_loss_weight = 0;
    const double aux64 = loss64 - olmoref::testing::model_loss64(plain, g.layout, p64, g.tokens.data(), B, T, N);
    CHECK(aux64 > 0);
    CHECK(std::abs((sums.moe_lb + sums.moe_z) / N - aux64) < 1e-5 * aux64);
    check_every_tensor(cfg, g, B, T);
  }
}
