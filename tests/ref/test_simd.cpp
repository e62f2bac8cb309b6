// The SIMD paths of the CPU reference (ref/simd_ops.h) against the scalar definition, bit for bit (a NaN matches
// any NaN: which NaN an operation passes on when two meet depends on the instruction form the compiler picks, in
// the scalar code as much as in the SIMD code, so NaN sign and payload were never part of the contract): expf, logf, sigmoid
// and SiLU over every special value and a dense sample of all 2^32 fp32 patterns; the canonical reductions and the
// sequential max (signed zeros, NaN, inf, every tail length); attention forward and backward over shapes that hit
// every edge of the banded chains (window 1, windows longer than T, full causal, GQA, T not a multiple of any
// block, head dims of 1..8 registers, values outside a window that are NaN or inf); attention with documents inside
// the instances against each document run alone; attention over a part of an instance (context parallelism)
// against the whole instance; RMSNorm, SwiGLU and the cross-entropy row. Each path the CPU has runs; the test fails if the machine has AVX2 but no path ran.
#include <doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/documents.h"
#include "ref/gemm.h"
#include "core/mathfn.h"
#include "ref/ops.h"
#include "core/parallel.h"
#include "core/reduce.h"
#include "ref/simd_ops.h"
#include "tests/common/attention_parts.h"

using namespace olmoref;

namespace {

std::vector<GemmIsa> simd_isas() {
  std::vector<GemmIsa> v;
  for (GemmIsa isa : {GemmIsa::avx2, GemmIsa::avx512})
    if (gemm_isa_supported(isa)) v.push_back(isa);
  return v;
}

// The scalar definition first, then every SIMD path this CPU has.
std::vector<GemmIsa> every_path() {
  std::vector<GemmIsa> v = simd_isas();
  v.insert(v.begin(), GemmIsa::scalar);
  return v;
}

struct IsaGuard {
  ~IsaGuard() { set_gemm_isa(GemmIsa::best); }
};

uint32_t bits_of(float x) { return det::bits(x); }
float from_bits(uint32_t u) { return det::from_bits(u); }

// Index of the first element whose bits differ, or -1. With nan_class, two NaNs count as equal whatever their
// sign and payload: where a NaN meets another NaN (or 0·inf makes the default one), which one an fma passes on
// depends on its operand order, which the compiler picks per instruction form.
int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b, bool nan_class = false) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (nan_class && std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (bits_of(a[i]) != bits_of(b[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

// Special values and the edges of expf's domain and of its k = 128 split, with their neighbours.
std::vector<float> special_inputs() {
  std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(), from_bits(0x7f800001u), from_bits(0xffc12345u),
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(), 1.0f, -1.0f, 0.5f};
  for (float edge : {88.72283935546875f, -87.5f, 88.0f, 88.3762626647949f, -87.3365447505531f, 44.0f, -44.0f,
                     0.34657359f, -0.34657359f, 87.0f, -87.0f}) {
    float x = edge;
    for (int i = 0; i < 64; ++i) x = std::nextafter(x, -INFINITY);
    for (int i = 0; i < 128; ++i) {
      v.push_back(x);
      x = std::nextafter(x, INFINITY);
    }
  }
  return v;
}

template <class F>
void check_map(const char* name, void (*simd_fn)(const float*, float*, int64_t), F scalar) {
  // Specials, then every 61st bit pattern of all 2^32 (70 million inputs, both signs, every exponent).
  std::vector<float> x = special_inputs();
  const size_t n_special = x.size();
  constexpr int64_t kChunk = 1 << 20;
  x.resize(kChunk);
  std::vector<float> got(kChunk);
  int64_t checked = 0, bad = 0;
  uint32_t first_bad = 0;
  auto run_chunk = [&](size_t n) {
    simd_fn(x.data(), got.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      const float want = scalar(x[i]);
      if (std::isnan(want) && std::isnan(got[i])) continue;  // NaN's sign and payload are not part of the contract
      if (bits_of(got[i]) != bits_of(want)) {
        if (bad++ == 0) first_bad = bits_of(x[i]);
      }
    }
    checked += static_cast<int64_t>(n);
  };
  run_chunk(n_special);
  uint64_t pattern = 0;
  while (pattern < (1ull << 32)) {
    size_t n = 0;
    for (; n < static_cast<size_t>(kChunk) && pattern < (1ull << 32); ++n, pattern += 61)
      x[n] = from_bits(static_cast<uint32_t>(pattern));
    // Odd lengths so the masked tail runs too.
    run_chunk(n > 7 ? n - 7 : n);
  }
  char first[16];
  std::snprintf(first, sizeof first, "%08x", first_bad);
  INFO(std::string(name) << ": " << bad << " of " << checked << " differ; first input bits 0x" << first);
  CHECK(bad == 0);
  CHECK(checked > 70000000);
}

std::vector<float> normals(int64_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST_CASE("SIMD paths exist where the CPU has them, and follow the GEMM's ISA switch") {
  IsaGuard guard;
  set_gemm_isa(GemmIsa::scalar);
  CHECK(simd::active_simd_ops() == nullptr);
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) CHECK(!simd_isas().empty());
#endif
  for (GemmIsa isa : simd_isas()) {
    set_gemm_isa(isa);
    REQUIRE(simd::active_simd_ops() != nullptr);
    CHECK(std::string(simd::active_simd_ops()->name) == gemm_isa_name(isa));
  }
  MESSAGE("SIMD paths tested here: " << simd_isas().size());
}

TEST_CASE("SIMD expf, logf, sigmoid and SiLU are bit-identical to the scalar definitions") {
  for (GemmIsa isa : simd_isas()) {
    const simd::SimdOps* ops = simd::simd_ops_for(isa);
    REQUIRE(ops);
    CAPTURE(gemm_isa_name(isa));
    check_map("expf", ops->expf, [](float x) { return det::expf(x); });
    check_map("logf", ops->logf, [](float x) { return det::logf(x); });
    check_map("sigmoidf", ops->sigmoidf, [](float x) { return det::sigmoidf(x); });
    check_map("siluf", ops->siluf, [](float x) { return det::siluf(x); });
  }
}

TEST_CASE("SIMD canonical sum, dot and sequential max: every tail, signed zeros, NaN and inf") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (GemmIsa isa : simd_isas()) {
    const simd::SimdOps* ops = simd::simd_ops_for(isa);
    CAPTURE(gemm_isa_name(isa));
    for (int64_t n = 0; n <= 200; ++n) {
      CAPTURE(n);
      for (int variant = 0; variant < 6; ++variant) {
        std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          a[i] = nd(rng);
          b[i] = nd(rng);
        }
        if (variant == 1) for (auto& x : a) x = -0.0f;                      // sums of -0 stay -0 per lane
        if (variant == 2) for (int64_t i = 0; i < n; ++i) a[i] = i % 3 ? -0.0f : 0.0f;  // max of mixed zeros
        if (variant == 3 && n > 0) a[rng() % n] = std::numeric_limits<float>::quiet_NaN();
        if (variant == 4 && n > 0) a[rng() % n] = INFINITY;
        if (variant == 5) for (auto& x : a) x = -std::fabs(x);              // all negative: max below zero
        CHECK(bits_of(ops->canonical_sum(a.data(), n)) == bits_of(canonical_sum(a.data(), n)));
        CHECK(bits_of(ops->canonical_dot(a.data(), b.data(), n)) == bits_of(canonical_dot(a.data(), b.data(), n)));
        float m = -INFINITY;
        for (float x : a) m = std::max(m, x);
        CHECK(bits_of(ops->row_max(a.data(), n)) == bits_of(m));
      }
    }
  }
}

TEST_CASE("SIMD attention forward and backward are bit-identical to the scalar definition") {
  IsaGuard guard;
  struct Case {
    int64_t B, T, H, KV, hd, window;
    bool bf16 = false;
  };
  std::vector<Case> cases = {
      {1, 1, 1, 1, 16, 0},    {2, 37, 4, 2, 16, 1},   {1, 37, 4, 2, 16, 50},  {2, 70, 4, 4, 32, 16},
      {1, 130, 6, 2, 64, 0},  {1, 65, 2, 1, 48, 7},   {1, 200, 2, 2, 16, 128}, {1, 64, 2, 2, 128, 64},
      {1, 129, 2, 1, 16, 64}, {1, 90, 3, 3, 80, 33},  {1, 17, 2, 2, 8, 4},    {1, 50, 2, 1, 24, 0},
      {1, 100, 4, 2, 16, 32, true}, {1, 70, 2, 1, 64, 0, true}, {2, 33, 2, 2, 8, 5, true},
      // Bands longer than one chunk of the chained index (256 keys at hd 16, 128 at hd 32, 64 at hd 64).
      {1, 600, 2, 1, 16, 0},  {1, 300, 2, 2, 32, 170}, {1, 200, 1, 1, 64, 150, true},
  };
  ThreadPool pool(2);
  for (GemmIsa isa : simd_isas()) {
    for (const Case& c : cases) {
      for (int poison = 0; poison < 2; ++poison) {
        CAPTURE(gemm_isa_name(isa));
        CAPTURE(c.T);
        CAPTURE(c.hd);
        CAPTURE(c.window);
        CAPTURE(c.H);
        CAPTURE(c.KV);
        CAPTURE(poison);
        CAPTURE(c.bf16);
        AttentionShape s{c.B, c.T, c.H, c.KV, c.hd, c.window, 1.0f / std::sqrt(static_cast<float>(c.hd))};
        s.precision = c.bf16 ? Precision::bf16 : Precision::fp32;
        const int64_t nq = c.B * c.T * c.H * c.hd, nk = c.B * c.T * c.KV * c.hd;
        std::vector<float> q = normals(nq, 1 + static_cast<uint32_t>(c.T)), k = normals(nk, 2), v = normals(nk, 3);
        std::vector<float> dout = normals(nq, 4);
        if (c.bf16)  // the recipe's operands are bf16-valued
          for (auto* x : {&q, &k, &v, &dout})
            for (float& e : *x) e = round_bf16(e);
        if (poison && c.window > 0 && c.T > c.window + 2) {
          // Key 0 is outside the windows of queries >= window: NaN / inf there may only reach the queries that see it.
          v[0] = std::numeric_limits<float>::quiet_NaN();
          k[1] = INFINITY;
        }
        struct Result {
          std::vector<float> out, rmax, rsum, dq, dk, dv;
        };
        auto run = [&](GemmIsa path) {
          set_gemm_isa(path);
          Result r;
          r.out.resize(nq);
          r.rmax.resize(c.B * c.H * c.T);
          r.rsum.resize(c.B * c.H * c.T);
          r.dq.resize(nq);
          r.dk.resize(nk);
          r.dv.resize(nk);
          attention_forward(s, q.data(), k.data(), v.data(), r.out.data(), r.rmax.data(), r.rsum.data(), &pool);
          attention_backward(s, q.data(), k.data(), v.data(), r.out.data(), r.rmax.data(), r.rsum.data(),
                             dout.data(), r.dq.data(), r.dk.data(), r.dv.data(), &pool);
          return r;
        };
        const Result want = run(GemmIsa::scalar), got = run(isa);
        CHECK(first_diff(got.out, want.out, poison) == -1);
        CHECK(first_diff(got.rmax, want.rmax, poison) == -1);
        CHECK(first_diff(got.rsum, want.rsum, poison) == -1);
        CHECK(first_diff(got.dq, want.dq, poison) == -1);
        CHECK(first_diff(got.dk, want.dk, poison) == -1);
        CHECK(first_diff(got.dv, want.dv, poison) == -1);
        if (poison && c.window > 0 && c.T > c.window + 2) {
          // The poison really was outside some windows: the last query's output is finite.
          CHECK(std::isfinite(want.out[(c.T - 1) * c.H * c.hd]));
          CHECK(std::isnan(want.out[0]));
        }
      }
    }
  }
}

// Intra-document masking (docs/canonical/documents.md) defined by what it must equal: each document of an instance
// run alone as its own sequence, with no documents at all. The masked keys are skipped, not weighted by zero, so
// every output row, row statistic and gradient of a document is that run's, bit for bit, on the scalar definition
// and on each SIMD path. A mask one token off (a document's first query also seeing the EOS before it) is caught.
TEST_CASE("attention with documents equals each document run alone, bit for bit (scalar and every SIMD path)") {
  IsaGuard guard;
  struct Case {
    int64_t T, H, KV, hd, window;
    bool bf16;
  };
  const std::vector<Case> cases = {{70, 4, 2, 16, 0, false}, {70, 4, 2, 16, 9, false}, {90, 2, 1, 64, 33, false},
                                   {60, 2, 2, 8, 0, false},  {64, 4, 2, 16, 16, true}};
  // Two instances: documents of lengths ending at EOS at 3, 4 (two in a row), 20, 41 and the last position; and a
  // second with EOS at random positions.
  auto documents = [](int64_t T) {
    std::vector<uint32_t> tokens(static_cast<size_t>(2 * T), 2);
    for (const int64_t i : {int64_t{3}, int64_t{4}, int64_t{20}, int64_t{41}, T - 1}) tokens[static_cast<size_t>(i)] = 1;
    std::mt19937 rng(7);
    for (int64_t i = T; i < 2 * T; ++i)
      if (rng() % 6 == 0) tokens[static_cast<size_t>(i)] = 1;
    return tokens;
  };
  ThreadPool pool(2);
  for (GemmIsa isa : every_path()) {
    set_gemm_isa(isa);
    for (const Case& c : cases) {
      CAPTURE(gemm_isa_name(isa));
      CAPTURE(c.T);
      CAPTURE(c.hd);
      CAPTURE(c.window);
      CAPTURE(c.bf16);
      const int64_t B = 2, T = c.T, qw = c.H * c.hd, kw = c.KV * c.hd;
      std::vector<float> q = normals(B * T * qw, 21), k = normals(B * T * kw, 22), v = normals(B * T * kw, 23),
                         dout = normals(B * T * qw, 24);
      if (c.bf16)
        for (auto* x : {&q, &k, &v, &dout})
          for (float& e : *x) e = round_bf16(e);
      const std::vector<uint32_t> tokens = documents(T);
      std::vector<int32_t> start, end;
      std::vector<std::pair<int64_t, int64_t>> docs;  // each document: its first row b·T + i0, its length
      for (int64_t b = 0; b < B; ++b) {
        const DocumentPositions p = document_positions(tokens.data() + b * T, T, 1);
        int32_t at = 0;
        for (const int32_t len : document_lengths(tokens.data() + b * T, T, 1)) {
          docs.push_back({b * T + at, len});
          at += len;
        }
        start.insert(start.end(), p.start.begin(), p.start.end());
        end.insert(end.end(), p.end.begin(), p.end.end());
      }
      struct Result {
        std::vector<float> out, rmax, rsum, dq, dk, dv;
      };
      // The attention of rows [first, first + n) of every operand as instances of n positions (B' = rows / n).
      auto run = [&](int64_t b_count, int64_t n, const float* qs, const float* ks, const float* vs, const float* gs,
                     const int32_t* doc_start, const int32_t* doc_end) {
        AttentionShape s{b_count, n, c.H, c.KV, c.hd, c.window, 1.0f / std::sqrt(static_cast<float>(c.hd))};
        s.precision = c.bf16 ? Precision::bf16 : Precision::fp32;
        s.doc_start = doc_start, s.doc_end = doc_end;
        Result r;
        r.out.resize(static_cast<size_t>(b_count * n * qw));
        r.rmax.resize(static_cast<size_t>(b_count * c.H * n));
        r.rsum.resize(r.rmax.size());
        r.dq.resize(r.out.size());
        r.dk.resize(static_cast<size_t>(b_count * n * kw));
        r.dv.resize(r.dk.size());
        attention_forward(s, qs, ks, vs, r.out.data(), r.rmax.data(), r.rsum.data(), &pool);
        attention_backward(s, qs, ks, vs, r.out.data(), r.rmax.data(), r.rsum.data(), gs, r.dq.data(), r.dk.data(),
                           r.dv.data(), &pool);
        return r;
      };
      auto mismatches = [&](const std::vector<int32_t>& doc_start, const std::vector<int32_t>& doc_end) {
        const Result all = run(B, T, q.data(), k.data(), v.data(), dout.data(), doc_start.data(), doc_end.data());
        int bad = 0;
        for (const auto& [first, n] : docs) {
          const int64_t b = first / T, i0 = first % T;
          const Result alone = run(1, n, q.data() + first * qw, k.data() + first * kw, v.data() + first * kw,
                                   dout.data() + first * qw, nullptr, nullptr);
          auto rows_equal = [&](const std::vector<float>& x, const std::vector<float>& y, int64_t width) {
            return std::memcmp(x.data() + first * width, y.data(), static_cast<size_t>(n * width) * sizeof(float)) == 0;
          };
          bool same = rows_equal(all.out, alone.out, qw) && rows_equal(all.dq, alone.dq, qw) &&
                      rows_equal(all.dk, alone.dk, kw) && rows_equal(all.dv, alone.dv, kw);
          for (int64_t h = 0; h < c.H; ++h)  // the row statistics are [B, H, T]
            same = same &&
                   std::memcmp(all.rmax.data() + (b * c.H + h) * T + i0, alone.rmax.data() + h * n,
                               static_cast<size_t>(n) * sizeof(float)) == 0 &&
                   std::memcmp(all.rsum.data() + (b * c.H + h) * T + i0, alone.rsum.data() + h * n,
                               static_cast<size_t>(n) * sizeof(float)) == 0;
          bad += !same;
        }
        return bad;
      };
      CHECK(docs.size() > 8);
      CHECK(mismatches(start, end) == 0);
      // One token off: the document after position 20 also sees that EOS (its first query's band starts at 20).
      std::vector<int32_t> off = start;
      off[21] = 20;
      CHECK(mismatches(off, end) > 0);
    }
  }
}

// Context parallelism (core/op_types.h AttentionShape q_begin .. k_end): a call over a part of the instance writes
// the rows of its queries (out, row statistics, dq) and keys (dk, dv) with the bits the whole-instance call gives
// them and leaves every other row as it was, for the parts of OLMo-core's llama3 sharding at 2, 3 and 4 ranks and
// parts no sharding makes (tests/common/attention_parts.h); windows, full causal, GQA, documents and bf16, on the
// scalar definition and each SIMD path. The backward reads the whole instance's out and statistics, as the ranks
// gather them. A part leaving the instance is refused.
TEST_CASE("attention over a part of an instance writes exactly its rows, with the whole instance's bits") {
  IsaGuard guard;
  struct Case {
    int64_t B, T, H, KV, hd, window;
    bool bf16 = false, docs = false;
  };
  const std::vector<Case> cases = {{2, 37, 4, 2, 16, 1},  {1, 130, 6, 2, 64, 0},         {2, 70, 4, 4, 32, 16},
                                   {1, 45, 4, 2, 8, 9},   {1, 100, 4, 2, 16, 32, true},  {1, 300, 2, 1, 16, 0},
                                   {2, 90, 4, 2, 16, 0, false, true}, {1, 64, 4, 2, 16, 16, true, true}};
  ThreadPool pool(2);
  for (GemmIsa isa : every_path()) {
    set_gemm_isa(isa);
    for (const Case& c : cases) {
      CAPTURE(gemm_isa_name(isa));
      CAPTURE(c.T);
      CAPTURE(c.hd);
      CAPTURE(c.window);
      CAPTURE(c.bf16);
      CAPTURE(c.docs);
      AttentionShape s{c.B, c.T, c.H, c.KV, c.hd, c.window, 1.0f / std::sqrt(static_cast<float>(c.hd))};
      s.precision = c.bf16 ? Precision::bf16 : Precision::fp32;
      const int64_t qw = c.H * c.hd, kw = c.KV * c.hd, nq = c.B * c.T * qw, nk = c.B * c.T * kw;
      const int64_t stats = c.B * c.H * c.T;
      std::vector<float> q = normals(nq, 31), k = normals(nk, 32), v = normals(nk, 33), dout = normals(nq, 34);
      if (c.bf16)
        for (auto* x : {&q, &k, &v, &dout})
          for (float& e : *x) e = round_bf16(e);
      std::vector<int32_t> start, end;
      if (c.docs) {  // EOS about one in seven, and at positions 3 and 4
        std::mt19937 rng(5);
        for (int64_t b = 0; b < c.B; ++b) {
          std::vector<uint32_t> tokens(static_cast<size_t>(c.T), 2);
          for (uint32_t& t : tokens)
            if (rng() % 7 == 0) t = 1;
          tokens[3] = tokens[4] = 1;
          const DocumentPositions p = document_positions(tokens.data(), c.T, 1);
          start.insert(start.end(), p.start.begin(), p.start.end());
          end.insert(end.end(), p.end.begin(), p.end.end());
        }
        s.doc_start = start.data(), s.doc_end = end.data();
      }
      testing::AttentionOutputs whole{std::vector<float>(nq),    std::vector<float>(stats), std::vector<float>(stats),
                                      std::vector<float>(nq),    std::vector<float>(nk),    std::vector<float>(nk)};
      attention_forward(s, q.data(), k.data(), v.data(), whole.out.data(), whole.row_max.data(), whole.row_sum.data(),
                        &pool);
      attention_backward(s, q.data(), k.data(), v.data(), whole.out.data(), whole.row_max.data(), whole.row_sum.data(),
                         dout.data(), whole.dq.data(), whole.dk.data(), whole.dv.data(), &pool);
      for (const testing::AttentionPart& part : testing::attention_parts(c.T)) {
        CAPTURE(part.q_begin);
        CAPTURE(part.q_end);
        CAPTURE(part.k_begin);
        CAPTURE(part.k_end);
        AttentionShape ps = s;
        ps.q_begin = part.q_begin, ps.q_end = part.q_end, ps.k_begin = part.k_begin, ps.k_end = part.k_end;
        testing::AttentionOutputs got = testing::unwritten_outputs(nq, stats, nk);
        attention_forward(ps, q.data(), k.data(), v.data(), got.out.data(), got.row_max.data(), got.row_sum.data(),
                          &pool);
        attention_backward(ps, q.data(), k.data(), v.data(), whole.out.data(), whole.row_max.data(),
                           whole.row_sum.data(), dout.data(), got.dq.data(), got.dk.data(), got.dv.data(), &pool);
        CHECK(testing::wrong_part_output(got, whole, c.T, qw, kw, part) == "");
      }
      AttentionShape bad = s;
      bad.q_begin = 2, bad.q_end = c.T + 1;
      CHECK_THROWS_AS(attention_forward(bad, q.data(), k.data(), v.data(), whole.out.data(), whole.row_max.data(),
                                        whole.row_sum.data(), &pool),
                      std::invalid_argument);
      bad = s;
      bad.k_begin = 5, bad.k_end = 4;
      CHECK_THROWS_AS(attention_backward(bad, q.data(), k.data(), v.data(), whole.out.data(), whole.row_max.data(),
                                         whole.row_sum.data(), dout.data(), whole.dq.data(), whole.dk.data(),
                                         whole.dv.data(), &pool),
                      std::invalid_argument);
    }
  }
}

TEST_CASE("SIMD RMSNorm, SwiGLU and the cross-entropy row are bit-identical to the scalar definition") {
  IsaGuard guard;
  ThreadPool pool(2);
  for (GemmIsa isa : simd_isas()) {
    CAPTURE(gemm_isa_name(isa));
    for (int64_t n : {1, 7, 16, 31, 32, 33, 100, 128, 257, 512}) {
      CAPTURE(n);
      const int64_t R = 37;
      const std::vector<float> x = normals(R * n, 11), w = normals(n, 12), dy = normals(R * n, 13);
      auto norm = [&](GemmIsa path) {
        set_gemm_isa(path);
        std::vector<float> y(R * n), ir(R), dx(R * n), dw(n);
        rmsnorm_forward(x.data(), w.data(), y.data(), ir.data(), R, n, 1e-6f, &pool);
        rmsnorm_backward(x.data(), w.data(), ir.data(), dy.data(), dx.data(), dw.data(), R, n, &pool);
        y.insert(y.end(), ir.begin(), ir.end());
        y.insert(y.end(), dx.begin(), dx.end());
        y.insert(y.end(), dw.begin(), dw.end());
        return y;
      };
      CHECK(first_diff(norm(isa), norm(GemmIsa::scalar)) == -1);
    }
    for (int64_t n : {1, 15, 4096, 10007}) {
      CAPTURE(n);
      std::vector<float> g = normals(n, 21, 4.0f), u = normals(n, 22), da = normals(n, 23);
      g[0] = -100.0f;  // expf underflow
      if (n > 1) g[1] = std::numeric_limits<float>::quiet_NaN();
      auto glu = [&](GemmIsa path) {
        set_gemm_isa(path);
        std::vector<float> a(n), dg(n), du(n);
        swiglu_forward(g.data(), u.data(), a.data(), n, &pool);
        swiglu_backward(g.data(), u.data(), da.data(), dg.data(), du.data(), n, &pool);
        a.insert(a.end(), dg.begin(), dg.end());
        a.insert(a.end(), du.begin(), du.end());
        return a;
      };
      CHECK(first_diff(glu(isa), glu(GemmIsa::scalar), true) == -1);
    }
    for (int64_t V : {1, 33, 2048, 5003}) {
      CAPTURE(V);
      const int64_t B = 2, T = 9;
      std::vector<float> logits = normals(B * T * V, 31, 3.0f);
      std::vector<uint32_t> tokens(B * T);
      for (int64_t i = 0; i < B * T; ++i) tokens[i] = static_cast<uint32_t>((i * 7919) % V);
      if (V > 2) logits[V + 1] = -INFINITY;
      auto ce = [&](GemmIsa path) {
        set_gemm_isa(path);
        std::vector<float> x = logits;
        const LossSums sums = cross_entropy_forward_backward(x.data(), tokens.data(), B, T, V, 1e-4f, B * (T - 1), &pool);
        x.push_back(static_cast<float>(sums.ce));
        x.push_back(static_cast<float>(sums.z));
        return std::make_pair(x, std::make_pair(sums.ce, sums.z));
      };
      const auto a = ce(isa), b = ce(GemmIsa::scalar);
      CHECK(first_diff(a.first, b.first) == -1);
      CHECK(std::memcmp(&a.second, &b.second, sizeof(a.second)) == 0);
    }
  }
}
