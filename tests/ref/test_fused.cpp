// The fused forms of RMSNorm (core/executor.h rmsnorm_residual_forward, rmsnorm_rope_forward and its backward
// rope_rmsnorm_backward) against the op sequences they replace, bit for bit: on every CPU path this machine has
// (scalar, AVX2, AVX-512: the SIMD row kernel carries the fused tail), fp32 and bf16, with and without threads, on
// widths that are no multiple of the register or warp widths and on single rows. Negative controls: the bf16
// rounding points moved or dropped give other bits, so the comparison sees them. And every reduction over an
// instance's rows split in runs, each continuing the chain (accumulate), gives one call's bits on every path
// (tests/common/split_reductions.h: context parallelism's ranks continue them in position order).
#include <doctest.h>

#include <cstring>
#include <vector>

#include "ref/cpu_executor.h"
#include "ref/gemm.h"
#include "core/parallel.h"
#include "tests/kernels/case_loops.h"
#include "tests/common/split_reductions.h"
#include "tests/kernels/norm_cases.h"

using namespace olmoref;

namespace {

std::vector<GemmIsa> cpu_paths() {
  std::vector<GemmIsa> v{GemmIsa::scalar};
  for (GemmIsa isa : {GemmIsa::avx2, GemmIsa::avx512})
    if (gemm_isa_supported(isa)) v.push_back(isa);
  return v;
}

struct IsaGuard {
  ~IsaGuard() { set_gemm_isa(GemmIsa::best); }
};

}  // namespace

namespace {

// Runs `run(executor, fused)` unfused on the scalar path (the definition) and both ways on every CPU path, with and
// without threads; each must give the definition's bits. Returns how many (path, threads) pairs were compared.
template <class Run>
int check_every_path(ThreadPool& pool, const Run& run) {
  set_gemm_isa(GemmIsa::scalar);
  CpuExecutor scalar_ex(&pool);
  const testing::FusedRun definition = run(scalar_ex, false);
  int checked = 0;
  for (GemmIsa path : cpu_paths()) {
    CAPTURE(gemm_isa_name(path));
    set_gemm_isa(path);
    for (ThreadPool* threads : {static_cast<ThreadPool*>(nullptr), &pool}) {
      CpuExecutor ex(threads);
      CHECK(testing::same_bits(run(ex, false), definition));
      CHECK(testing::same_bits(run(ex, true), definition));
      ++checked;
    }
  }
  return checked;
}

}  // namespace

TEST_CASE("rmsnorm_residual_forward equals rmsnorm; round; add; round on every CPU path, fp32 and bf16") {
  IsaGuard guard;
  ThreadPool pool(2);
  int checked = 0;
  for (bool bf16 : {false, true}) {
    CAPTURE(bf16);
    testing::for_each_fused_norm_case(bf16, [&](const testing::NormCase& c, const testing::NormOperands& o) {
      checked += check_every_path(pool, [&](CpuExecutor& ex, bool fused) {
        return testing::run_residual_norm(ex, fused, bf16, c.R, c.n, o);
      });
    });
  }
  CHECK(checked >= 2 * 9 * 2);
}

TEST_CASE("rmsnorm_residual_forward may write its output over the residual") {
  const testing::NormCase c{5, 33};
  const testing::NormOperands o = testing::fused_operands(c.R, c.n, 9, true);
  CpuExecutor ex;
  const testing::FusedRun want = testing::run_residual_norm(ex, false, true, c.R, c.n, o);
  std::vector<float> inout = o.dy, ir(static_cast<size_t>(c.R));
  ex.rmsnorm_residual_forward(inout.data(), o.x.data(), o.w.data(), inout.data(), ir.data(), c.R, c.n, 1e-6f, true);
  CHECK(std::memcmp(inout.data(), want.y.data(), inout.size() * sizeof(float)) == 0);
}

TEST_CASE("rmsnorm_rope_forward and rope_rmsnorm_backward equal their unfused sequences on every CPU path, fp32 and bf16") {
  IsaGuard guard;
  ThreadPool pool(2);
  int forward = 0, backward = 0;
  for (bool bf16 : {false, true}) {
    CAPTURE(bf16);
    testing::for_each_fused_rope_norm_case(bf16, [&](const testing::RopeNormCase& c, const testing::NormOperands& of) {
      // forward: rmsnorm; round; rope; round
      forward += check_every_path(pool, [&](CpuExecutor& ex, bool fused) {
        return testing::run_rope_norm(ex, fused, bf16, c, of);
      });
      // backward: rope_backward; round; rmsnorm_backward
      const testing::NormOperands ob = testing::fused_operands(c.R, c.n(), static_cast<uint32_t>(c.R + 3 * c.hd), bf16);
      backward += check_every_path(pool, [&](CpuExecutor& ex, bool fused) {
        return testing::run_rope_norm_backward(ex, fused, bf16, c, ob);
      });
    });
  }
  CHECK(forward >= 2 * 9 * 2);
  CHECK(backward >= 2 * 9 * 2);
}

TEST_CASE("fused forms negative controls: bf16 rounding points moved or dropped give other bits") {
  CpuExecutor ex;
  {
    // Residual: rounding only the sum (the normed value added unrounded, as a fusing compiler might do).
    const int64_t R = 9, n = 257;
    const testing::NormOperands o = testing::fused_operands(R, n, 4, true);
    const testing::FusedRun fused = testing::run_residual_norm(ex, true, true, R, n, o);
    std::vector<float> y(static_cast<size_t>(R * n)), ir(static_cast<size_t>(R));
    ex.rmsnorm_forward(o.x.data(), o.w.data(), y.data(), ir.data(), R, n, 1e-6f);
    for (size_t i = 0; i < y.size(); ++i) y[i] = round_bf16(o.dy[i] + y[i]);
    CHECK(std::memcmp(y.data(), fused.y.data(), y.size() * sizeof(float)) != 0);
    CHECK(!testing::same_bits(testing::run_residual_norm(ex, true, false, R, n, o), fused));  // fp32 keeps all bits
  }
  {
    // QK-norm + RoPE: the rotation on the unrounded norm output, one rounding at the end.
    const testing::RopeNormCase c{9, 4, 4, 64};
    const testing::NormOperands o = testing::fused_operands(c.R, c.n(), 5, true);
    const testing::FusedRun fused = testing::run_rope_norm(ex, true, true, c, o);
    const RopeTable t = make_rope_table(c.T, c.hd, 500000.0);
    std::vector<float> y(static_cast<size_t>(c.R * c.n())), ir(static_cast<size_t>(c.R));
    ex.rmsnorm_forward(o.x.data(), o.w.data(), y.data(), ir.data(), c.R, c.n(), 1e-6f);
    ex.rope_forward(y.data(), c.R, c.n_heads, RopeView{c.T, c.hd, t.cos.data(), t.sin.data()});
    ex.round_bf16(y.data(), c.R * c.n());
    CHECK(std::memcmp(y.data(), fused.y.data(), y.size() * sizeof(float)) != 0);
  }
  {
    // Backward: the norm backward on the rotated gradient before its rounding.
    const testing::RopeNormCase c{9, 4, 4, 64};
    const testing::NormOperands o = testing::fused_operands(c.R, c.n(), 6, true);
    const testing::FusedRun fused = testing::run_rope_norm_backward(ex, true, true, c, o);
    const RopeTable t = make_rope_table(c.T, c.hd, 500000.0);
    const int64_t rn = c.R * c.n();
    std::vector<float> y(static_cast<size_t>(rn)), ir(static_cast<size_t>(c.R)), dy = o.dy;
    std::vector<float> dx(static_cast<size_t>(rn)), dw(static_cast<size_t>(c.n()));
    ex.rmsnorm_forward(o.x.data(), o.w.data(), y.data(), ir.data(), c.R, c.n(), 1e-6f);
    ex.rope_backward(dy.data(), c.R, c.n_heads, RopeView{c.T, c.hd, t.cos.data(), t.sin.data()});
    ex.rmsnorm_backward(o.x.data(), o.w.data(), ir.data(), dy.data(), dx.data(), dw.data(), c.R, c.n(), false);
    CHECK(std::memcmp(dx.data(), fused.y.data() + rn, dx.size() * sizeof(float)) != 0);
  }
}

TEST_CASE("reductions over rows split in runs (accumulate) equal one call over all rows on every CPU path") {
  IsaGuard guard;
  for (const int threads : {1, 2}) {
    ThreadPool pool(threads);
    CpuExecutor ex(&pool);
    for (GemmIsa path : cpu_paths()) {
      CAPTURE(gemm_isa_name(path));
      CAPTURE(threads);
      set_gemm_isa(path);
      const std::vector<std::string> bad = testing::split_reduction_mismatches(ex);
      CHECK_MESSAGE(bad.empty(), (bad.empty() ? std::string() : bad.front()));
    }
  }
}
