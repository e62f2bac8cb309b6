// tests/kernels/real_shape_cases.h — the exact kernels at the shapes of a real step, bit for bit against ref/: the
// GEMM at 2048x8192x2048, the LM head's weight gradient at V 100352, attention at T 2048 (window 1024) and T 8192
// (full causal), cross-entropy at V 100352. The awkward small cases (gemm_cases.h, attention_cases.h) cannot show
// what only a real shape reaches: K = 2048 chains, 1568 block rows, 8192-key rows, 100352-entry softmax rows.
//
// One set of cases, two executions (RealShapeExecutor):
//   - the device (tests/gpu/test_gpu_kernels.cpp, family real_shapes): the whole shape, every output compared;
//   - the kernels' decompositions on the host (tests/kernels/test_real_shapes.cpp, in CI and in the dry run of
//     tools/gpu_check.sh): host execution runs thread by thread, so it takes a sample of each shape — GEMM tiles
//     (the corners and an interior one), attention query tiles of 32 rows (the first, around the window's edge, the
//     middle, the last two) and the last 64 keys' dk/dv (their queries' D computed by the same rows), every
//     cross-entropy row.
// Each case compares every computed output bit for bit and names the first differing index.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/mathfn.h"
#include "core/parallel.h"
#include "kernels/attention_exact.h"
#include "kernels/gemm_exact.h"
#include "kernels/loss_exact.h"
#include "ref/gemm.h"
#include "ref/ops.h"
#include "tests/kernels/attention_cases.h"
#include "tests/kernels/gemm_cases.h"

namespace olmoref::testing {

// Spans [begin, end) of a flat output that an execution computed: the whole tensor on the device, the sample on the host.
using Spans = std::vector<std::pair<int64_t, int64_t>>;

// A float buffer left uninitialised: the LM head's 822 MB output is touched only where a sample writes it.
struct RawFloats {
  std::unique_ptr<float[]> data;
  int64_t n = 0;
  explicit RawFloats(int64_t count) : data(new float[static_cast<size_t>(count)]), n(count) {}
  float* get() const { return data.get(); }
};

// Operand i of stream `seed`: a counter hash, so 205 M values fill in parallel in a fraction of a second and the same
// on every machine. 1 in 16 is a signed zero; the rest are ±[0.5, 1)·2^e, e over `binades` binades below 0, times scale.
inline float real_shape_value(uint64_t seed, uint64_t i, int binades, float scale) {
  uint64_t z = (seed << 40) + i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const uint32_t sign = static_cast<uint32_t>((z >> 4) & 1) << 31;
  if ((z & 15) == 0) return det::from_bits(sign);
  // Built from its bits (exponent 126 - e: [0.5, 1)·2^-e): ldexp made filling 205 M values take seconds.
  const uint32_t binade = static_cast<uint32_t>((z >> 8) % static_cast<uint64_t>(binades));
  return scale * det::from_bits(sign | ((126u - binade) << 23) | static_cast<uint32_t>((z >> 40) & 0x7fffff));
}
inline std::vector<float> real_shape_operand(int64_t n, uint64_t seed, int binades, float scale, ThreadPool* pool) {
  std::vector<float> v(static_cast<size_t>(n));
  pool->parallel_for(n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) v[static_cast<size_t>(i)] = real_shape_value(seed, static_cast<uint64_t>(i), binades, scale);
  });
  return v;
}

// "" when got and want have the same bits at every index of the spans, else the first index that differs.
inline std::string first_difference(const float* got, const float* want, const Spans& spans) {
  for (const auto& [lo, hi] : spans)
    for (int64_t i = lo; i < hi; ++i)
      if (det::bits(got[i]) != det::bits(want[i])) {
        char line[160];
        std::snprintf(line, sizeof line, "first difference at index %" PRId64 ": got %08x, want %08x", i,
                      det::bits(got[i]), det::bits(want[i]));
        return line;
      }
  return "";
}
inline std::string first_difference(const double* got, const double* want, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(got + i, want + i, sizeof(double)) != 0) {
      char line[160];
      std::snprintf(line, sizeof line, "first difference at index %" PRId64 ": got %a, want %a", i, got[i], want[i]);
      return line;
    }
  return "";
}
inline int64_t span_count(const Spans& spans) {
  int64_t n = 0;
  for (const auto& [lo, hi] : spans) n += hi - lo;
  return n;
}

// Query rows (b·H + h)·T + i and keys (b·H + h)·T + j that a sampled execution computes (B = 1).
struct AttentionSample {
  std::vector<int64_t> rows, keys;
};

// The tiles (b·H + h)·ceil(T/32) + i/32 that hold positions (b·H + h)·T + i, ascending.
inline std::vector<int64_t> attention_sample_tiles(const kernels::AttentionArgs& a, const std::vector<int64_t>& positions) {
  const int64_t per = (a.T + kernels::kAttTile - 1) / kernels::kAttTile;
  std::set<int64_t> tiles;
  for (const int64_t p : positions) tiles.insert(p / a.T * per + p % a.T / kernels::kAttTile);
  return {tiles.begin(), tiles.end()};
}

// How the kernels run. Arguments hold host pointers; `sampled` executions compute only the sample they are given.
struct RealShapeExecutor {
  bool sampled = false;
  std::function<void(const kernels::GemmArgs&, const std::vector<std::pair<int64_t, int64_t>>& tiles, kernels::GemmTiling)>
      gemm;
  std::function<void(const kernels::AttentionArgs&, const AttentionSample&)> attention_forward, attention_backward;
  std::function<void(const kernels::LossArgs&)> cross_entropy;
};

// The kernels' decompositions on the host, over the sample only (each row, key and tile is computed whole by one
// block on the device too, so a sample has the bits the whole grid would).
inline RealShapeExecutor host_real_shape_executor() {
  RealShapeExecutor ex;
  ex.sampled = true;
  ex.gemm = [](const kernels::GemmArgs& g, const std::vector<std::pair<int64_t, int64_t>>& tiles,
               kernels::GemmTiling tiling) { kernels::gemm_exact_host_tiles(g, tiles, tiling); };
  // A tile of 32 positions is computed whole by one block, so the sample's rows and keys run as the tiles that hold
  // them.
  ex.attention_forward = [](const kernels::AttentionArgs& a, const AttentionSample& s) {
    auto sh = std::make_unique<kernels::AttentionForwardShared>();
    kernels::HostBlock<kernels::AttentionForwardRegs, kernels::kAttThreads> blk(*sh);
    std::vector<float> scratch(static_cast<size_t>(kernels::kAttTile * a.T));
    for (const int64_t tile : attention_sample_tiles(a, s.rows)) kernels::attention_forward_tile(blk, *sh, a, tile, scratch.data());
  };
  ex.attention_backward = [](const kernels::AttentionArgs& a, const AttentionSample& s) {
    auto sh = std::make_unique<kernels::AttentionBackwardShared>();
    kernels::HostBlock<kernels::AttentionBackwardRegs, kernels::kAttThreads> blk(*sh);
    for (const int64_t tile : attention_sample_tiles(a, s.rows)) kernels::attention_backward_query_tile(blk, *sh, a, tile);
    std::set<int64_t> positions;
    for (const int64_t tile : attention_sample_tiles(a, s.keys)) kernels::attention_backward_key_tile(blk, *sh, a, tile);
    for (const int64_t key : s.keys) positions.insert(key / (a.H * a.T) * a.T + key % a.T);
    const int64_t kw = a.KV * a.hd;
    for (const int64_t r : positions)
      for (int64_t e = r * kw; e < (r + 1) * kw; ++e) kernels::attention_group_sum(a, e);
  };
  ex.cross_entropy = [](const kernels::LossArgs& a) { kernels::cross_entropy_host(a); };
  return ex;
}

// ---- GEMM ----------------------------------------------------------------------------------------------------

struct RealGemmCase {
  const char* name;
  GemmCase shape;  // layouts of gemm_cases.h
};
inline std::vector<RealGemmCase> real_gemm_cases() {
  return {{"gemm 2048x8192x2048 (forward X·Wᵀ)", {2048, 8192, 2048, 0, false}},
          // d = 2048 (olmo3-1b's width), T = 2048 rows: dW [V, d] = dYᵀ [V, T] · X [T, d], dY the logits' gradient.
          {"lm_head dW [100352, 2048] = dYᵀ·X over T 2048", {100352, 2048, 2048, 2, false}}};
}
// The sampled blocks of the tiling's grid: the four corners and an interior one.
inline std::vector<std::pair<int64_t, int64_t>> real_gemm_tiles(int64_t M, int64_t N, kernels::GemmTiling tiling) {
  const int64_t rows = kernels::gemm_grid_rows(M, tiling), cols = kernels::gemm_grid_cols(N, tiling);
  std::set<std::pair<int64_t, int64_t>> tiles{{0, 0}, {0, cols - 1}, {rows - 1, 0}, {rows - 1, cols - 1}, {rows / 2, cols / 2 + 1 < cols ? cols / 2 + 1 : cols - 1}};
  return {tiles.begin(), tiles.end()};
}

// Each case in both tilings (GemmTile128 is what a device picks at these shapes; GemmTile64 holds the same chains).
inline int check_real_gemm(const RealShapeExecutor& ex, ThreadPool* pool) {
  int failed = 0;
  uint64_t seed = 1;
  for (const RealGemmCase& c : real_gemm_cases()) {
    const GemmCase& s = c.shape;
    const std::vector<float> a = real_shape_operand(s.M * s.K, seed++, 12, 1.0f, pool);
    const std::vector<float> b = real_shape_operand(s.K * s.N, seed++, 12, 1.0f, pool);
    RawFloats want(s.M * s.N);
    const kernels::GemmArgs shape = gemm_args(s, a.data(), b.data(), nullptr);
    if (!ex.sampled)
      gemm(s.M, s.N, s.K, MatView{shape.A, shape.a_row, shape.a_col}, MatView{shape.B, shape.b_row, shape.b_col},
           want.get(), shape.ldc, false, pool);
    for (const kernels::GemmTiling tiling : {kernels::GemmTiling::tile128, kernels::GemmTiling::tile64}) {
      RawFloats got(s.M * s.N);
      kernels::GemmArgs g = shape;
      g.C = got.get();
      std::vector<std::pair<int64_t, int64_t>> tiles;
      Spans spans;
      if (ex.sampled) {
        const int64_t edge = kernels::gemm_tile_rows(tiling);
        tiles = real_gemm_tiles(s.M, s.N, tiling);
        for (const auto& [bi, bj] : tiles) {
          const int64_t r0 = bi * edge, r1 = std::min(s.M, r0 + edge);
          const int64_t c0 = bj * edge, c1 = std::min(s.N, c0 + edge);
          // Every output is one chain over k, so the product of the tile's rows and columns alone has its bits.
          gemm(r1 - r0, c1 - c0, s.K, MatView{g.A + r0 * g.a_row, g.a_row, g.a_col},
               MatView{g.B + c0 * g.b_col, g.b_row, g.b_col}, want.get() + r0 * g.ldc + c0, g.ldc, false, pool);
          for (int64_t r = r0; r < r1; ++r) spans.emplace_back(r * g.ldc + c0, r * g.ldc + c1);
        }
      } else {
        spans.emplace_back(0, s.M * s.N);
      }
      ex.gemm(g, tiles, tiling);
      const std::string diff = first_difference(got.get(), want.get(), spans);
      std::printf("real shape %s, %s: %s (%" PRId64 " outputs%s)\n", c.name, kernels::gemm_tiling_name(tiling),
                  diff.empty() ? "bitwise equal" : ("DIFFERS, " + diff).c_str(), span_count(spans),
                  ex.sampled ? (", " + std::to_string(tiles.size()) + " sampled tiles").c_str() : "");
      failed += !diff.empty();
    }
  }
  return failed;
}

// ---- attention -----------------------------------------------------------------------------------------------

struct RealAttentionCase {
  const char* name;
  AttentionCase shape;
};
// The window case has two query heads on one KV head, so the group sum of dk/dv adds two; the full case one head: the
// CPU reference of its backward at T 8192 is most of this file's time on a 2-core machine.
inline std::vector<RealAttentionCase> real_attention_cases() {
  return {{"attention T 2048 hd 128 window 1024 (2 query heads, 1 KV head)", {1, 2048, 2, 1, 128, 1024, false}},
          {"attention T 8192 hd 128 full causal (1 head)", {1, 8192, 1, 1, 128, 0, false}}};
}
inline constexpr int64_t kRealAttentionTail = 64;  // the last keys (and queries) a sample takes whole: two tiles
inline AttentionSample real_attention_sample(const AttentionCase& c) {
  std::set<int64_t> positions{0, 1, 31, 32, 33, c.T / 2 + 7};
  if (c.window > 0) positions.insert({c.window - 1, c.window, c.window + 1});
  for (int64_t i = c.T - kRealAttentionTail; i < c.T; ++i) positions.insert(i);
  // Whole tiles of 32 positions: a block computes a tile whole, so the sample checks every row it computed.
  std::set<int64_t> tiled;
  for (const int64_t i : positions)
    for (int64_t t = i / kernels::kAttTile * kernels::kAttTile; t < std::min(c.T, (i / kernels::kAttTile + 1) * kernels::kAttTile); ++t)
      tiled.insert(t);
  AttentionSample s;
  for (int64_t h = 0; h < c.H; ++h) {
    for (const int64_t i : tiled) s.rows.push_back(h * c.T + i);
    // The last keys' queries are all in the tail's tiles, so the sample's rows hold every D they read.
    for (int64_t j = c.T - kRealAttentionTail; j < c.T; ++j) s.keys.push_back(h * c.T + j);
  }
  return s;
}

inline int check_real_attention(const RealShapeExecutor& ex, ThreadPool* pool) {
  int failed = 0;
  uint64_t seed = 11;
  for (const RealAttentionCase& rc : real_attention_cases()) {
    const AttentionCase& c = rc.shape;
    const int64_t qn = c.T * c.H * c.hd, kn = c.T * c.KV * c.hd, stats = c.H * c.T, qw = c.H * c.hd, kw = c.KV * c.hd;
    const std::vector<float> q = real_shape_operand(qn, seed++, 3, 1.0f, pool), k = real_shape_operand(kn, seed++, 3, 1.0f, pool);
    const std::vector<float> v = real_shape_operand(kn, seed++, 3, 1.0f, pool), dout = real_shape_operand(qn, seed++, 3, 1.0f, pool);
    const AttentionShape shape = attention_shape(c);
    std::vector<float> out_ref(qn), m_ref(stats), l_ref(stats), dq_ref(qn), dk_ref(kn), dv_ref(kn);
    attention_forward(shape, q.data(), k.data(), v.data(), out_ref.data(), m_ref.data(), l_ref.data(), pool);
    attention_backward(shape, q.data(), k.data(), v.data(), out_ref.data(), m_ref.data(), l_ref.data(), dout.data(),
                       dq_ref.data(), dk_ref.data(), dv_ref.data(), pool);
    const AttentionSample sample = real_attention_sample(c);
    Spans rows_q, rows_stats, rows_kv;
    if (ex.sampled) {
      for (const int64_t row : sample.rows) {
        const int64_t h = row / c.T, i = row % c.T;
        rows_q.emplace_back(i * qw + h * c.hd, i * qw + (h + 1) * c.hd);
        rows_stats.emplace_back(row, row + 1);
      }
      for (int64_t j = c.T - kRealAttentionTail; j < c.T; ++j) rows_kv.emplace_back(j * kw, (j + 1) * kw);
    } else {
      rows_q = {{0, qn}}, rows_stats = {{0, stats}}, rows_kv = {{0, kn}};
    }
    std::vector<float> out(qn), m(stats), l(stats), dq(qn), dk(kn), dv(kn), row_d(stats), dk_head(stats * c.hd),
        dv_head(stats * c.hd);
    kernels::AttentionArgs a = attention_args(c);
    a.q = q.data(), a.k = k.data(), a.v = v.data(), a.out = out.data(), a.row_max = m.data(), a.row_sum = l.data();
    ex.attention_forward(a, sample);
    std::string diff = first_difference(out.data(), out_ref.data(), rows_q);
    if (diff.empty()) diff = first_difference(m.data(), m_ref.data(), rows_stats);
    if (diff.empty()) diff = first_difference(l.data(), l_ref.data(), rows_stats);
    std::printf("real shape %s forward: %s (%" PRId64 " query rows)\n", rc.name,
                diff.empty() ? "bitwise equal" : ("DIFFERS in out/m/l, " + diff).c_str(), span_count(rows_stats));
    failed += !diff.empty();
    // The backward from the reference's forward, as the step gives it the saved out, m and l.
    a.out = out_ref.data(), a.row_max = m_ref.data(), a.row_sum = l_ref.data(), a.dout = dout.data();
    a.dq = dq.data(), a.dk = dk.data(), a.dv = dv.data(), a.row_d = row_d.data(), a.dk_head = dk_head.data(),
    a.dv_head = dv_head.data();
    ex.attention_backward(a, sample);
    diff = first_difference(dq.data(), dq_ref.data(), rows_q);
    if (diff.empty()) diff = first_difference(dk.data(), dk_ref.data(), rows_kv);
    if (diff.empty()) diff = first_difference(dv.data(), dv_ref.data(), rows_kv);
    std::printf("real shape %s backward: %s (dq of %" PRId64 " query rows, dk/dv of %" PRId64 " key positions)\n", rc.name,
                diff.empty() ? "bitwise equal" : ("DIFFERS in dq/dk/dv, " + diff).c_str(), span_count(rows_stats),
                span_count(rows_kv) / kw);
    failed += !diff.empty();
  }
  return failed;
}

// ---- cross-entropy -------------------------------------------------------------------------------------------

// Two instances of 8 rows at the Olmo 3 vocabulary: targets at the first and last entries, a row whose largest logit
// is its target, and every row's last position (no target) in each instance.
inline int check_real_cross_entropy(const RealShapeExecutor& ex, ThreadPool* pool) {
  const int64_t B = 2, T = 8, V = 100352, R = B * T, N = B * (T - 1);
  const float z_coef = 1e-5f;
  const std::vector<float> logits = real_shape_operand(R * V, 31, 4, 8.0f, pool);
  std::vector<uint32_t> tokens(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) tokens[static_cast<size_t>(r)] = static_cast<uint32_t>((r * 7919 + 13) % V);
  tokens[1] = 0, tokens[2] = static_cast<uint32_t>(V - 1);
  std::vector<float> want = logits, got = logits;
  want[3 * V + tokens[4]] = got[3 * V + tokens[4]] = 50.0f;  // row 3 predicts its target with near certainty
  std::vector<double> ce_ref, z_ref;
  for (int64_t b = 0; b < B; ++b) {
    const LossSums s = cross_entropy_forward_backward(want.data() + b * T * V, tokens.data() + b * T, 1, T, V, z_coef, N, pool);
    ce_ref.push_back(s.ce), z_ref.push_back(s.z);
  }
  std::vector<double> ce_terms(R), z_terms(R), ce(B), z(B);
  kernels::LossArgs a;
  a.R = R, a.T = T, a.V = V, a.logits = got.data(), a.tokens = tokens.data(), a.z_coef = z_coef, a.global_n_targets = N;
  a.ce_terms = ce_terms.data(), a.z_terms = z_terms.data(), a.ce_total = ce.data(), a.z_total = z.data();
  ex.cross_entropy(a);
  std::string diff = first_difference(got.data(), want.data(), Spans{{0, R * V}});
  if (diff.empty()) diff = first_difference(ce.data(), ce_ref.data(), B);
  if (diff.empty()) diff = first_difference(z.data(), z_ref.data(), B);
  std::printf("real shape cross-entropy V 100352, %" PRId64 " rows: %s\n", R,
              diff.empty() ? "bitwise equal (gradient and per-instance totals)" : ("DIFFERS, " + diff).c_str());
  return !diff.empty();
}

inline int check_real_shapes(const RealShapeExecutor& ex, ThreadPool* pool) {
  return check_real_gemm(ex, pool) + check_real_attention(ex, pool) + check_real_cross_entropy(ex, pool);
}

}  // namespace olmoref::testing
