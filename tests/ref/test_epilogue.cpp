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
#include "core/bf16.h"
#include "ref/cpu_executor.h"
#include "ref/gemm.h"
#include "core/mathfn.h"
#include "ref/ops.h"
#include "core/parallel.h"
#include "tests/kernels/swiglu_cases.h"

using namespace olmoref;
using testing::first_diff;
using testing::random_values;
using testing::run_swiglu;
using testing::runs_differ;
using testing::SwigluRun;

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
    for (const testing::SwigluShape& s : testing::kSwigluShapes)
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


TEST_CASE("SwiGLU fused into its products: the unfused sequence's bits on every CPU path and on cuda-host") {
  IsaGuard guard;
  ThreadPool pool(2);
  CpuExecutor cpu(&pool);
  kernels::KernelExecutor cuda_host(false);
  int compared = 0;
  for (bool bf16 : {false, true})
    for (const testing::SwigluShape& s : testing::kSwigluShapes) {
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
  const testing::SwigluShape s{13, 100, 600};
  // fp32 fusion on bf16-valued inputs vs the bf16 sequence: they differ at the rounding points (u, da, a).
  const SwigluRun bf16_seq = run_swiglu(cpu, s, true, false);
  const SwigluRun fp32_fused = run_swiglu(cpu, s, false, true, true);
  CHECK(runs_differ(bf16_seq, run_swiglu(cpu, s, true, true)) == "");  // the same inputs, fused with the rounding
  CHECK(runs_differ(bf16_seq, fp32_fused) != "");
}
