// golden/state_digest: a device executor's state reaches the host in blocks of chunks, and the root is the one the
// whole vector hashed at once gives, across block boundaries and a short last chunk, on any number of threads.
#include <doctest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "dist/comm.h"
#include "golden/digest.h"
#include "golden/state_digest.h"
#include "model/executors.h"

using namespace olmoref;

namespace {

// n random fp32 bit patterns (NaNs included: the digest hashes bits), one process's layout of them.
struct RandomVector {
  RandomVector(int64_t n, uint32_t seed) : host(static_cast<size_t>(n)) {
    std::mt19937 rng(seed);
    for (float& x : host) {
      const uint32_t bits = rng();
      std::memcpy(&x, &bits, 4);
    }
    layout.total = n;
  }
  std::vector<float> host;
  dist::Layout layout;
  const dist::StatePlacement placement;
  dist::Comm& world = dist::world();
};

}  // namespace

TEST_CASE("state digest: a device-memory state hashed block by block has the whole vector's root") {
  // 300 chunks and a short one: more than one 256-chunk block, the last block partial.
  const int64_t n = 300 * kDigestChunk + 12345;
  RandomVector v(n, 7);
  const std::vector<float>& host = v.host;
  const std::string want = merkle_digest(host.data(), n).hex();
  for (const char* name : {"cpu", "cuda-host"}) {
    CAPTURE(name);
    const std::unique_ptr<Executor> ex = make_executor(name, nullptr);
    Buffer<float> state;
    state.reset(*ex, n, "state");
    state.upload(host.data(), n);
    StateDigest digest({*ex, v.layout, v.placement, v.world});
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

// The root by golden/digest.h's definition, computed apart from it: XXH3-128 of each kDigestChunk-float chunk (the last
// short), then XXH3-128 of the leaves' canonical big-endian bytes, all on this thread, without golden/digest.cpp.
static std::string reference_root(const std::vector<float>& v) {
  std::vector<XXH128_canonical_t> leaves;
  for (size_t lo = 0; lo < v.size(); lo += static_cast<size_t>(kDigestChunk)) {
    const size_t n = std::min(v.size() - lo, static_cast<size_t>(kDigestChunk));
    XXH128_canonical_t leaf;
    XXH128_canonicalFromHash(&leaf, XXH3_128bits(v.data() + lo, n * sizeof(float)));
    leaves.push_back(leaf);
  }
  const XXH128_hash_t root = XXH3_128bits(leaves.data(), leaves.size() * sizeof(XXH128_canonical_t));
  return Digest128{root.high64, root.low64}.hex();
}

TEST_CASE("state digest: the root depends on neither the thread count nor the block size") {
  // 37 whole chunks and a short one: the last leaf short, and forced blocks of 1, 3 and 7 chunks end at every kind
  // of boundary (a whole block, a partial last block, a block holding only the short chunk).
  const int64_t n = 37 * kDigestChunk + 4321;
  RandomVector v(n, 33);
  const std::string want = reference_root(v.host);
  CHECK(merkle_digest(v.host.data(), n).hex() == want);
  for (const char* name : {"cpu", "cuda-host"}) {
    const std::unique_ptr<Executor> ex = make_executor(name, nullptr);
    Buffer<float> state;
    state.reset(*ex, n, "state");
    state.upload(v.host.data(), n);
    for (int threads : {0, 1, 2, 3}) {  // 0: no pool, the calling thread alone
      std::unique_ptr<ThreadPool> pool = threads > 0 ? std::make_unique<ThreadPool>(threads) : nullptr;
      for (int64_t block : {StateDigest::kStreamChunks, int64_t{1}, int64_t{3}, int64_t{7}}) {
        CAPTURE(name);
        CAPTURE(threads);
        CAPTURE(block);
        StateDigest digest({*ex, v.layout, v.placement, v.world}, pool.get());
        digest.set_debug_stream_chunks(block);
        uint64_t sent = 0;
        CHECK(digest(state, sent) == want);
      }
    }
  }
}
