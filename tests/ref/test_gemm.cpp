// tests/ref/test_gemm.cpp — every GEMM path (scalar, AVX2, AVX-512) x thread count (1..4) must equal the
// normative triple loop (gemm_reference) bit for bit, for all three linear-layer products, accumulate on/off,
// a generic strided view, and shapes that hit every tile / block edge (MR, NR, KC = 256, MC, NC = 2048).
// The negative controls at the bottom prove the inputs are sensitive enough that a reordered or unfused
// reduction would be caught.
#include <doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ref/gemm.h"
#include "core/parallel.h"

using namespace olmoref;

namespace {

// splitmix64: deterministic inputs on every machine.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Wide dynamic range (2^-12 .. 2^12), both signs, ~1/16 exact zeros of either sign: absorption and
  // cancellation make the result depend on the summation order, which is what the tests must detect.
  float value() {
    const uint64_t u = next();
    if ((u & 15) == 0) return (u >> 8) & 1 ? -0.0f : 0.0f;
    const float mant = 1.0f + static_cast<float>((u >> 8) & 0xFFFFFF) / 16777216.0f;
    const int e = static_cast<int>((u >> 40) % 25) - 12;
    const float v = std::ldexp(mant, e);
    return (u >> 39) & 1 ? -v : v;
  }
};

std::vector<float> random_vec(size_t n, uint64_t seed) {
  Rng r{seed};
  std::vector<float> v(n);
  for (auto& x : v) x = r.value();
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

size_t count_bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

std::vector<GemmIsa> supported_isas() {
  std::vector<GemmIsa> v;
  for (GemmIsa isa : {GemmIsa::scalar, GemmIsa::avx2, GemmIsa::avx512})
    if (gemm_isa_supported(isa)) v.push_back(isa);
  return v;
}

ThreadPool* pool_of(int n) {
  static std::unique_ptr<ThreadPool> pools[5];
  if (!pools[n]) pools[n] = std::make_unique<ThreadPool>(n);
  return pools[n].get();
}

// Restores the process-wide ISA choice even when a CHECK throws.
struct IsaGuard {
  ~IsaGuard() { set_gemm_isa(GemmIsa::best); }
};

enum class Form { forward, backward_input, backward_weight, strided, padded };
const char* form_name(Form f) {
  switch (f) {
    case Form::forward: return "forward";
    case Form::backward_input: return "backward_input";
    case Form::backward_weight: return "backward_weight";
    case Form::strided: return "strided";
    case Form::padded: return "padded";
  }
  return "?";
}

// One case: (M, N, K) in the linear-layer sense of each product (M tokens, N out, K in); for `strided` it is
// C[M,N] = A[M,K]·B[K,N] with non-unit strides on both sides and ldc > N (the padding must stay untouched);
// for `padded` it is row-major A, B, C with padded rows: lda = 1024 floats (a 4 KiB stride, which the
// kernels copy to a conflict-free stride), ldb = N + 9 (B rows read in place or packed, with the last columns
// under a mask) and ldc = N + 3.
void check_case(Form form, int64_t M, int64_t N, int64_t K, bool accumulate, uint64_t seed) {
  CAPTURE(form_name(form));
  CAPTURE(M);
  CAPTURE(N);
  CAPTURE(K);
  CAPTURE(accumulate);
  IsaGuard guard;

  std::vector<float> a, b, c0;
  int64_t rows = 0, cols = 0, ldc = 0;  // output shape
  MatView va{}, vb{};
  int64_t red = 0;  // reduction length
  switch (form) {
    case Form::forward:  // X[M,K], W[N,K] -> Y[M,N]
      a = random_vec(M * K, seed), b = random_vec(N * K, seed + 1);
      rows = M, cols = N, red = K, va = {a.data(), K, 1}, vb = {b.data(), 1, K};
      break;
    case Form::backward_input:  // dY[M,N], W[N,K] -> dX[M,K]
      a = random_vec(M * N, seed), b = random_vec(N * K, seed + 1);
      rows = M, cols = K, red = N, va = {a.data(), N, 1}, vb = {b.data(), K, 1};
      break;
    case Form::backward_weight:  // dY[M,N], X[M,K] -> dW[N,K]
      a = random_vec(M * N, seed), b = random_vec(M * K, seed + 1);
      rows = N, cols = K, red = M, va = {a.data(), 1, N}, vb = {b.data(), K, 1};
      break;
    case Form::strided:  // A(i,p) = a[i*(2K+3) + 2p], B(p,j) = b[3p + j*(3K+5)]
      a = random_vec(M * (2 * K + 3), seed), b = random_vec(N * (3 * K + 5), seed + 1);
      rows = M, cols = N, red = K, va = {a.data(), 2 * K + 3, 2}, vb = {b.data(), 3, 3 * K + 5};
      break;
    case Form::padded: {
      const int64_t lda = K <= 1024 ? 1024 : K + 1, ldb = N + 9;
      a = random_vec(M * lda, seed), b = random_vec(K * ldb, seed + 1);
      rows = M, cols = N, red = K, va = {a.data(), lda, 1}, vb = {b.data(), ldb, 1};
      break;
    }
  }
  ldc = form == Form::strided ? cols + 7 : form == Form::padded ? cols + 3 : cols;
  c0 = random_vec(rows * ldc, seed + 2);

  std::vector<float> want = c0;
  gemm_reference(rows, cols, red, va, vb, want.data(), ldc, accumulate);

  for (GemmIsa isa : supported_isas()) {
    set_gemm_isa(isa);
    CAPTURE(gemm_isa_name(isa));
    for (int threads = 1; threads <= 4; ++threads) {
      CAPTURE(threads);
      ThreadPool* pool = pool_of(threads);
      std::vector<float> got = c0;
      switch (form) {
        case Form::forward:
          if (!accumulate) matmul_forward(a.data(), b.data(), got.data(), M, N, K, pool);
          else gemm(rows, cols, red, va, vb, got.data(), ldc, true, pool);  // forward never accumulates
          break;
        case Form::backward_input:
          matmul_backward_input(a.data(), b.data(), got.data(), M, N, K, accumulate, pool);
          break;
        case Form::backward_weight:
          matmul_backward_weight(a.data(), b.data(), got.data(), M, N, K, accumulate, pool);
          break;
        case Form::strided:
        case Form::padded:
          gemm(rows, cols, red, va, vb, got.data(), ldc, accumulate, pool);
          break;
      }
      REQUIRE(same_bits(got, want));
    }
  }
}

constexpr int64_t kDims[] = {1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 64, 65, 100, 257};
constexpr int kNumDims = sizeof(kDims) / sizeof(kDims[0]);

}  // namespace

TEST_CASE("gemm: every ISA path is available as the CPU says") {
  IsaGuard guard;
  CHECK(gemm_isa_supported(GemmIsa::scalar));
  set_gemm_isa(GemmIsa::best);
  const GemmIsa best = active_gemm_isa();
  CHECK(best != GemmIsa::best);
  CHECK(gemm_isa_supported(best));
  if (gemm_isa_supported(GemmIsa::avx512)) CHECK(best == GemmIsa::avx512);
  for (GemmIsa isa : {GemmIsa::scalar, GemmIsa::avx2, GemmIsa::avx512}) {
    if (gemm_isa_supported(isa)) {
      set_gemm_isa(isa);
      CHECK(active_gemm_isa() == isa);
    } else {
      CHECK_THROWS(set_gemm_isa(isa));
    }
  }
  MESSAGE("best GEMM path on this machine: " << gemm_isa_name(best));
}

TEST_CASE("gemm: awkward shapes, all products, all paths, 1-4 threads, bitwise equal to the reference") {
  // Every dimension value appears as M, N and K in each of three fixed permutations, so small and large
  // values meet (e.g. 257 x 1 x 65, 1 x 257 x 17).
  uint64_t seed = 1;
  const int mix[3][4] = {{5, 3, 3, 7}, {3, 11, 9, 2}, {11, 6, 13, 12}};  // N = dims[(a*i+b)%n], K = dims[(c*i+d)%n]
  for (Form form : {Form::forward, Form::backward_input, Form::backward_weight, Form::strided, Form::padded})
    for (const auto& m : mix)
      for (int i = 0; i < kNumDims; ++i) {
        const int64_t M = kDims[i], N = kDims[(m[0] * i + m[1]) % kNumDims], K = kDims[(m[2] * i + m[3]) % kNumDims];
        for (bool acc : {false, true}) check_case(form, M, N, K, acc, seed += 10);
      }
}

TEST_CASE("gemm: K blocks (KC = 256) continue the chain in order") {
  uint64_t seed = 1000;
  const int64_t ks[] = {255, 256, 257, 511, 513, 600};
  for (Form form : {Form::forward, Form::backward_input, Form::backward_weight, Form::strided, Form::padded})
    for (int64_t K : ks) {
      // Here K is the reduction length of each product: backward_input reduces over N, backward_weight
      // over M, so the roles are permuted to put K on the reduction.
      const int64_t o1 = 33, o2 = 17;
      for (bool acc : {false, true}) {
        if (form == Form::backward_input) check_case(form, o1, K, o2, acc, seed += 10);
        else if (form == Form::backward_weight) check_case(form, K, o1, o2, acc, seed += 10);
        else check_case(form, o1, o2, K, acc, seed += 10);
      }
    }
}

TEST_CASE("gemm: larger case crosses the MC and NC blocks and splits over threads both ways") {
  // C[300, 2085] over K = 270: several MC row blocks, one NC = 2048 column block boundary, two K blocks.
  check_case(Form::forward, 300, 2085, 270, false, 77);
  // dW[67, 1030] over M = 300 tokens: a short, wide output that the thread split cuts by columns.
  check_case(Form::backward_weight, 300, 67, 1030, true, 78);
  // dW[450, 95] over M = 120: more output rows than the in-place-B limit at 1 thread, fewer per thread at 4.
  check_case(Form::backward_weight, 120, 450, 95, false, 79);
  // dX[450, 70] over N = 100, and a 4 KiB-strided A: packed and in-place B, copied A rows.
  check_case(Form::backward_input, 450, 100, 70, true, 80);
  check_case(Form::padded, 450, 70, 300, false, 81);
  // dW[1024, 45] over M = 70: dYᵀ's K step is 1024 floats (4 KiB), which the kernels pack instead of reading.
  check_case(Form::backward_weight, 70, 1024, 45, true, 82);
}

TEST_CASE("gemm: K = 0 is the empty chain") {
  std::vector<float> a(6, 1.0f), b(6, 1.0f), c(4, 5.0f);
  gemm(2, 2, 0, {a.data(), 3, 1}, {b.data(), 2, 1}, c.data(), 2, true, nullptr);
  CHECK(c[0] == 5.0f);
  gemm(2, 2, 0, {a.data(), 3, 1}, {b.data(), 2, 1}, c.data(), 2, false, nullptr);
  CHECK(c[3] == 0.0f);
}

// ---- negative controls: the inputs above can tell a wrong order from the right one -------------------

TEST_CASE("gemm negative control: K split in halves and added afterwards changes bits") {
  const int64_t M = 33, N = 31, K = 200;
  const auto a = random_vec(M * K, 5), b = random_vec(K * N, 6);
  std::vector<float> want(M * N), lo(M * N), hi(M * N), split(M * N);
  gemm_reference(M, N, K, {a.data(), K, 1}, {b.data(), N, 1}, want.data(), N, false);
  gemm_reference(M, N, K / 2, {a.data(), K, 1}, {b.data(), N, 1}, lo.data(), N, false);
  gemm_reference(M, N, K - K / 2, {a.data() + K / 2, K, 1}, {b.data() + (K / 2) * N, N, 1}, hi.data(), N, false);
  for (size_t i = 0; i < split.size(); ++i) split[i] = lo[i] + hi[i];
  const size_t diffs = count_bit_diffs(want, split);
  MESSAGE("split-K sum differs in " << diffs << " of " << want.size() << " elements");
  CHECK(diffs > want.size() / 4);
}

TEST_CASE("gemm negative control: reversed K order and unfused multiply-add change bits") {
  const int64_t M = 17, N = 16, K = 130;
  const auto a = random_vec(M * K, 7), b = random_vec(K * N, 8);
  std::vector<float> want(M * N), reversed(M * N), unfused(M * N);
  gemm_reference(M, N, K, {a.data(), K, 1}, {b.data(), N, 1}, want.data(), N, false);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float r = 0.0f, u = 0.0f;
      for (int64_t p = K - 1; p >= 0; --p) r = std::fma(a[i * K + p], b[p * N + j], r);
      for (int64_t p = 0; p < K; ++p) {
        const float prod = a[i * K + p] * b[p * N + j];  // rounded separately (-ffp-contract=off)
        u = u + prod;
      }
      reversed[i * N + j] = r;
      unfused[i * N + j] = u;
    }
  CHECK(count_bit_diffs(want, reversed) > want.size() / 4);
  CHECK(count_bit_diffs(want, unfused) > want.size() / 4);
}
