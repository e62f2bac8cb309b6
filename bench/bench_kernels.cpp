// bench/bench_kernels.cpp — attention, RMSNorm and whole-step throughput of the CPU reference.
// GFLOP/s counters count the multiply-adds of the canonical formulation (2 FLOPs each).
//   build/bench/bench_kernels --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/init.h"
#include "model/olmo3.h"
#include "ref/ops.h"
#include "core/parallel.h"

using namespace olmoref;

namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Query-key pairs visited by causal attention with a window (0 = full).
double pairs(int64_t T, int64_t window) {
  double p = 0;
  for (int64_t i = 0; i < T; ++i) p += static_cast<double>(window > 0 ? std::min<int64_t>(window, i + 1) : i + 1);
  return p;
}

void BM_attention(benchmark::State& state) {
  const int64_t T = state.range(0), window = state.range(1), threads = state.range(2), backward = state.range(3);
  const int64_t B = 4, H = 8, KV = 8, hd = 16;
  ThreadPool pool(static_cast<int>(threads));
  const AttentionShape s{B, T, H, KV, hd, window, 0.25f};
  auto q = randn(B * T * H * hd, 1), k = randn(B * T * KV * hd, 2), v = randn(B * T * KV * hd, 3);
  auto dout = randn(q.size(), 4);
  std::vector<float> out(q.size()), mx(B * H * T), sm(B * H * T), dq(q.size()), dk(k.size()), dv(v.size());
  attention_forward(s, q.data(), k.data(), v.data(), out.data(), mx.data(), sm.data(), &pool);
  for (auto _ : state) {
    if (backward)
      attention_backward(s, q.data(), k.data(), v.data(), out.data(), mx.data(), sm.data(), dout.data(), dq.data(),
                         dk.data(), dv.data(), &pool);
    else
      attention_forward(s, q.data(), k.data(), v.data(), out.data(), mx.data(), sm.data(), &pool);
    benchmark::ClobberMemory();
  }
  const double flops = (backward ? 10.0 : 4.0) * hd * pairs(T, window) * B * H;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_attention)
    ->ArgNames({"T", "window", "threads", "bwd"})
    ->ArgsProduct({{256}, {128, 0}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_rmsnorm(benchmark::State& state) {
  const int64_t R = 4096, n = state.range(0), threads = state.range(1), backward = state.range(2);
  ThreadPool pool(static_cast<int>(threads));
  auto x = randn(R * n, 5), w = randn(n, 6), dy = randn(R * n, 7);
  std::vector<float> y(R * n), rms(R), dx(R * n), dw(n);
  rmsnorm_forward(x.data(), w.data(), y.data(), rms.data(), R, n, 1e-6f, &pool);
  for (auto _ : state) {
    if (backward)
      rmsnorm_backward(x.data(), w.data(), rms.data(), dy.data(), dx.data(), dw.data(), R, n, &pool);
    else
      rmsnorm_forward(x.data(), w.data(), y.data(), rms.data(), R, n, 1e-6f, &pool);
    benchmark::ClobberMemory();
  }
  // forward: square-sum fma + 2 products per element; backward: ~2 fma + 6 flops per element
  const double flops = static_cast<double>(R * n) * (backward ? 10.0 : 4.0);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(R * n) * 4.0 * (backward ? 3 : 2) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_rmsnorm)
    ->ArgNames({"n", "threads", "bwd"})
    ->ArgsProduct({{128, 512}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// One micro-batch forward+backward of configs/small.toml's model (olmo3 14M body, vocab 2048,
// 4 x 256 tokens): the end-to-end tokens/s of the CPU reference.
void BM_small_model_microbatch(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  ModelConfig m;
  m.vocab_size = 2048;
  m.d_model = 128;
  m.n_layers = 4;
  m.n_heads = 8;
  m.n_kv_heads = 8;
  m.head_dim = 16;
  m.ffn_hidden = 512;
  m.swa_pattern = {128, 128, 128, -1};
  const int64_t B = 4, T = 256;
  Olmo3 model(m, B, T);
  ThreadPool pool(threads);
  std::vector<float> params(model.layout().total), grad(model.layout().total);
  init_params(m, model.layout(), params.data());
  std::vector<uint32_t> tokens(B * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919) % 2048);
  for (auto _ : state) {
    model.forward_backward(params.data(), tokens.data(), B * (T - 1), grad.data(), &pool);
    benchmark::ClobberMemory();
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(B * T), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(m.flops_per_token(T) * B * T * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_small_model_microbatch)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
