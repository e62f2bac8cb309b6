// The race check itself (kernels/block.h, HostOrder): a barrier missing where the host's forward order hides it — the
// broadcast after a reduction, the last level of the 32-lane tree fused with the phase that reads its result — gives
// other bits in reverse and snapshot order, while the same body with the barrier gives one result in every order; two
// threads writing one byte of shared memory in a phase stop the snapshot order, naming the phase, threads and byte.
#include <doctest.h>

#include <array>
#include <cstring>
#include <vector>

#include "kernels/block.h"

using namespace olmoref::kernels;

namespace {

struct TreeShared {
  float lane[32];
};

// out[t] = the 32 inputs summed by the canonical lane tree, read by every thread after it (the shape of the kernels'
// row reductions: rmsnorm's inverse norm, cross-entropy's maximum and sum). planted: the tree's last level and the
// read share one phase, the barrier between them missing.
std::array<float, 32> broadcast_sum(const std::array<float, 32>& in, HostOrder order, bool planted) {
  host_block_order() = order;
  TreeShared sh;
  HostBlock<NoRegs, 32> blk(sh);
  std::array<float, 32> out{};
  blk.phase([&](int t, auto&) { sh.lane[t] = in[static_cast<size_t>(t)]; });
  if (!planted) {
    lane_tree_phases(blk, sh.lane);
    blk.phase([&](int t, auto&) { out[static_cast<size_t>(t)] = sh.lane[0]; });
  } else {
    for (int w = 16; w >= 2; w /= 2)
      blk.phase([&](int t, auto&) {
        if (t < w) sh.lane[t] = sh.lane[t] + sh.lane[t + w];
      });
    blk.phase([&](int t, auto&) {
      if (t == 0) sh.lane[0] = sh.lane[0] + sh.lane[1];
      out[static_cast<size_t>(t)] = sh.lane[0];
    });
  }
  host_block_order() = HostOrder::forward;
  return out;
}

}  // namespace

TEST_CASE("race check: a missing barrier the forward order hides gives other bits in reverse and snapshot order") {
  std::array<float, 32> in{};
  for (int i = 0; i < 32; ++i) in[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i + 1) + 1e-3f * static_cast<float>(i * i);
  const std::array<float, 32> want = broadcast_sum(in, HostOrder::forward, false);
  for (HostOrder order : {HostOrder::reverse, HostOrder::snapshot}) {
    CAPTURE(static_cast<int>(order));
    CHECK(std::memcmp(broadcast_sum(in, order, false).data(), want.data(), sizeof want) == 0);
  }
  // The planted body passes in the forward order, as the host execution ran it before the race check ...
  CHECK(std::memcmp(broadcast_sum(in, HostOrder::forward, true).data(), want.data(), sizeof want) == 0);
  // ... and fails in the others: thread 31 reads lane[0] before thread 0 finished it.
  for (HostOrder order : {HostOrder::reverse, HostOrder::snapshot}) {
    CAPTURE(static_cast<int>(order));
    const std::array<float, 32> got = broadcast_sum(in, order, true);
    CHECK(got[31] != want[31]);
    CHECK(got[0] == want[0]);
  }
}

TEST_CASE("race check: two threads writing one byte of shared memory in a phase stop the snapshot order") {
  struct Shared {
    float total;
    float lane[32];
  } sh{};
  HostBlock<NoRegs, 32> blk(sh);
  host_block_order() = HostOrder::snapshot;
  blk.phase([&](int t, auto&) { sh.lane[t] = static_cast<float>(t); });  // one writer per byte: fine
  CHECK(sh.lane[31] == 31.0f);
  CHECK_THROWS_WITH_AS(blk.phase([&](int t, auto&) {
    if (t >= 3 && t <= 4) sh.total = sh.total + sh.lane[t];  // an unsynchronized accumulation
  }), doctest::Contains("phase 2 of a block of 32 threads: threads 3 and 4 both write byte "),
                       SharedWriteRace);
  host_block_order() = HostOrder::forward;
}
