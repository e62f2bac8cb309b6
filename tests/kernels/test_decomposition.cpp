// The CUDA kernels' decompositions (kernels/*.h), executed on the host exactly as the device runs them (the
// same OLMOREF_HD code, thread by thread between barriers), equal ref/ bit for bit on awkward shapes; a
// negative control shows the comparison can fail.
#include <doctest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/attention_exact.h"
#include "kernels/executor.h"
#include "kernels/gemm_exact.h"
#include "kernels/loss_exact.h"
#include "kernels/rmsnorm_exact.h"
#include "ref/cpu_executor.h"
#include "ref/gemm.h"
#include "ref/ops.h"
#include "core/optim.h"
#include "tests/kernels/loss_cases.h"
#include "tests/common/attention_parts.h"
#include "tests/kernels/attention_cases.h"
#include "tests/kernels/case_loops.h"
#include "tests/kernels/gemm_cases.h"
#include "tests/kernels/host_order.h"
#include "tests/kernels/norm_cases.h"

using namespace olmoref;
using olmoref::testing::GemmCase;

namespace {

std::vector<float> reference(const GemmCase& c, const testing::GemmOperands& o) {
  std::vector<float> out = o.c;
  const kernels::GemmArgs g = testing::gemm_args(c, o.a.data(), o.b.data(), out.data());
  gemm_reference(g.M, g.N, g.K, MatView{g.A, g.a_row, g.a_col}, MatView{g.B, g.b_row, g.b_col}, out.data(), g.ldc,
                 g.accumulate);
  return out;
}

}  // namespace

TEST_CASE("gemm exact: the kernel's tiles, slabs and per-thread chains equal the reference bit for bit") {
  int cases = 0;
  for (const GemmCase& c : testing::gemm_cases()) {
    CAPTURE(c.M);
    CAPTURE(c.N);
    CAPTURE(c.K);
    CAPTURE(c.layout);
    CAPTURE(c.accumulate);
    const testing::GemmOperands o = testing::gemm_operands(c, static_cast<uint32_t>(17 + cases));
    const std::vector<float> want = reference(c, o);
    for (const kernels::GemmTiling tiling : {kernels::GemmTiling::tile128, kernels::GemmTiling::tile64}) {
      CAPTURE(kernels::gemm_tiling_name(tiling));
      std::vector<float> got = o.c;
      kernels::gemm_exact_host(testing::gemm_args(c, o.a.data(), o.b.data(), got.data()), tiling);
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    }
    ++cases;
  }
  CHECK(cases == 78);
}

TEST_CASE("gemm exact: the tiling a device picks, and the one the host execution takes") {
  using kernels::GemmTiling;
  // 132 SMs hold 264 blocks of GemmTile128: fewer blocks than that take GemmTile64.
  CHECK(kernels::gemm_pick_tiling(512, 512, 132) == GemmTiling::tile64);      // 16 blocks (olmo3-100m's d x d dW)
  CHECK(kernels::gemm_pick_tiling(4096, 512, 132) == GemmTiling::tile64);     // 32 x 4 = 128 (olmo3-100m's q forward)
  CHECK(kernels::gemm_pick_tiling(4096, 2048, 132) == GemmTiling::tile128);   // 32 x 16 = 512 >= 264
  CHECK(kernels::gemm_pick_tiling(2048, 2048, 132) == GemmTiling::tile64);    // 256 < 264
  CHECK(kernels::gemm_pick_tiling(2048, 2049, 132) == GemmTiling::tile128);   // 16 x 17 = 272
  CHECK(kernels::gemm_pick_tiling(2048, 2048, 128) == GemmTiling::tile128);   // 256 = 2 x 128
  CHECK(kernels::gemm_pick_tiling(1, 1, 1) == GemmTiling::tile64);
  CHECK(kernels::gemm_pick_tiling(128, 128, 0) == GemmTiling::tile128);
  CHECK(kernels::gemm_grid_rows(129, GemmTiling::tile64) == 3);
  CHECK(kernels::gemm_grid_cols(129, GemmTiling::tile128) == 2);
  // The host execution's own call (it takes the pick of a 132-SM device, GemmTile64 here) has the bits of each
  // explicit tiling; an out-of-grid block names the tiling.
  const GemmCase c{300, 140, 20, 0, true};
  const testing::GemmOperands o = testing::gemm_operands(c, 3);
  std::vector<float> picked = o.c;
  kernels::gemm_exact_host(testing::gemm_args(c, o.a.data(), o.b.data(), picked.data()));
  for (const GemmTiling tiling : {GemmTiling::tile128, GemmTiling::tile64}) {
    std::vector<float> tiled = o.c;
    kernels::gemm_exact_host(testing::gemm_args(c, o.a.data(), o.b.data(), tiled.data()), tiling);
    CHECK(std::memcmp(picked.data(), tiled.data(), picked.size() * sizeof(float)) == 0);
  }
  CHECK_THROWS_WITH_AS(kernels::gemm_exact_host_tiles(testing::gemm_args(c, o.a.data(), o.b.data(), picked.data()),
                                                      {{5, 0}}, GemmTiling::tile64),
                       "gemm_exact_host_tiles: block (5, 0) is outside the tile64 grid of 5 x 3 blocks",
                       std::out_of_range);
}

// The SwiGLU epilogues (gemm_store) in both tiles: the cuda-host executor's fused ops, which tests/ref/test_epilogue.cpp
// holds to the CPU's unfused sequence, run their small shapes in GemmTile64 (the 132-SM pick), so GemmTile128's
// epilogue is held to GemmTile64's here, every output (C and the epilogue's) bit for bit.
TEST_CASE("gemm exact: the SwiGLU epilogues store the same bits from either tile") {
  using kernels::GemmTiling;
  int cases = 0;
  for (const auto& [M, N, K] : {std::array<int64_t, 3>{1, 1, 1}, {7, 37, 5}, {70, 33, 130}, {130, 260, 64}}) {
    for (const auto kind : {kernels::GemmEpilogueKind::swiglu_forward, kernels::GemmEpilogueKind::swiglu_backward})
      for (const bool bf16 : {false, true}) {
        CAPTURE(M);
        CAPTURE(N);
        CAPTURE(K);
        CAPTURE(static_cast<int>(kind));
        CAPTURE(bf16);
        const GemmCase c{M, N, K, kind == kernels::GemmEpilogueKind::swiglu_forward ? 0 : 1, false};
        const testing::GemmOperands o = testing::gemm_operands(c, static_cast<uint32_t>(91 + cases));
        // The gate g and (backward) u, [M, N] at C's positions, with SiLU's edges among them.
        std::vector<float> gate = testing::gemm_operands(c, static_cast<uint32_t>(191 + cases)).c;
        const std::vector<float> up = testing::gemm_operands(c, static_cast<uint32_t>(291 + cases)).c;
        for (size_t i = 0; i < gate.size(); i += 7) gate[i] = i % 2 ? std::numeric_limits<float>::infinity() : -88.0f;
        std::vector<float> out[2][2];  // [tiling][C, epilogue output]
        for (int t = 0; t < 2; ++t) {
          out[t][0].assign(o.c.size(), 0.0f), out[t][1].assign(o.c.size(), 0.0f);
          kernels::GemmArgs g = testing::gemm_args(c, o.a.data(), o.b.data(), out[t][0].data());
          g.epilogue = kind, g.epi_g = gate.data(), g.epi_u = up.data(), g.epi_out = out[t][1].data(), g.epi_bf16 = bf16;
          kernels::gemm_exact_host(g, t == 0 ? GemmTiling::tile128 : GemmTiling::tile64);
        }
        CHECK(std::memcmp(out[0][0].data(), out[1][0].data(), o.c.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(out[0][1].data(), out[1][1].data(), o.c.size() * sizeof(float)) == 0);
        ++cases;
      }
  }
  CHECK(cases == 16);
}

TEST_CASE("gemm exact negative control: split-K slabs added afterwards give other bits") {
  const GemmCase c{65, 63, 100, 0, false};
  const testing::GemmOperands o = testing::gemm_operands(c, 5);
  const std::vector<float> want = reference(c, o);
  std::vector<float> got = o.c;
  kernels::GemmArgs g = testing::gemm_args(c, o.a.data(), o.b.data(), got.data());
  g.debug_split_k = true;
  kernels::gemm_exact_host(g);
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0);
}

TEST_CASE("rmsnorm exact: one warp per row (32 lanes + tree) and a chain per column equal ref/ bit for bit") {
  for (const testing::NormCase& c : testing::norm_cases()) {
    CAPTURE(c.R);
    CAPTURE(c.n);
    const testing::NormOperands o = testing::norm_operands(c, static_cast<uint32_t>(c.R * 1000 + c.n));
    const size_t rn = static_cast<size_t>(c.R * c.n), R = static_cast<size_t>(c.R), n = static_cast<size_t>(c.n);
    std::vector<float> y_ref(rn), ir_ref(R), dx_ref(rn), dw_ref(n);
    rmsnorm_forward(o.x.data(), o.w.data(), y_ref.data(), ir_ref.data(), c.R, c.n, 1e-6f, nullptr);
    rmsnorm_backward(o.x.data(), o.w.data(), ir_ref.data(), o.dy.data(), dx_ref.data(), dw_ref.data(), c.R, c.n, nullptr);
    std::vector<float> y(rn), ir(R), dx(rn), dw(n);
    const kernels::RmsNormArgs a =
        testing::norm_args(c, o.x.data(), o.w.data(), y.data(), ir.data(), o.dy.data(), dx.data(), dw.data());
    kernels::rmsnorm_forward_host(a);
    kernels::rmsnorm_backward_host(a);
    CHECK(std::memcmp(y.data(), y_ref.data(), rn * sizeof(float)) == 0);
    CHECK(std::memcmp(ir.data(), ir_ref.data(), R * sizeof(float)) == 0);
    CHECK(std::memcmp(dx.data(), dx_ref.data(), rn * sizeof(float)) == 0);
    CHECK(std::memcmp(dw.data(), dw_ref.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("rmsnorm exact negative control: a sequential row sum instead of 32 lanes gives other bits") {
  // What a naive kernel (one thread per row) computes; the host execution must not agree with it by accident.
  const testing::NormCase c{4, 257};
  const testing::NormOperands o = testing::norm_operands(c, 3);
  std::vector<float> y(static_cast<size_t>(c.R * c.n)), ir(static_cast<size_t>(c.R));
  const kernels::RmsNormArgs a = testing::norm_args(c, o.x.data(), o.w.data(), y.data(), ir.data());
  kernels::rmsnorm_forward_host(a);
  int differ = 0;
  for (int64_t r = 0; r < c.R; ++r) {
    float acc = 0.0f;
    for (int64_t k = 0; k < c.n; ++k) acc = std::fma(o.x[r * c.n + k], o.x[r * c.n + k], acc);
    const float naive = 1.0f / std::sqrt(acc * (1.0f / static_cast<float>(c.n)) + 1e-6f);
    differ += std::memcmp(&naive, &ir[static_cast<size_t>(r)], 4) != 0;
  }
  CHECK(differ > 0);
}

TEST_CASE("rmsnorm exact, fused forms (residual; RoPE by pairs, both ways) equal ref/'s unfused sequences") {
  CpuExecutor cpu;
  kernels::KernelExecutor host(false);  // rmsnorm_forward_host: the kernel's phases thread by thread
  int cases = 0;
  for (bool bf16 : {false, true}) {
    CAPTURE(bf16);
    testing::for_each_fused_norm_case(bf16, [&](const testing::NormCase& c, const testing::NormOperands& o) {
      CHECK(testing::same_bits(testing::run_residual_norm(host, true, bf16, c.R, c.n, o),
                               testing::run_residual_norm(cpu, false, bf16, c.R, c.n, o)));
      ++cases;
    });
    testing::for_each_fused_rope_norm_case(bf16, [&](const testing::RopeNormCase& c, const testing::NormOperands& o) {
      CHECK(testing::same_bits(testing::run_rope_norm(host, true, bf16, c, o),
                               testing::run_rope_norm(cpu, false, bf16, c, o)));
      CHECK(testing::same_bits(testing::run_rope_norm_backward(host, true, bf16, c, o),
                               testing::run_rope_norm_backward(cpu, false, bf16, c, o)));
      ++cases;
    });
  }
  CHECK(cases == 2 * (9 + 9));
}

TEST_CASE("cross-entropy exact: one warp per row, per-instance fp64 totals, equal to ref/ bit for bit") {
  for (const testing::LossCase& c : testing::loss_cases()) {
    CAPTURE(c.B);
    CAPTURE(c.T);
    CAPTURE(c.V);
    const testing::LossOperands o = testing::loss_operands(c, static_cast<uint32_t>(c.T * 100 + c.V));
    const int64_t N = 3 * c.B * (c.T - 1);  // a global target count larger than this batch's, as in a step
    std::vector<float> ref_grad = o.logits, got = o.logits;
    std::vector<LossSums> ref_sums;
    for (int64_t b = 0; b < c.B; ++b)
      ref_sums.push_back(cross_entropy_forward_backward(ref_grad.data() + b * c.T * c.V, o.tokens.data() + b * c.T, 1,
                                                        c.T, c.V, 1e-5f, N, nullptr));
    std::vector<double> ce_terms(static_cast<size_t>(c.B * c.T)), z_terms(ce_terms.size());
    std::vector<double> ce(static_cast<size_t>(c.B)), z(ce.size());
    kernels::LossArgs a;
    a.R = c.B * c.T, a.T = c.T, a.V = c.V, a.logits = got.data(), a.tokens = o.tokens.data(), a.z_coef = 1e-5f;
    a.global_n_targets = N, a.ce_terms = ce_terms.data(), a.z_terms = z_terms.data(), a.ce_total = ce.data();
    a.z_total = z.data();
    kernels::cross_entropy_host(a);
    CHECK(std::memcmp(got.data(), ref_grad.data(), got.size() * sizeof(float)) == 0);
    for (int64_t b = 0; b < c.B; ++b) {
      CHECK(std::memcmp(&ce[static_cast<size_t>(b)], &ref_sums[static_cast<size_t>(b)].ce, 8) == 0);
      CHECK(std::memcmp(&z[static_cast<size_t>(b)], &ref_sums[static_cast<size_t>(b)].z, 8) == 0);
    }
  }
}

TEST_CASE("gradient-norm chunks exact: 32 fp64 lanes per chunk equal ref/ bit for bit") {
  for (const int64_t n : {int64_t{1}, int64_t{31}, int64_t{65536}, int64_t{65537}, int64_t{3 * 65536 + 1000}}) {
    CAPTURE(n);
    const std::vector<float> g = testing::norm_vector(n, static_cast<uint32_t>(n));
    const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
    std::vector<double> want(static_cast<size_t>(chunks)), got(want.size());
    grad_norm_chunks(g.data(), n, 0, chunks, want.data(), nullptr);
    kernels::NormChunkArgs a;
    a.grad = g.data(), a.n = n, a.chunk = kNormChunk, a.out = got.data();
    kernels::grad_norm_chunks_host(a);
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(double)) == 0);
  }
}

TEST_CASE("zero counts: 32 lanes per chunk and the lane tree equal ref/'s count") {
  for (const int64_t n : {int64_t{1}, int64_t{31}, int64_t{65536}, int64_t{65537}, int64_t{3 * 65536 + 1000}}) {
    CAPTURE(n);
    std::vector<float> g = testing::norm_vector(n, static_cast<uint32_t>(n) + 7);
    // Zeros at lane and chunk edges, a negative zero, and a NaN and a denormal that are not zeros.
    int64_t planted = 0;
    for (int64_t i = 0; i < n; i += 3) g[static_cast<size_t>(i)] = (i % 2) ? -0.0f : 0.0f, ++planted;
    if (n > 5) g[1] = std::numeric_limits<float>::quiet_NaN(), g[2] = std::numeric_limits<float>::denorm_min();
    const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
    std::vector<double> got(static_cast<size_t>(chunks));
    kernels::ZeroCountArgs a;
    a.x = g.data(), a.n = n, a.chunk = kNormChunk, a.out = got.data();
    kernels::zero_count_chunks_host(a);
    int64_t total = 0;
    for (double z : got) total += static_cast<int64_t>(z);
    CHECK(total == count_zeros(g.data(), n, nullptr));
    CHECK(total == planted);
  }
}

namespace {

// The forward's blocks (at most tile_blocks in flight, each striding over the query tiles with its own 32 scratch
// rows) against ref/ bit for bit; the scratch is exactly [attention_scratch_rows, T].
void check_attention_forward(const testing::AttentionCase& c, const testing::AttentionOperands& o,
                             int64_t tile_blocks = kernels::kAttentionTileBlocks) {
  const size_t out_n = static_cast<size_t>(c.B * c.T * c.H * c.hd), stats = static_cast<size_t>(c.B * c.H * c.T);
  std::vector<float> out_ref(out_n), m_ref(stats), l_ref(stats);
  attention_forward(testing::attention_shape(c, o), o.q.data(), o.k.data(), o.v.data(), out_ref.data(), m_ref.data(),
                    l_ref.data(), nullptr);
  std::vector<float> out(out_n), m(stats), l(stats);
  kernels::AttentionArgs a = testing::attention_args(c, o);
  a.tile_blocks = tile_blocks;
  std::vector<float> scratch(static_cast<size_t>(kernels::attention_scratch_rows(a) * c.T));
  a.q = o.q.data(), a.k = o.k.data(), a.v = o.v.data(), a.out = out.data(), a.row_max = m.data(), a.row_sum = l.data();
  a.scratch = scratch.data();
  kernels::attention_forward_host(a);
  CHECK(std::memcmp(out.data(), out_ref.data(), out_n * sizeof(float)) == 0);
  CHECK(std::memcmp(m.data(), m_ref.data(), stats * sizeof(float)) == 0);
  CHECK(std::memcmp(l.data(), l_ref.data(), stats * sizeof(float)) == 0);
}

// The backward's query tiles, key tiles recomputing P and dS, and group sums against ref/.
void check_attention_backward(const testing::AttentionCase& c, const testing::AttentionOperands& o,
                              int64_t tile_blocks = kernels::kAttentionTileBlocks) {
  const testing::AttentionOperands g = testing::attention_operands(c, static_cast<uint32_t>(c.T * 11 + 3));  // g.q: dO
  const size_t qn = static_cast<size_t>(c.B * c.T * c.H * c.hd), kn = static_cast<size_t>(c.B * c.T * c.KV * c.hd);
  const size_t stats = static_cast<size_t>(c.B * c.H * c.T);
  const AttentionShape shape = testing::attention_shape(c, o);
  std::vector<float> out(qn), m(stats), l(stats);
  attention_forward(shape, o.q.data(), o.k.data(), o.v.data(), out.data(), m.data(), l.data(), nullptr);
  std::vector<float> dq_ref(qn), dk_ref(kn), dv_ref(kn);
  attention_backward(shape, o.q.data(), o.k.data(), o.v.data(), out.data(), m.data(), l.data(), g.q.data(),
                     dq_ref.data(), dk_ref.data(), dv_ref.data(), nullptr);
  kernels::AttentionArgs a = testing::attention_args(c, o);
  a.tile_blocks = tile_blocks;  // the backward has no scratch: one block per tile
  std::vector<float> dq(qn), dk(kn), dv(kn);
  std::vector<float> row_d(stats), dkh(stats * static_cast<size_t>(c.hd)), dvh(dkh.size());
  a.q = o.q.data(), a.k = o.k.data(), a.v = o.v.data(), a.out = out.data(), a.row_max = m.data(), a.row_sum = l.data();
  a.row_d = row_d.data(), a.dout = g.q.data(), a.dq = dq.data(), a.dk = dk.data();
  a.dv = dv.data(), a.dk_head = dkh.data(), a.dv_head = dvh.data();
  kernels::attention_backward_host(a);
  CHECK(std::memcmp(dq.data(), dq_ref.data(), qn * sizeof(float)) == 0);
  CHECK(std::memcmp(dk.data(), dk_ref.data(), kn * sizeof(float)) == 0);
  CHECK(std::memcmp(dv.data(), dv_ref.data(), kn * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("attention forward exact: blocks striding over query tiles (score chains over staged K, first-occurrence "
          "max, 32-lane denominator across key tiles, P·V chains) equal ref/ bit for bit") {
  testing::for_each_attention_case([](const testing::AttentionCase& c, const testing::AttentionOperands& o) {
    check_attention_forward(c, o);
  });
}

TEST_CASE("attention backward exact: query tiles (P, dS, dq), key tiles (P and dS recomputed, dk, dv per head), "
          "group sums equal ref/") {
  testing::for_each_attention_case([](const testing::AttentionCase& c, const testing::AttentionOperands& o) {
    check_attention_backward(c, o);
  });
}

// Few blocks in flight, so each takes many tiles in turn through its scratch rows, and sequences past a thousand keys
// (chains over many key and query tiles; dealt to 64 blocks, the forward's snake turns twice and its last round is
// short).
TEST_CASE("attention exact: blocks taking many rows each and T = 1100 equal ref/ bit for bit") {
  testing::for_each_attention_case([](const testing::AttentionCase& c, const testing::AttentionOperands& o) {
    check_attention_forward(c, o, 3);
    check_attention_backward(c, o, 3);
  });
  testing::for_each_attention_case(
      [](const testing::AttentionCase& c, const testing::AttentionOperands& o) {
        CHECK(c.B * c.H * ((c.T + 31) / 32) > 2 * 64);
        CHECK(c.B * c.H * ((c.T + 31) / 32) % 64 != 0);
        check_attention_forward(c, o, 64);
        check_attention_forward(c, o);
        check_attention_backward(c, o);
      },
      testing::long_attention_cases());
}

// The order tiles are handed out in (kernels/attention_exact.h, attention_tile_by_rank and attention_forward_walk, the
// very loop the forward's blocks run): every
// tile exactly once, for the forward at any block count and for the backward's two kernels; and the work it gives
// each forward block, counted in key tiles read by the band functions the kernels use, is even where the old order
// (block k took tiles k, k + blocks, .. in place order) left the block with the longest bands 1.49x the mean.
namespace {
int64_t query_tile_work(const kernels::AttentionArgs& a, int64_t tile) {
  const kernels::AttentionTile at = kernels::attention_tile(a, tile);
  return (at.i0 + at.n - 1 - kernels::attention_band_lo(a, at.b, at.i0)) / kernels::kAttTile + 1;
}
// The most work of a forward block over the mean, blocks dealt as the kernel deals them or (in_place) as before.
double forward_imbalance(const kernels::AttentionArgs& a, int64_t blocks, bool in_place) {
  std::vector<int64_t> load(static_cast<size_t>(blocks), 0);
  int64_t total = 0;
  for (int64_t block = 0; block < blocks; ++block) {
    auto take = [&](int64_t tile) {
      load[static_cast<size_t>(block)] += query_tile_work(a, tile);
      total += query_tile_work(a, tile);
    };
    if (in_place)
      for (int64_t tile = block; tile < kernels::attention_tiles(a); tile += blocks) take(tile);
    else
      kernels::attention_forward_walk(a, block, blocks, take);
  }
  return static_cast<double>(*std::max_element(load.begin(), load.end())) / (static_cast<double>(total) / blocks);
}
}  // namespace

TEST_CASE("attention exact: tiles are handed out heaviest first, each once, and the forward's blocks get even work") {
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {1, 3, 100}, {2, 5, 1100}, {3, 2, 4096}};
  for (const auto& [B, H, T] : shapes) {
    kernels::AttentionArgs a;
    a.B = B, a.H = H, a.T = T;
    const int64_t tiles = kernels::attention_tiles(a);
    for (const bool queries : {true, false}) {
      std::vector<int> seen(static_cast<size_t>(tiles), 0);
      int64_t previous_row = queries ? T : -1;
      for (int64_t g = 0; g < tiles; ++g) {
        const int64_t tile = kernels::attention_tile_by_rank(a, g, queries);
        REQUIRE(tile >= 0);
        REQUIRE(tile < tiles);
        ++seen[static_cast<size_t>(tile)];
        const int64_t row = kernels::attention_tile(a, tile).i0;  // heaviest first: rows never move the wrong way
        CHECK((queries ? row <= previous_row : row >= previous_row));
        previous_row = row;
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == tiles);
    }
    for (const int64_t blocks : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, tiles, tiles + 5}) {
      std::vector<int> seen(static_cast<size_t>(tiles), 0);
      for (int64_t block = 0; block < blocks; ++block)
        kernels::attention_forward_walk(a, block, blocks, [&](int64_t tile) {
          REQUIRE(tile >= 0);
          REQUIRE(tile < tiles);
          ++seen[static_cast<size_t>(tile)];
        });
      CHECK(std::count(seen.begin(), seen.end(), 1) == tiles);
    }
  }
  // Olmo 3 7B's attention at seq 8192, micro-batch 2 (32 heads): full-causal layers and the 4096-key window, and the
  // long-context stage's 65,536 positions, one instance.
  for (const auto& [B, T, window] : std::vector<std::array<int64_t, 3>>{{2, 8192, 0}, {2, 8192, 4096}, {1, 65536, 0}}) {
    kernels::AttentionArgs a;
    a.B = B, a.H = 32, a.T = T, a.window = window;
    CAPTURE(T);
    CAPTURE(window);
    const double dealt = forward_imbalance(a, kernels::kAttentionTileBlocks, false);
    MESSAGE("most work of a forward block over the mean: " << dealt << " dealt heaviest first on "
            << kernels::kAttentionTileBlocks << " blocks, " << forward_imbalance(a, 128, true)
            << " in place order on 128");
    CHECK(dealt < 1.01);
  }
  kernels::AttentionArgs full;
  full.B = 2, full.H = 32, full.T = 8192;
  CHECK(forward_imbalance(full, 128, true) > 1.4);  // the measure sees the old order's imbalance
}

// Context parallelism: the kernels over a part of an instance (AttentionArgs q_begin .. k_end; tiles cut to it)
// write exactly the part's rows, with the bits ref/ gives the whole instance, and nothing else: OLMo-core's llama3
// sharding at 2, 3 and 4 ranks and parts no sharding makes (tests/common/attention_parts.h), on GQA with a window,
// bf16, head dims past a chunk, and documents with and without a window. The backward reads the whole instance's
// out and statistics, as the ranks gather them.
TEST_CASE("attention exact over a part of an instance writes exactly its rows, with ref/'s whole-instance bits") {
  testing::for_each_attention_case(
      [](const testing::AttentionCase& c, const testing::AttentionOperands& o) {
        const testing::AttentionOperands g = testing::attention_operands(c, static_cast<uint32_t>(c.T * 11 + 3));
        const size_t qn = static_cast<size_t>(c.B * c.T * c.H * c.hd), kn = static_cast<size_t>(c.B * c.T * c.KV * c.hd);
        const size_t stats = static_cast<size_t>(c.B * c.H * c.T);
        testing::AttentionOutputs whole = testing::whole_instance_outputs(c, o, g.q);  // the args point into it
        for (const testing::AttentionPart& part : testing::attention_parts(c.T)) {
          CAPTURE(part.q_begin);
          CAPTURE(part.q_end);
          CAPTURE(part.k_begin);
          CAPTURE(part.k_end);
          kernels::AttentionArgs a = testing::attention_args(c, o);
          a.q_begin = part.q_begin, a.q_end = part.q_end, a.k_begin = part.k_begin, a.k_end = part.k_end;
          testing::AttentionOutputs got = testing::unwritten_outputs(qn, stats, kn);
          std::vector<float> scratch(static_cast<size_t>(kernels::attention_scratch_rows(a) * c.T));
          a.q = o.q.data(), a.k = o.k.data(), a.v = o.v.data(), a.out = got.out.data(), a.row_max = got.row_max.data();
          a.row_sum = got.row_sum.data(), a.scratch = scratch.data();
          kernels::attention_forward_host(a);
          // The backward reads the whole instance's out and statistics, as the ranks gather them.
          std::vector<float> row_d(stats), dkh(stats * static_cast<size_t>(c.hd)), dvh(dkh.size());
          a.out = whole.out.data(), a.row_max = whole.row_max.data(), a.row_sum = whole.row_sum.data();
          a.dout = g.q.data(), a.dq = got.dq.data(), a.dk = got.dk.data(), a.dv = got.dv.data(), a.row_d = row_d.data();
          a.dk_head = dkh.data(), a.dv_head = dvh.data();
          kernels::attention_backward_host(a);
          CHECK(testing::wrong_part_output(got, whole, c.T, c.H * c.hd, c.KV * c.hd, part) == "");
        }
      },
      testing::part_attention_cases());
}
