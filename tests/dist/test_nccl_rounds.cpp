// The NCCL transport's groups (dist::nccl_rounds): an exchange with more operations than one NCCL group takes is cut
// into rounds that every pair of ranks cuts alike. Checked on random plans, every rank's rounds computed as that rank
// would: no round over the limit, every non-empty piece once, and each send in the same round as its receive.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "dist/nccl_comm.h"

using olmoref::ExchangePlan;
using olmoref::dist::nccl_rounds;

namespace {
// n ranks; pieces[a][q] pieces from a to q, each of a random length (sometimes 0), the same on both ends.
std::vector<ExchangePlan> random_plans(int n, std::mt19937& rng, int most_pieces) {
  std::vector<ExchangePlan> plans(static_cast<size_t>(n), ExchangePlan(n));
  std::uniform_int_distribution<int> count(0, most_pieces), len(0, 5);
  for (int a = 0; a < n; ++a)
    for (int q = 0; q < n; ++q)
      for (int i = 0, k = count(rng); i < k; ++i) {
        const int64_t l = len(rng);
        plans[static_cast<size_t>(a)].send[static_cast<size_t>(q)].push_back({0, l});
        plans[static_cast<size_t>(q)].recv[static_cast<size_t>(a)].push_back({0, l});
      }
  return plans;
}
}  // namespace

TEST_CASE("nccl_rounds: under the limit, every piece once, each send in its receive's round") {
  std::mt19937 rng(7);
  for (const int max_ops : {2, 4, 6, 16, 64, 2048})
    for (const int n : {1, 2, 3, 5, 8, 13, 40}) {
      const std::vector<ExchangePlan> plans = random_plans(n, rng, n > 8 ? 3 : 9);
      // round_of[a][dir][q][i]: the round rank a put its piece i to (dir 0) or from (dir 1) q in
      std::vector<std::vector<std::vector<std::vector<int64_t>>>> round_of(static_cast<size_t>(n));
      for (int a = 0; a < n; ++a) {
        const ExchangePlan& p = plans[static_cast<size_t>(a)];
        auto& mine = round_of[static_cast<size_t>(a)];
        mine.assign(2, std::vector<std::vector<int64_t>>(static_cast<size_t>(n)));
        for (int q = 0; q < n; ++q) {
          mine[0][static_cast<size_t>(q)].assign(p.send[static_cast<size_t>(q)].size(), -1);
          mine[1][static_cast<size_t>(q)].assign(p.recv[static_cast<size_t>(q)].size(), -1);
        }
        const auto rounds = nccl_rounds(p, a, max_ops);
        for (size_t r = 0; r < rounds.size(); ++r) {
          CHECK(static_cast<int>(rounds[r].size()) <= max_ops);
          for (const auto& op : rounds[r]) {
            int64_t& slot = mine[op.send ? 0 : 1][static_cast<size_t>(op.peer)][static_cast<size_t>(op.index)];
            CHECK(slot == -1);  // once
            slot = static_cast<int64_t>(r);
          }
        }
        for (int q = 0; q < n; ++q)
          for (int dir = 0; dir < 2; ++dir) {
            const auto& list = (dir == 0 ? p.send : p.recv)[static_cast<size_t>(q)];
            for (size_t i = 0; i < list.size(); ++i)
              CHECK((mine[static_cast<size_t>(dir)][static_cast<size_t>(q)][i] == -1) == (list[i].n == 0));
          }
      }
      for (int a = 0; a < n; ++a)
        for (int q = 0; q < n; ++q) {
          const auto& sent = round_of[static_cast<size_t>(a)][0][static_cast<size_t>(q)];
          const auto& received = round_of[static_cast<size_t>(q)][1][static_cast<size_t>(a)];
          REQUIRE(sent.size() == received.size());
          for (size_t i = 0; i < sent.size(); ++i) CHECK(sent[i] == received[i]);
        }
    }
}

TEST_CASE("nccl_rounds: one round when the plan fits one group; a limit under 2 refused") {
  ExchangePlan p(4);
  for (int q = 0; q < 4; ++q) p.send[static_cast<size_t>(q)] = p.recv[static_cast<size_t>(q)] = {{0, 3}, {3, 0}, {3, 2}};
  const auto rounds = nccl_rounds(p, 1);
  REQUIRE(rounds.size() == 1);
  CHECK(rounds[0].size() == 16);  // 4 peers x 2 non-empty pieces x send and receive
  CHECK_THROWS(nccl_rounds(p, 1, 1));
}
