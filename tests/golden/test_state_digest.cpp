// golden/state_digest: a device executor's state reaches the host in blocks of chunks, and the root is the one the
// whole vector hashed at once gives, across block boundaries and a short last chunk.
#include <doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "dist/comm.h"
#include "golden/digest.h"
#include "golden/state_digest.h"
#include "model/executors.h"

using namespace olmoref;

TEST_CASE("state digest: a device-memory state hashed block by block has the whole vector's root") {
  // 300 chunks and a short one: more than one 256-chunk block, the last block partial.
  const int64_t n = 300 * kDigestChunk + 12345;
  std::vector<float> host(static_cast<size_t>(n));
  std::mt19937 rng(7);
  for (float& x : host) {
    const uint32_t bits = rng();
    std::memcpy(&x, &bits, 4);
  }
  const std::string want = merkle_digest(host.data(), n).hex();
  dist::Layout layout;
  layout.total = n;
  const dist::StatePlacement placement;
  dist::Comm& world = dist::world();
  for (const char* name : {"cpu", "cuda-host"}) {
    CAPTURE(name);
    const std::unique_ptr<Executor> ex = make_executor(name, nullptr);
    Buffer<float> state;
    state.reset(*ex, n, "state");
    state.upload(host.data(), n);
    StateDigest digest({*ex, layout, placement, world});
    uint64_t sent = 0;
    CHECK(digest(state, sent) == want);
    // One bit flipped in the last block changes the root.
    std::vector<float> flipped = host;
    uint32_t bits;
    std::memcpy(&bits, &flipped[static_cast<size_t>(n - 1)], 4);
    bits ^= 1u;
    std::memcpy(&flipped[static_cast<size_t>(n - 1)], &bits, 4);
    state.upload(flipped.data(), n);
    CHECK(digest(state, sent) != want);
  }
}
