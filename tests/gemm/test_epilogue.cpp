// GEMM epilogues (ref/gemm.h GemmEpilogue) and the SwiGLU fusions built on them (ref/ops.h
// matmul_forward_swiglu, matmul_backward_input_swiglu; the executor ops of the same names):
//  - the driver calls the epilogue exactly once per output element, after the last fma of its chain (the value it
//    sees is the reference product's bits), on every ISA path, thread count and K blocking;
//  - each fused op gives exactly the bits of the unfused sequence (product; bf16 round; SwiGLU op), in fp32 and
//    bf16, on the CPU executor at every ISA and on the CUDA kernels executed on the host (cuda-host);
//  - negative control: the bf16 fusion without its rounding point gives other bits.
#include <doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/executor.h"
#include "ref/bf16.h"
#include "ref/cpu_executor.h"
#include "ref/gemm.h"
#include "ref/mathfn.h"
#include "ref/ops.h"
#include "ref/parallel.h"

using namespace olmoref;

namespace {

struct IsaGuard {
  ~IsaGuard() { set_gemm_isa(GemmIsa::best); }
};

std::vector<GemmIsa> supported_isas() {
  std::vector<GemmIsa> v;
  for (GemmIsa isa : {GemmIsa::scalar, GemmIsa::avx2, GemmIsa::avx512})
    if (gemm_isa_supported(isa)) v.push_back(isa);
  return v;
}

std::vector<float> random_values(int64_t n, uint32_t seed, bool bf16) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = bf16 ? round_bf16(dist(rng)) : dist(rng);
  return v;
}

// First index whose bits differ (two NaNs match: see tests/ref/test_simd.cpp), or -1.
int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (det::bits(a[i]) != det::bits(b[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

// Shapes (M, N, K) of the product: single elements, tails of every tile, several K blocks (KC is 256-512 on the
// CPU paths, 16 on the CUDA kernel), and enough rows to split over threads.
struct Shape {
  int64_t M, N, K;
};
const Shape kShapes[] = {{1, 1, 1}, {7, 37, 5}, {13, 100, 600}, {70, 33, 1030}, {130, 260, 64}};

// Records, for each element, how often the epilogue saw it and the value it saw.
struct Recorder {
  int64_t ldc;
  std::vector<int>* calls;
  std::vector<float>* seen;
};
void record(const void* ctx, float* c_row, int64_t i, int64_t j0, int64_t n) {
  const auto& r = *static_cast<const Recorder*>(ctx);
  for (int64_t j = 0; j < n; ++j) {
    ++(*r.calls)[static_cast<size_t>(i * r.ldc + j0 + j)];
    (*r.seen)[static_cast<size_t>(i * r.ldc + j0 + j)] = c_row[j];
  }
}

}  // namespace

TEST_CASE("gemm epilogue: once per element, after the last fma of its chain, on every path, split and K blocking") {
  IsaGuard guard;
  ThreadPool pool2(2), pool4(4);
  int runs = 0;
  for (GemmIsa isa : supported_isas()) {
    set_gemm_isa(isa);
    for (const Shape& s : kShapes)
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool4})
        for (bool accumulate : {false, true}) {
          CAPTURE(gemm_isa_name(isa));
          CAPTURE(s.M);
          CAPTURE(s.N);
          CAPTURE(s.K);
          CAPTURE(accumulate);
          const std::vector<float> a = random_values(s.M * s.K, 1, false), b = random_values(s.K * s.N, 2, false);
          const std::vector<float> c0 = random_values(s.M * s.N, 3, false);
          std::vector<float> want = c0, got = c0, seen(c0.size(), NAN);
          std::vector<int> calls(c0.size(), 0);
          gemm_reference(s.M, s.N, s.K, {a.data(), s.K, 1}, {b.data(), s.N, 1}, want.data(), s.N, accumulate);
          const Recorder rec{s.N, &calls, &seen};
          const GemmEpilogue epi{&record, &rec};
          gemm(s.M, s.N, s.K, {a.data(), s.K, 1}, {b.data(), s.N, 1}, got.data(), s.N, accumulate, pool, &epi);
          CHECK(first_diff(want, got) == -1);
          CHECK(first_diff(want, seen) == -1);  // the epilogue saw each chain's final value
          int64_t wrong_calls = 0;
          for (int c : calls) wrong_calls += c != 1;
          CHECK(wrong_calls == 0);
          ++runs;
        }
  }
  CHECK(runs >= 30);  // the scalar path at least
}

TEST_CASE("gemm epilogue: K = 0 still visits every element of the empty chain") {
  std::vector<float> c(12, 5.0f), seen(12, NAN);
  std::vector<int> calls(12, 0);
  const Recorder rec{4, &calls, &seen};
  const GemmEpilogue epi{&record, &rec};
  const float dummy = 0.0f;
  gemm(3, 4, 0, {&dummy, 0, 1}, {&dummy, 4, 1}, c.data(), 4, false, nullptr, &epi);
  for (size_t i = 0; i < c.size(); ++i) {
    CHECK(calls[i] == 1);
    CHECK(det::bits(seen[i]) == det::bits(0.0f));
  }
}

namespace {

// The fused ops and the unfused sequence on one executor (host memory in, host memory out).
struct SwigluRun {
  std::vector<float> u, a, dg, du;
};

// bf16_inputs: the operands are bf16-valued (always so in bf16).
SwigluRun run_swiglu(Executor& ex, const Shape& s, bool bf16, bool fused, bool bf16_inputs = false) {
  const bool q = bf16 || bf16_inputs;
  // Forward: u [M, N] = X [M, K]·W3 [N, K]ᵀ, a = SwiGLU(g, u). Backward: da [M, N] = dY [M, K2]·W2 [K2, N] with
  // K2 = K (the product's reduction), then dg, du [M, N].
  const int64_t M = s.M, N = s.N, K = s.K;
  const std::vector<float> x = random_values(M * K, 11, q), w3 = random_values(N * K, 12, q);
  std::vector<float> g = random_values(M * N, 13, q), u_given = random_values(M * N, 14, q);
  const std::vector<float> dy = random_values(M * K, 15, q), w2 = random_values(K * N, 16, q);
  // SiLU's edges: ±inf, huge and tiny gates (every 17th element).
  const float edges[] = {INFINITY, -INFINITY, 88.0f, -104.0f, 1e-30f, -0.0f};
  for (size_t i = 0; i < g.size(); i += 17) g[i] = edges[(i / 17) % 6];
  auto up = [&](const std::vector<float>& h, const char* what) {
    float* p = static_cast<float*>(ex.allocate(h.size() * sizeof(float), what));
    ex.to_device(p, h.data(), h.size() * sizeof(float));
    return p;
  };
  auto scratch = [&](int64_t n, const char* what) {
    float* p = static_cast<float*>(ex.allocate(static_cast<size_t>(n) * sizeof(float), what));
    ex.zero(p, static_cast<size_t>(n) * sizeof(float));
    return p;
  };
  float *dx = up(x, "x"), *dw3 = up(w3, "w3"), *dgate = up(g, "g"), *du_given = up(u_given, "u"), *ddy = up(dy, "dy"),
        *dw2 = up(w2, "w2");
  float *u = scratch(M * N, "u out"), *a = scratch(M * N, "a"), *dg = scratch(M * N, "dg"), *du = scratch(M * N, "du"),
        *da = scratch(M * N, "da");
  if (fused) {
    ex.matmul_forward_swiglu(dx, dw3, dgate, u, a, M, N, K, bf16);
    ex.matmul_backward_input_swiglu(ddy, dw2, dgate, du_given, dg, du, M, K, N, bf16);
  } else {
    ex.matmul_forward(dx, dw3, u, M, N, K);
    if (bf16) ex.round_bf16(u, M * N);
    ex.swiglu_forward(dgate, u, a, M * N, bf16);
    ex.matmul_backward_input(ddy, dw2, da, M, K, N, false);
    if (bf16) ex.round_bf16(da, M * N);
    ex.swiglu_backward(dgate, du_given, da, dg, du, M * N, bf16);
  }
  SwigluRun r;
  for (auto [dev, host] : {std::pair{u, &r.u}, std::pair{a, &r.a}, std::pair{dg, &r.dg}, std::pair{du, &r.du}}) {
    host->resize(static_cast<size_t>(M * N));
    ex.to_host(host->data(), dev, host->size() * sizeof(float));
  }
  for (float* p : {dx, dw3, dgate, du_given, ddy, dw2, u, a, dg, du, da}) ex.deallocate(p);
  return r;
}

std::string runs_differ(const SwigluRun& want, const SwigluRun& got) {
  if (int64_t i = first_diff(want.u, got.u); i >= 0) return "u at " + std::to_string(i);
  if (int64_t i = first_diff(want.a, got.a); i >= 0) return "a at " + std::to_string(i);
  if (int64_t i = first_diff(want.dg, got.dg); i >= 0) return "dg at " + std::to_string(i);
  if (int64_t i = first_diff(want.du, got.du); i >= 0) return "du at " + std::to_string(i);
  return "";
}

}  // namespace

TEST_CASE("SwiGLU fused into its products: the unfused sequence's bits on every CPU path and on cuda-host") {
  IsaGuard guard;
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor cuda_host(false);
  int compared = 0;
  for (bool bf16 : {false, true})
    for (const Shape& s : kShapes) {
      CAPTURE(bf16);
      CAPTURE(s.M);
      CAPTURE(s.N);
      CAPTURE(s.K);
      set_gemm_isa(GemmIsa::scalar);
      const SwigluRun want = run_swiglu(cpu, s, bf16, false);
      for (GemmIsa isa : supported_isas()) {
        CAPTURE(gemm_isa_name(isa));
        set_gemm_isa(isa);
        CHECK(runs_differ(want, run_swiglu(cpu, s, bf16, true)) == "");
        CHECK(runs_differ(want, run_swiglu(cpu, s, bf16, false)) == "");
        ++compared;
      }
      CHECK(runs_differ(want, run_swiglu(cuda_host, s, bf16, true)) == "");
      CHECK(runs_differ(want, run_swiglu(cuda_host, s, bf16, false)) == "");
    }
  CHECK(compared >= 10);
}

TEST_CASE("SwiGLU fusion negative control: dropping the bf16 rounding point changes the bits") {
  CpuExecutor cpu;
  const Shape s{13, 100, 600};
  // fp32 fusion on bf16-valued inputs vs the bf16 sequence: they differ at the rounding points (u, da, a).
  const SwigluRun bf16_seq = run_swiglu(cpu, s, true, false);
  const SwigluRun fp32_fused = run_swiglu(cpu, s, false, true, true);
  CHECK(runs_differ(bf16_seq, run_swiglu(cpu, s, true, true)) == "");  // the same inputs, fused with the rounding
  CHECK(runs_differ(bf16_seq, fp32_fused) != "");
}
