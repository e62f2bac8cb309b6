// The instance tree (core/instance_tree.h, model/gradient_tree.h; docs/canonical/step.md): its shape, the
// maximal-subtree decomposition of a rank's range, the stack plan and its memory bound, the float adds,
// the batch split, and micro-batch invariance of the model's gradient (tier T6 at the model level).
#include <doctest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "model/gradient_tree.h"
#include "model/init.h"
#include "core/instance_tree.h"
#include "model/olmo3.h"
#include "core/parallel.h"

using namespace olmoref;

namespace {

// value(node) by the definition, on whole vectors: the independent evaluation every plan must match.
std::vector<float> tree_value(const std::vector<std::vector<float>>& leaves, int64_t lo, int64_t hi) {
  if (hi - lo == 1) return leaves[static_cast<size_t>(lo)];
  const int64_t mid = lo + (hi - lo + 1) / 2;
  std::vector<float> a = tree_value(leaves, lo, mid);
  const std::vector<float> b = tree_value(leaves, mid, hi);
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] + b[i];
  return a;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Leaves whose sums depend on the order: magnitudes spread over many binades.
std::vector<std::vector<float>> random_leaves(int64_t n, int64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(len)));
  for (auto& v : out)
    for (auto& x : v) x = std::ldexp(u(rng), static_cast<int>(rng() % 40) - 20);
  return out;
}

// Feeds instances [a, a+count) as the model writes them: two "tensors" [0, cut) and [cut, len), each instance
// by instance.
void feed_two_tensors(GradientTree& tree, const std::vector<std::vector<float>>& leaves, int64_t a, int64_t count,
                      int64_t cut) {
  const int64_t len = static_cast<int64_t>(leaves.front().size());
  for (const auto& [off, sz] : {std::pair<int64_t, int64_t>{0, cut}, {cut, len - cut}})
    for (int64_t b = 0; b < count; ++b) {
      std::copy(leaves[a + b].begin() + off, leaves[a + b].begin() + off + sz, tree.leaf(b, off, sz));
      tree.commit(b, off, sz);
    }
}

}  // namespace

TEST_CASE("instance tree: the shape is the balanced split with the larger half on the left") {
  CHECK(tree_mid(0, 5) == 3);
  CHECK(tree_mid(3, 5) == 4);
  CHECK(tree_mid(0, 6) == 3);
  CHECK(is_tree_node(5, 0, 3));
  CHECK(is_tree_node(5, 3, 5));
  CHECK(is_tree_node(5, 2, 3));
  CHECK_FALSE(is_tree_node(5, 1, 3));
  CHECK_FALSE(is_tree_node(5, 2, 4));
  CHECK(tree_depth(1) == 0);
  CHECK(tree_depth(5) == 3);
  CHECK(tree_depth(8) == 3);
  CHECK(maximal_subtrees(16, 0, 16) == std::vector<TreeNode>{{0, 16}});
  CHECK(maximal_subtrees(16, 0, 6) == std::vector<TreeNode>{{0, 4}, {4, 6}});
  CHECK(maximal_subtrees(16, 6, 12) == std::vector<TreeNode>{{6, 8}, {8, 12}});
}

TEST_CASE("instance tree: maximal subtrees partition every range, and each is maximal") {
  for (int64_t n = 1; n <= 40; ++n)
    for (int64_t lo = 0; lo < n; ++lo)
      for (int64_t hi = lo + 1; hi <= n; ++hi) {
        const auto nodes = maximal_subtrees(n, lo, hi);
        REQUIRE(!nodes.empty());
        CHECK(nodes.front().lo == lo);
        CHECK(nodes.back().hi == hi);
        CHECK(static_cast<int>(nodes.size()) <= std::max(1, 2 * tree_depth(n)));
        for (size_t i = 0; i < nodes.size(); ++i) {
          CHECK(is_tree_node(n, nodes[i].lo, nodes[i].hi));
          if (i) CHECK(nodes[i - 1].hi == nodes[i].lo);
          // Maximal: no two neighbours are the children of one node.
          if (i) CHECK_FALSE((is_tree_node(n, nodes[i - 1].lo, nodes[i].hi) && tree_mid(nodes[i - 1].lo, nodes[i].hi) == nodes[i].lo));
        }
      }
}

TEST_CASE("instance tree: per-rank stack plans leave the maximal subtrees, and the owner finishes the root") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = 1 + rng() % 70;
    // A random cut of [0, n) into contiguous runs (ranks).
    std::vector<int64_t> cuts{0};
    for (int64_t i = 1; i < n; ++i)
      if (rng() % 4 == 0) cuts.push_back(i);
    cuts.push_back(n);
    std::vector<TreeNode> all;
    for (size_t r = 0; r + 1 < cuts.size(); ++r) {
      TreePlan plan(n);
      for (int64_t i = cuts[r]; i < cuts[r + 1]; ++i) plan.feed_leaf(i);
      // Without emission: from instance 0 the stack never exceeds ceil(log2 N) + 1; a range that starts inside
      // a subtree also keeps its finished boundary subtrees there.
      CAPTURE(n);
      CAPTURE(cuts[r]);
      if (cuts[r] == 0) CHECK(plan.peak_slots() <= plan.max_slots());
      else CHECK(plan.peak_slots() <= 2 * tree_depth(n));
      CHECK(plan.stack() == maximal_subtrees(n, cuts[r], cuts[r + 1]));
      all.insert(all.end(), plan.stack().begin(), plan.stack().end());
      // The emitting plan (what ranks run): the same subtrees, emitted when complete, within the bound always.
      TreePlan emitting(n, cuts[r], cuts[r + 1]);
      for (int64_t i = cuts[r]; i < cuts[r + 1]; ++i) emitting.feed_leaf(i);
      CHECK(emitting.peak_slots() <= emitting.max_slots());
      CHECK(emitting.stack().empty());
      CHECK(emitting.emitted() == plan.stack());
    }
    TreePlan owner(n);
    for (const TreeNode& node : all) owner.feed(node);
    CHECK(owner.stack() == std::vector<TreeNode>{{0, n}});
  }
  TreePlan p(8);
  p.feed_leaf(0);
  CHECK_THROWS_WITH(p.feed_leaf(2), doctest::Contains("in order"));
  CHECK_THROWS_WITH(p.feed({1, 3}), doctest::Contains("not a node"));
}

TEST_CASE("gradient tree: any micro-batch cut and tensor slicing give the definition's bits") {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = 1 + rng() % 23, len = 1 + rng() % 300;
    const auto leaves = random_leaves(n, len, 100 + trial);
    const std::vector<float> want = tree_value(leaves, 0, n);
    const int64_t mb = 1 + rng() % n;
    GradientTree tree(n, len, &pool);
    tree.reset();
    for (int64_t a = 0; a < n; a += mb) {
      const int64_t count = std::min(mb, n - a);
      tree.begin_microbatch(a, count);
      feed_two_tensors(tree, leaves, a, count, static_cast<int64_t>(rng() % (len + 1)));
    }
    REQUIRE(tree.nodes() == std::vector<TreeNode>{{0, n}});
    CHECK(same_bits(tree.slot(0), want.data(), static_cast<size_t>(len)));
    CHECK(tree.peak_slots() <= tree_depth(n) + 1);
  }
}

TEST_CASE("gradient tree: an emitting rank's outputs are its maximal subtrees' values, slice by slice") {
  ThreadPool pool(2);
  std::mt19937 rng(19);
  for (int trial = 0; trial < 80; ++trial) {
    const int64_t n = 2 + rng() % 30, len = 1 + rng() % 200;
    const int64_t r0 = rng() % n, r1 = r0 + 1 + rng() % (n - r0);
    const auto leaves = random_leaves(n, len, 300 + trial);
    const std::vector<TreeNode> want_nodes = maximal_subtrees(n, r0, r1);
    std::vector<std::vector<float>> out(want_nodes.size(), std::vector<float>(static_cast<size_t>(len), -1.0f));
    GradientTree tree(n, len, &pool);
    tree.reset_emitting(r0, r1, [&](int q, const float* src, int64_t off, int64_t sz) {
      std::copy(src, src + sz, out[static_cast<size_t>(q)].begin() + off);
    });
    const int64_t mb = 1 + rng() % (r1 - r0);
    for (int64_t a = r0; a < r1; a += mb) {
      const int64_t count = std::min(mb, r1 - a);
      tree.begin_microbatch(a, count);
      feed_two_tensors(tree, leaves, a, count, static_cast<int64_t>(rng() % (len + 1)));
    }
    REQUIRE(tree.nodes() == want_nodes);
    CHECK(tree.peak_slots() <= tree_depth(n) + 1);
    for (size_t q = 0; q < want_nodes.size(); ++q) {
      const std::vector<float> want = tree_value(leaves, want_nodes[q].lo, want_nodes[q].hi);
      CHECK(same_bits(out[q].data(), want.data(), static_cast<size_t>(len)));
    }
  }
}

TEST_CASE("gradient tree: the micro-batch-chain negative control gives other bits") {
  // mb 4: ((g0 + g1) + g2) + g3 per micro-batch, where the instance tree has (g0 + g1) + (g2 + g3). (With mb 3
  // over 12 the two shapes coincide, which is why the T6 runs use several micro-batch sizes.)
  const int64_t n = 12, len = 4096;
  const auto leaves = random_leaves(n, len, 7);
  const std::vector<float> want = tree_value(leaves, 0, n);
  GradientTree chain(n, len, nullptr, TreeShape::microbatch_chain, 4);
  for (int64_t a = 0; a < n; a += 4) {
    chain.begin_microbatch(a, 4);
    for (int64_t b = 0; b < 4; ++b) {
      std::copy(leaves[a + b].begin(), leaves[a + b].end(), chain.leaf(b, 0, len));
      chain.commit(b, 0, len);
    }
  }
  CHECK_FALSE(same_bits(chain.slot(0), want.data(), static_cast<size_t>(len)));
}

TEST_CASE("batch split: contiguous runs of micro-batches, at most one apart, any world size") {
  for (int64_t G = 1; G <= 30; ++G)
    for (int64_t mb = 1; mb <= G; ++mb)
      for (int W = 1; W <= 9; ++W) {
        const BatchSplit s{G, mb, W};
        const int64_t M = s.n_microbatches();
        if (M < W) {
          CHECK_THROWS_WITH(s.validate(), doctest::Contains("train.micro_batch_instances <="));
          continue;
        }
        s.validate();
        // Every micro-batch and instance exactly once; each round's micro-batches are consecutive, one per rank.
        std::vector<int> seen_mb(static_cast<size_t>(M), 0), seen_inst(static_cast<size_t>(G), 0);
        for (int r = 0; r < W; ++r) {
          const std::vector<int64_t> mine = s.microbatches_of_rank(r);
          CHECK(static_cast<int64_t>(mine.size()) >= M / W);
          CHECK(static_cast<int64_t>(mine.size()) <= M / W + 1);
          for (const int64_t m : mine) {
            CHECK(s.rank_of_microbatch(m) == r);
            ++seen_mb[static_cast<size_t>(m)];
          }
          for (const int64_t i : s.instances_of_rank(r)) ++seen_inst[static_cast<size_t>(i)];
          for (int64_t t = 0; t < s.n_rounds(); ++t) {
            const int64_t m = s.microbatch_of(r, t);
            CHECK(m == (t * W + r < M ? t * W + r : -1));
          }
        }
        CHECK(std::count(seen_mb.begin(), seen_mb.end(), 1) == M);
        CHECK(std::count(seen_inst.begin(), seen_inst.end(), 1) == G);
        CHECK(s.instances_of_microbatch(M - 1).second == G);
      }
}

TEST_CASE("batch split under context parallelism: a group's ranks share each micro-batch, its last rank holds it") {
  for (int64_t G = 1; G <= 20; ++G)
    for (int64_t mb = 1; mb <= G; ++mb)
      for (int W = 1; W <= 8; ++W)
        for (int cp = 1; cp <= W; ++cp) {
          CAPTURE(G);
          CAPTURE(mb);
          CAPTURE(W);
          CAPTURE(cp);
          const BatchSplit s{G, mb, W, cp};
          if (W % cp != 0) {
            CHECK_THROWS_WITH(s.validate(), doctest::Contains("train.cp_degree"));
            continue;
          }
          const BatchSplit groups{G, mb, W / cp};  // the groups take micro-batches as ranks do without CP
          if (s.n_microbatches() < W / cp) {
            CHECK_THROWS_WITH(s.validate(), doctest::Contains(cp > 1 ? "context-parallel groups" : "ranks"));
            continue;
          }
          s.validate();
          CHECK(s.n_rounds() == groups.n_rounds());
          for (int r = 0; r < W; ++r) {
            const bool holder = r % cp == cp - 1;
            CHECK(s.holds_microbatches(r) == holder);
            for (int64_t t = 0; t < s.n_rounds(); ++t) {
              const int64_t m = groups.microbatch_of(r / cp, t);
              CHECK(s.group_microbatch_of(r, t) == m);
              CHECK(s.microbatch_of(r, t) == (holder ? m : -1));
            }
            CHECK(s.microbatches_of_rank(r) ==
                  (holder ? groups.microbatches_of_rank(r / cp) : std::vector<int64_t>{}));
            CHECK(s.instances_of_rank(r) == (holder ? groups.instances_of_rank(r / cp) : std::vector<int64_t>{}));
          }
          for (int64_t m = 0; m < s.n_microbatches(); ++m)
            CHECK(s.rank_of_microbatch(m) == groups.rank_of_microbatch(m) * cp + cp - 1);
        }
}

TEST_CASE("model: a micro-batch's gradient is the instance tree of one-instance gradients (T6, fp32 and bf16)") {
  ModelConfig cfg{.vocab_size = 97, .d_model = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8,
                  .ffn_hidden = 64, .swa_pattern = {4, -1}, .moe = {}};
  const int64_t B = 5, T = 12;
  for (const Precision prec : {Precision::fp32, Precision::bf16}) {
    CAPTURE(static_cast<int>(prec));
    ThreadPool pool(2);
    Olmo3 whole(cfg, B, T, prec), single(cfg, 1, T, prec), pairs(cfg, 2, T, prec);
    const ParamLayout& L = whole.layout();
    std::vector<float> params(static_cast<size_t>(L.total));
    init_params(cfg, L, params.data());
    std::vector<uint32_t> tokens(static_cast<size_t>(B * T));
    std::mt19937 rng(21);
    for (auto& t : tokens) t = rng() % cfg.vocab_size;
    const int64_t N = B * (T - 1);
    std::vector<float> g_whole(static_cast<size_t>(L.total));
    const LossSums s_whole = whole.forward_backward(params.data(), tokens.data(), N, g_whole.data(), &pool);
    // One instance per forward/backward.
    GradientTree t1(B, L.total, &pool);
    std::vector<LossSums> per(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      t1.begin_microbatch(b, 1);
      single.forward_backward(params.data(), tokens.data() + b * T, 1, N, t1, per.data() + b, &pool);
    }
    CHECK(same_bits(t1.slot(0), g_whole.data(), g_whole.size()));
    // Micro-batches of 2, 2, 1 (the last shorter).
    GradientTree t2(B, L.total, &pool);
    for (int64_t a = 0; a < B; a += 2) {
      const int64_t count = std::min<int64_t>(2, B - a);
      t2.begin_microbatch(a, count);
      pairs.forward_backward(params.data(), tokens.data() + a * T, count, N, t2, per.data() + a, &pool);
    }
    CHECK(same_bits(t2.slot(0), g_whole.data(), g_whole.size()));
    std::vector<double> ce(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) ce[static_cast<size_t>(b)] = per[static_cast<size_t>(b)].ce;
    CHECK(tree_sum_range(ce.data(), 0, B) == s_whole.ce);
  }
}
