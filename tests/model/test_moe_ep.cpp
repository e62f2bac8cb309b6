// Expert parallelism (docs/canonical/moe.md "Expert parallelism"): who owns which experts, the owner's two row
// orders, and the model's forward/backward with its experts spread over an EP group, against the same model
// running every expert itself, bit for bit. The group here is threads in one process exchanging through shared
// memory (the trainer's MPI path is covered by tests/cli/moe.sh); the model code under test is the same.
#include <doctest.h>

#include <barrier>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "model/olmo3.h"
#include "model/init.h"
#include "ref/moe.h"
#include "core/parallel.h"

using namespace olmoref;

TEST_CASE("ep_experts: contiguous, covering, the first E mod n ranks one more") {
  for (int64_t E : {1, 4, 5, 8, 13, 32})
    for (int n = 1; n <= E && n <= 8; ++n) {
      CAPTURE(E);
      CAPTURE(n);
      int64_t next = 0;
      for (int i = 0; i < n; ++i) {
        const auto [first, last] = moe::ep_experts(E, n, i);
        CHECK(first == next);
        CHECK(last - first == E / n + (i < E % n ? 1 : 0));
        next = last;
      }
      CHECK(next == E);
    }
}

TEST_CASE("ep regrouping: source-major and expert-major hold the same rows, and round-trip") {
  // 3 sources, 5 experts, the owner holds experts 1..3; counts [3, 5].
  const int n = 3;
  const int64_t E = 5, first = 1, last = 4, w = 2;
  const std::vector<int64_t> counts = {9, 1, 0, 2, 9,  //
                                       9, 2, 1, 0, 9,  //
                                       9, 0, 3, 1, 9};
  // Source-major rows, each tagged (source, expert, index): s0 e1 #0, s0 e3 #0, s0 e3 #1, s1 e1 #0, ...
  std::vector<float> src;
  std::vector<std::array<int, 3>> tags;
  for (int s = 0; s < n; ++s)
    for (int64_t e = first; e < last; ++e)
      for (int64_t r = 0; r < counts[s * E + e]; ++r) tags.push_back({s, static_cast<int>(e), static_cast<int>(r)});
  for (const auto& t : tags) src.push_back(static_cast<float>(100 * t[0] + 10 * t[1] + t[2])), src.push_back(-src.back());
  const int64_t rows = static_cast<int64_t>(tags.size());
  REQUIRE(rows == 10);
  std::vector<float> em(src.size()), back(src.size());
  moe::ep_to_expert_major(src.data(), counts.data(), n, E, first, last, w, em.data());
  // Expert-major: expert 1 from sources 0, 1, 1; expert 2 from 1, 2, 2, 2; expert 3 from 0, 0, 2.
  std::vector<float> firsts;
  for (int64_t r = 0; r < rows; ++r) {
    firsts.push_back(em[r * w]);
    CHECK(em[r * w + 1] == -em[r * w]);
  }
  const std::vector<float> expect = {10, 110, 111, 120, 220, 221, 222, 30, 31, 230};
  for (size_t i = 0; i < expect.size(); ++i) CHECK(firsts[i] == expect[i]);
  moe::ep_to_source_major(em.data(), counts.data(), n, E, first, last, w, back.data());
  CHECK(back == src);
}

namespace {

// An EP group of threads: each collective publishes its inputs, waits for all, copies, waits again.
struct ThreadGroup {
  explicit ThreadGroup(int n) : n(n), sync(n), ptrs(n), counts(n) {}
  int n;
  std::barrier<> sync;
  std::vector<const void*> ptrs;
  std::vector<const std::vector<int64_t>*> counts;
};

class ThreadExchange : public ExpertExchange {
 public:
  ThreadExchange(ThreadGroup& g, int me) : g_(g), me_(me) {}
  int size() const override { return g_.n; }
  int index() const override { return me_; }
  void allgather(const int64_t* mine, int64_t n, int64_t* all) override {
    g_.ptrs[me_] = mine;
    g_.sync.arrive_and_wait();
    for (int i = 0; i < g_.n; ++i) std::memcpy(all + i * n, g_.ptrs[i], static_cast<size_t>(n) * sizeof(int64_t));
    g_.sync.arrive_and_wait();
  }
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                 const std::vector<int64_t>& recv_counts) override {
    g_.ptrs[me_] = send;
    g_.counts[me_] = &send_counts;
    g_.sync.arrive_and_wait();
    int64_t at = 0;
    for (int i = 0; i < g_.n; ++i) {
      const std::vector<int64_t>& c = *g_.counts[i];
      REQUIRE(c[me_] == recv_counts[i]);  // what i sends me is what I expect from i
      int64_t off = 0;
      for (int j = 0; j < me_; ++j) off += c[j];
      std::memcpy(recv + at, static_cast<const float*>(g_.ptrs[i]) + off, static_cast<size_t>(c[me_]) * sizeof(float));
      at += c[me_];
    }
    g_.sync.arrive_and_wait();
  }

 private:
  ThreadGroup& g_;
  int me_;
};

ModelConfig ep_model(int64_t experts, int64_t shared) {
  // init_std 0.3: scores far from uniform, so the experts' loads differ from rank to rank
  return ModelConfig{.vocab_size = 37, .d_model = 16, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 8,
                     .ffn_hidden = 24, .swa_pattern = {3, -1}, .init_std = 0.3, .init_seed = 7,
                     .moe = {.n_experts = experts, .top_k = 2, .hidden = 8, .shared_hidden = shared,
                             .lb_loss_weight = 0.01, .z_loss_weight = 0.001}};
}

struct RankResult {
  std::vector<float> grad;
  LossSums sums;
  std::vector<uint64_t> routing;
};

}  // namespace

TEST_CASE("expert parallelism: every rank's gradient, losses and routing equal the one-process model's, bit for bit") {
  struct Case {
    int64_t experts, shared;
    int ranks;
  };
  // 8 experts over 2 and 4 ranks (even), 5 over 3 (2, 2, 1: uneven), with and without a shared expert.
  for (const Case c : {Case{8, 0, 2}, Case{8, 12, 4}, Case{5, 12, 3}}) {
    CAPTURE(c.experts);
    CAPTURE(c.ranks);
    const ModelConfig cfg = ep_model(c.experts, c.shared);
    const int64_t B = 2, T = 9, N = c.ranks * B * (T - 1);
    Olmo3 probe(cfg, B, T);
    std::vector<float> params(static_cast<size_t>(probe.layout().total));
    init_params(cfg, probe.layout(), params.data());
    std::mt19937 rng(11);
    std::vector<uint32_t> tokens(static_cast<size_t>(c.ranks * B * T));
    for (auto& t : tokens) t = rng() % cfg.vocab_size;

    // Reference: one process, every expert local, each rank's micro-batch in turn.
    std::vector<RankResult> want(static_cast<size_t>(c.ranks));
    {
      Olmo3 model(cfg, B, T);
      ThreadPool pool(1);
      for (int r = 0; r < c.ranks; ++r) {
        RankResult& w = want[r];
        w.grad.resize(params.size());
        w.sums = model.forward_backward(params.data(), tokens.data() + r * B * T, N, w.grad.data(), &pool);
        for (const MoEInstance& mi : model.moe_instances()) w.routing.push_back(mi.routing);
      }
    }
    // The EP group: every rank computes its micro-batch, then the last rank sits out a second pass (idle_pass:
    // it still serves its experts) while the others compute their micro-batches again.
    ThreadGroup group(c.ranks);
    std::vector<RankResult> got(static_cast<size_t>(c.ranks)), again(static_cast<size_t>(c.ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < c.ranks; ++r)
      threads.emplace_back([&, r] {
        ThreadExchange ex(group, r);
        Olmo3 model(cfg, B, T);
        model.set_expert_exchange(&ex);
        ThreadPool pool(1);
        got[r].grad.resize(params.size());
        got[r].sums = model.forward_backward(params.data(), tokens.data() + r * B * T, N, got[r].grad.data(), &pool);
        for (const MoEInstance& mi : model.moe_instances()) got[r].routing.push_back(mi.routing);
        if (r == c.ranks - 1) {
          model.idle_pass(params.data());
        } else {
          again[r].grad.resize(params.size());
          again[r].sums = model.forward_backward(params.data(), tokens.data() + r * B * T, N, again[r].grad.data(), &pool);
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < c.ranks; ++r) {
      CAPTURE(r);
      CHECK(std::memcmp(got[r].grad.data(), want[r].grad.data(), params.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(&got[r].sums, &want[r].sums, sizeof(LossSums)) == 0);
      CHECK(got[r].routing == want[r].routing);
      if (r != c.ranks - 1) CHECK(std::memcmp(again[r].grad.data(), want[r].grad.data(), params.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("expert parallelism: refused by name where it cannot apply") {
  ThreadGroup group(3);
  ThreadExchange ex(group, 0);
  Olmo3 dense(ep_model(0, 0), 1, 4);
  CHECK_THROWS_WITH_AS(dense.set_expert_exchange(&ex), doctest::Contains("model.moe_experts"), std::invalid_argument);
  Olmo3 two(ep_model(2, 0), 1, 4);
  CHECK_THROWS_WITH_AS(two.set_expert_exchange(&ex), doctest::Contains("must own an expert"), std::invalid_argument);
}

// ---- Expert-resident state (dist/expert_placement.h) ----
#include "dist/expert_placement.h"

namespace {
// Six digest chunks; 4 experts of 30,000 floats in three tensors ("w1", "w2", "w3"), so spans cross chunk and
// shard boundaries and the vector has parts that are no expert's.
constexpr int64_t kTotal = 6 * dist::kShardAlign, kSpan = 30000;
std::vector<dist::ExpertSpan> test_spans() {
  std::vector<dist::ExpertSpan> out;
  for (const int64_t w : {10000, 140000, 262144})
    for (int64_t e = 0; e < 4; ++e) out.push_back({w + e * kSpan, w + (e + 1) * kSpan, e});
  return out;
}
dist::Layout test_layout(int S, int R, int64_t total = kTotal) {
  dist::Layout L;
  L.dp_shard = S, L.dp_replicate = R, L.total = total;
  return L;
}
}  // namespace

TEST_CASE("expert placement: DDP with EP 4 keeps each rank's own expert and everything that is no expert's") {
  const dist::StatePlacement P(test_layout(1, 4), 4, 4, test_spans());
  CHECK(P.drops_any());
  // Rank 2 runs expert 2 only: of each tensor it keeps [w + 2·span, w + 3·span).
  const dist::Ranges want = {{0, 10000},
                             {10000 + 2 * kSpan, 10000 + 3 * kSpan},
                             {10000 + 4 * kSpan, 140000},
                             {140000 + 2 * kSpan, 140000 + 3 * kSpan},
                             {140000 + 4 * kSpan, 262144},
                             {262144 + 2 * kSpan, 262144 + 3 * kSpan},
                             {262144 + 4 * kSpan, kTotal}};
  CHECK(P.held(2) == want);
  CHECK(P.held_floats(2) == kTotal - 9 * kSpan);
  CHECK(P.source(0, 3) == 3);
  CHECK(P.source(0, -1) == 0);
}

TEST_CASE("expert placement: every layout keeps what its ranks read, loses nothing, hashes every chunk once") {
  struct Case {
    int S, R, ep;
    int64_t E;
  };
  for (const Case c : {Case{1, 4, 2, 4}, Case{1, 4, 4, 4}, Case{2, 2, 4, 4}, Case{2, 2, 2, 4}, Case{4, 1, 4, 4},
                       Case{3, 2, 2, 4}, Case{2, 3, 3, 4}, Case{1, 3, 3, 4}, Case{1, 2, 2, 3}, Case{1, 1, 1, 4}}) {
    CAPTURE(c.S);
    CAPTURE(c.R);
    CAPTURE(c.ep);
    const dist::Layout L = test_layout(c.S, c.R);
    std::vector<dist::ExpertSpan> spans;
    for (const dist::ExpertSpan& s : test_spans())
      if (s.expert < c.E) spans.push_back(s);
    const dist::StatePlacement P(L, c.ep, c.E, spans);
    // A replicate group of S consecutive ranks covers every EP index (so drops nothing) exactly when S ≥ ep.
    CHECK(P.drops_any() == (c.ep > c.S));
    std::vector<int> hashed((kTotal + dist::kShardAlign - 1) / dist::kShardAlign, 0);
    for (int r = 0; r < L.world(); ++r) {
      const int s = L.shard_index_of(r), g = L.replicate_index_of(r);
      // held: sorted, disjoint, inside the shard's range, and exactly the pieces whose expert the group runs.
      const dist::Ranges held = P.held(r);
      for (size_t i = 0; i < held.size(); ++i) {
        CHECK(held[i].first < held[i].second);
        CHECK(held[i].first >= L.begin(s));
        CHECK(held[i].second <= L.end(s));
        if (i > 0) CHECK(held[i - 1].second < held[i].first);
      }
      int64_t expect = 0;
      for (const auto& p : P.pieces(L.begin(s), L.end(s))) {
        bool run_here = p.expert < 0 || c.ep == 1;
        for (int q = g * c.S; q < (g + 1) * c.S; ++q) {
          const auto [first, last] = moe::ep_experts(c.E, c.ep, q % c.ep);
          run_here = run_here || (p.expert >= first && p.expert < last);
        }
        CHECK(P.holds(r, p.expert) == run_here);
        if (run_here) expect += p.end - p.begin;
        // Whoever serves a piece holds it, and it is the lowest replicate group that does.
        const int src = P.source(s, p.expert);
        CHECK(L.shard_index_of(src) == s);
        CHECK(P.holds(src, p.expert));
        for (int h = 0; h < L.replicate_index_of(src); ++h) CHECK_FALSE(P.group_holds(h, p.expert));
      }
      CHECK(P.held_floats(r) == expect);
      for (const int64_t chunk : P.hashed_chunks(r)) {
        CHECK(chunk * dist::kShardAlign >= L.begin(s));
        CHECK(chunk * dist::kShardAlign < L.end(s));
        ++hashed[static_cast<size_t>(chunk)];
      }
    }
    for (int n : hashed) CHECK(n == 1);
  }
}

TEST_CASE("expert placement: pieces cut a range at the expert spans and cover it") {
  const dist::StatePlacement P(test_layout(1, 2), 2, 4, test_spans());
  const auto pieces = P.pieces(5000, 10000 + kSpan + 7);
  REQUIRE(pieces.size() == 3);
  CHECK((pieces[0].begin == 5000 && pieces[0].end == 10000 && pieces[0].expert == -1));
  CHECK((pieces[1].begin == 10000 && pieces[1].end == 10000 + kSpan && pieces[1].expert == 0));
  CHECK((pieces[2].begin == 10000 + kSpan && pieces[2].end == 10000 + kSpan + 7 && pieces[2].expert == 1));
  CHECK_THROWS(dist::StatePlacement(test_layout(1, 2), 2, 4, {{0, 10, 0}, {5, 20, 1}}));
}
