// The CUDA executor (kernels/executor.h) running its kernels on the host ("cuda-host") drives the one model
// (model/olmo3.h) to the CPU executor's bits: whole micro-batches on awkward shapes, fp32 and bf16. The device
// run of the same cases is in tests/gpu; whole training traces through cuda-host are tests/cli/executors.sh.
#include <doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/optim.h"
#include "core/parallel.h"
#include "core/skip_step.h"
#include "kernels/executor.h"
#include "model/executors.h"
#include "model/init.h"
#include "ref/cpu_executor.h"
#include "ref/moe.h"
#include "tests/common/split_reductions.h"
#include "tests/kernels/attention_cases.h"
#include "tests/kernels/model_cases.h"
#include "tests/kernels/moe_cases.h"
#include "tests/kernels/host_order.h"

using namespace olmoref;

TEST_CASE("executor cuda-host: every case's loss, logits and gradients equal the CPU executor's bit for bit") {
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor host(false);
  CHECK(host.name() == "cuda-host");
  int cases = 0;
  for (const testing::ModelCase& mc : testing::model_cases()) {
    CAPTURE(mc.cfg.d_model);
    CAPTURE(static_cast<int>(mc.precision));
    const testing::ModelRun want = testing::run_model_case(mc, cpu);
    const testing::ModelRun got = testing::run_model_case(mc, host);
    CHECK(testing::model_runs_differ(want, got, ParamLayout(mc.cfg)) == "");
    ++cases;
  }
  CHECK(cases == 6);
}

// The head and the loss run over runs of rows of one instance (Olmo3::head_rows) so the logits are never [R, V]:
// every split must give the whole instance's bits, on both executors, in the training pass and in forward_loss. Runs
// of 1 row, of 5 (a short last run at T 13 and 70), of 32 (past T 13: one run) and of 64 (70 = 64 + 6).
TEST_CASE("model: the head in runs of rows gives the bits of whole instances, training and forward_loss") {
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor host(false);
  int cases = 0;
  for (const testing::ModelCase& whole : testing::model_cases()) {
    for (Executor* ex : {static_cast<Executor*>(&cpu), static_cast<Executor*>(&host)}) {
      CAPTURE(whole.cfg.d_model);
      CAPTURE(static_cast<int>(whole.precision));
      CAPTURE(ex->name());
      testing::ModelCase one_run = whole;
      one_run.head_rows = whole.seq_len;
      const testing::ModelRun want = testing::run_model_case(one_run, *ex);
      for (const int64_t rows : {int64_t{1}, int64_t{5}, int64_t{32}, int64_t{64}}) {
        CAPTURE(rows);
        testing::ModelCase split = whole;
        split.head_rows = rows;
        CHECK(testing::model_runs_differ(want, testing::run_model_case(split, *ex), ParamLayout(whole.cfg)) == "");
        ++cases;
      }
      // forward_loss: the loss tree's sums and the logits.
      auto forward = [&](int64_t rows) {
        Olmo3 model(whole.cfg, whole.micro_batch, whole.seq_len, whole.precision, ex);
        model.set_head_chunk_rows_for_test(rows);
        const ParamLayout& L = model.layout();
        std::vector<float> host_params(static_cast<size_t>(L.total));
        init_params(whole.cfg, L, host_params.data());
        Buffer<float> params(*ex, L.total, "test parameters");
        params.upload(host_params.data(), L.total);
        std::vector<uint32_t> tokens(static_cast<size_t>(whole.micro_batch * whole.seq_len));
        std::mt19937 rng(7);
        for (auto& t : tokens) t = static_cast<uint32_t>(rng() % static_cast<uint32_t>(whole.cfg.vocab_size));
        std::vector<float> logits(tokens.size() * static_cast<size_t>(whole.cfg.vocab_size));
        const LossSums sums = model.forward_loss(params.data(), tokens.data(), nullptr, logits.data());
        return std::pair{std::vector<double>{sums.ce, sums.z, sums.moe_lb, sums.moe_z}, logits};
      };
      const auto [want_sums, want_logits] = forward(whole.seq_len);
      const auto [got_sums, got_logits] = forward(5);
      CHECK(std::memcmp(want_sums.data(), got_sums.data(), want_sums.size() * sizeof(double)) == 0);
      REQUIRE(want_logits.size() == got_logits.size());
      CHECK(std::memcmp(want_logits.data(), got_logits.data(), want_logits.size() * sizeof(float)) == 0);
    }
  }
  CHECK(cases == 6 * 2 * 4);
}

// The optimizer updates on lengths that fill no launch evenly, with specials (zeros of both signs, NaN, inf) in the
// gradient and a stepping and a skipped step (step factor 1 and 0) for SkipStepAdamW.
TEST_CASE("executor cuda-host: adamw and skip_step_adamw equal the CPU executor's bit for bit") {
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor host(false);
  AdamWConfig oc;
  oc.lr = 3e-3, oc.weight_decay = 0.1;
  for (const int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{70001}}) {
    CAPTURE(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    std::vector<float> p(n), m(n), v(n), g(n);
    for (int64_t i = 0; i < n; ++i) p[i] = u(rng), m[i] = 1e-3f * u(rng), v[i] = 1e-6f * std::fabs(u(rng)), g[i] = 1e-2f * u(rng);
    const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
    for (int64_t i = 0; i < n && i < 4; ++i) g[i * (n / 4)] = specials[i];
    // One update on each executor from the same state; the executor memory of both is host memory.
    auto run = [&](Executor& ex, auto&& update) {
      std::vector<float> pe = p, me = m, ve = v;
      update(ex, pe.data(), me.data(), ve.data());
      return std::vector<std::vector<float>>{pe, me, ve};
    };
    const elem::AdamWScalars as = adamw_scalars(oc, 7, 2.5e-3);
    auto adamw = [&](Executor& ex, float* pe, float* me, float* ve) { ex.adamw(as, 0.99975f, g.data(), pe, me, ve, n); };
    // p, m, v after the update, bit for bit (NaN included).
    auto same_bits = [&](auto&& update) {
      const auto want = run(cpu, update), got = run(host, update);
      for (size_t t = 0; t < want.size(); ++t)
        if (std::memcmp(want[t].data(), got[t].data(), static_cast<size_t>(n) * sizeof(float)) != 0) return false;
      return true;
    };
    CHECK(same_bits(adamw));
    for (const float sf : {1.0f, 0.0f}) {
      CAPTURE(sf);
      const elem::SkipStepScalars ss = skip_step_scalars(oc, 2.5e-3, oc.weight_decay, 6.0f, sf);
      CHECK(same_bits([&](Executor& ex, float* pe, float* me, float* ve) { ex.skip_step_adamw(ss, g.data(), pe, me, ve, n); }));
    }
  }
}

// The mixture of experts' dispatch, combine, input-gradient gather and shared-expert mix (tests/kernels/moe_cases.h),
// the mix written over its routed input as the model does.
TEST_CASE("executor cuda-host: the MoE ops equal the CPU executor's bit for bit") {
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor host(false);
  int cases = 0;
  for (const testing::MoECase& c : testing::moe_cases()) {
    CAPTURE(c.E);
    CAPTURE(c.k);
    CAPTURE(c.R);
    CAPTURE(c.d);
    const auto want = testing::run_moe_ops(cpu, c), got = testing::run_moe_ops(host, c);
    for (size_t t = 0; t < want.size(); ++t) {
      CAPTURE(t);
      CHECK(std::memcmp(want[t].data(), got[t].data(), want[t].size() * sizeof(float)) == 0);
    }
    ++cases;
  }
  CHECK(cases == 32);
}

// The routing and the router backward on the logits of moe_route_cases (tests/kernels/moe_cases.h: ties, signed
// zeros, underflow), each executor's backward reading its own routing, as in the model.
TEST_CASE("executor cuda-host: moe_route and moe_router_backward equal the CPU executor's bit for bit") {
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor host(false);
  int cases = 0;
  for (const testing::MoERouteCase& c : testing::moe_route_cases()) {
    CAPTURE(c.E);
    CAPTURE(c.k);
    CAPTURE(c.normalize_p);
    CAPTURE(c.lb_rows);
    CAPTURE(c.z_grad);
    const int64_t k = c.k;
    const auto want = testing::run_moe_routing(cpu, c), got = testing::run_moe_routing(host, c);
    for (size_t t = 0; t < want.size(); ++t) {
      CAPTURE(t);
      CHECK(std::memcmp(want[t].data(), got[t].data(), want[t].size() * sizeof(float)) == 0);
    }
    // The ties resolve to the lower expert: row 0 (all equal) chooses experts 0, 1, ..., k-1 in that order.
    for (int64_t j = 0; j < k; ++j) {
      int32_t chosen = -1;
      std::memcpy(&chosen, &want[2][static_cast<size_t>(j)], sizeof chosen);
      CHECK(chosen == j);
    }
    ++cases;
  }
  CHECK(cases == 33);
}

// At 65536 query rows of 256 keys a [B·H·T, T] buffer would be 64 MiB (and P and dS 128 MiB); the executor's whole
// scratch after a forward and a backward must be the linear bound, rows of T only for the blocks in flight.
// Context parallelism continues each reduction over an instance's rows from rank to rank (the ops' accumulate).
TEST_CASE("executor cuda-host: reductions over rows split in runs (accumulate) equal one call over all rows") {
  kernels::KernelExecutor ex(false);
  const std::vector<std::string> bad = testing::split_reduction_mismatches(ex);
  CHECK_MESSAGE(bad.empty(), (bad.empty() ? std::string() : bad.front()));
}

TEST_CASE("executor cuda-host: attention's workspace is linear in T, never [B·H·T, T], with the CPU executor's bits") {
  const testing::AttentionCase c{4, 256, 64, 16, 2, 0, false};
  const int64_t rows = c.B * c.H * c.T;
  const testing::AttentionOperands o = testing::attention_operands(c, 5), g = testing::attention_operands(c, 6);
  const AttentionShape shape = testing::attention_shape(c);
  const size_t qn = static_cast<size_t>(rows * c.hd), kn = static_cast<size_t>(c.B * c.T * c.KV * c.hd);
  auto run = [&](Executor& ex) {
    std::vector<float> out(qn), m(static_cast<size_t>(rows)), l(m.size()), dq(qn), dk(kn), dv(kn);
    ex.attention_forward(shape, o.q.data(), o.k.data(), o.v.data(), out.data(), m.data(), l.data());
    ex.attention_backward(shape, o.q.data(), o.k.data(), o.v.data(), out.data(), m.data(), l.data(), g.q.data(),
                          dq.data(), dk.data(), dv.data());
    out.insert(out.end(), dq.begin(), dq.end());
    out.insert(out.end(), dk.begin(), dk.end());
    out.insert(out.end(), dv.begin(), dv.end());
    return out;
  };
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor host(false);
  const std::vector<float> want = run(cpu), got = run(host);
  CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
  const int64_t bound = kernels::attention_workspace_bytes(c.B, c.H, c.T, c.hd);
  CHECK(host.workspace_bytes() == bound);
  CHECK(bound == 4 * (kernels::kAttentionTileBlocks * kernels::kAttTile * c.T + rows * (1 + 2 * c.hd)));
  CHECK(6 * bound < 4 * rows * c.T);  // one [B·H·T, T] buffer is more than six times the whole scratch
}

TEST_CASE("executor cuda-host negative control: split-K GEMMs change the gradients") {
  CpuExecutor cpu;
  kernels::KernelExecutor host(false);
  host.set_debug_split_k(true);
  const testing::ModelCase mc = testing::model_cases()[1];  // K = 130 > one 16-wide slab
  const std::string diff = testing::model_runs_differ(testing::run_model_case(mc, cpu),
                                                      testing::run_model_case(mc, host), ParamLayout(mc.cfg));
  CHECK(diff != "");
#if OLMOREF_HAVE_CUDA
  // The device's GEMM has no split-K path: asking for the control there is refused, never ignored (making the
  // executor touches no device).
  kernels::KernelExecutor device(true);
  CHECK_THROWS_WITH_AS(device.set_debug_split_k(true), doctest::Contains("host execution (cuda-host) only"),
                       std::invalid_argument);
  CHECK_NOTHROW(device.set_debug_split_k(false));
#endif
}

TEST_CASE("make_executor: names, refusals with one line") {
  CHECK(executor_unavailable("cpu") == "");
  CHECK(executor_unavailable("cuda-host") == "");
  CHECK(executor_unavailable("tpu").find("unknown executor") != std::string::npos);
  CHECK(make_executor("cuda-host", nullptr)->name() == "cuda-host");
  const std::string why = executor_unavailable("cuda");
  if (!why.empty()) {  // no GPU here (CI): the refusal is the reason, and make_executor throws it
    CHECK(why.find('\n') == std::string::npos);
    CHECK_THROWS_WITH_AS(make_executor("cuda", nullptr), doctest::Contains(why.c_str()), std::runtime_error);
  }
}

TEST_CASE("out of memory names the tensor, its size and the remedy") {
  kernels::KernelExecutor host(false);
  CpuExecutor cpu;
  const size_t huge = static_cast<size_t>(1) << 62;
  for (Executor* ex : {static_cast<Executor*>(&host), static_cast<Executor*>(&cpu)}) {
    CAPTURE(ex->name());
    CHECK_THROWS_WITH_AS(ex->allocate(huge, "activation g (gate) of block 7"),
                         doctest::Contains("activation g (gate) of block 7 (4398046511104 MiB)"), std::runtime_error);
    CHECK_THROWS_WITH_AS(ex->allocate(huge, "x"), doctest::Contains("smaller train.micro_batch_instances"),
                         std::runtime_error);
  }
}
