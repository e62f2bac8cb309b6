// bench/bench_digest.cpp — the step's parameter digest (golden/state_digest) of a random vector of N floats, as one
// process of a training run computes it every step (bench/digest_bench.sh).
//
//   build/bench/bench_digest N THREADS REPEATS
// For the CPU executor (the vector in host memory, hashed in place) and cuda-host (in executor memory: it reaches the
// host in 64 MiB blocks, as on the GPU) prints the best of REPEATS seconds per digest of
//   before   the digest before issue 33: each block downloaded, then hashed, on the calling thread alone;
//   overlap  StateDigest without a pool: the next block downloads while one other thread hashes this one;
//   pool     StateDigest on a ThreadPool of THREADS threads (the trainer's, --threads);
// taken in turn, and checks that the three roots agree.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "dist/comm.h"
#include "golden/digest.h"
#include "golden/state_digest.h"
#include "model/executors.h"

using namespace olmoref;

namespace {

// Random fp32 bit patterns (NaNs and infinities included: the digest hashes bits), uploaded one block at a time so
// the host never holds a second copy of the vector.
void fill_random(Buffer<float>& state) {
  std::vector<float> block(static_cast<size_t>(StateDigest::kStreamChunks * kDigestChunk));
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int64_t at = 0; at < state.size(); at += static_cast<int64_t>(block.size())) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(block.size()), state.size() - at);
    auto* bits = reinterpret_cast<uint32_t*>(block.data());
    for (int64_t i = 0; i < n; ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
      bits[i] = static_cast<uint32_t>(s >> 32);
    }
    state.upload(block.data(), n, at);
  }
}

// The digest as it was before issue 33 (golden/state_digest.cpp at 8917ae9): hashed in place in host memory,
// otherwise downloaded a block at a time and each block hashed before the next one downloads, all on this thread.
std::string digest_before(const Executor& ex, const Buffer<float>& state) {
  const int64_t n = state.size(), chunks = (n + kDigestChunk - 1) / kDigestChunk;
  std::vector<Digest128> leaves(static_cast<size_t>(chunks));
  if (ex.host_memory()) {
    merkle_leaves(state.data(), n, 0, chunks, leaves.data());
    return merkle_root(leaves).hex();
  }
  std::vector<float> staging;
  for (int64_t b0 = 0; b0 < chunks; b0 += StateDigest::kStreamChunks) {
    const int64_t b1 = std::min(chunks, b0 + StateDigest::kStreamChunks);
    const int64_t x0 = b0 * kDigestChunk, x1 = std::min(n, b1 * kDigestChunk);
    staging.resize(static_cast<size_t>(x1 - x0));
    state.download(staging.data(), x1 - x0, x0);
    merkle_leaves(staging.data() - x0, x1, b0, b1, leaves.data() + b0);
  }
  return merkle_root(leaves).hex();
}

// Wall seconds of one call of `digest`; its root goes to `root`.
double seconds(const std::function<std::string()>& digest, std::string& root) {
  const auto t0 = std::chrono::steady_clock::now();
  root = digest();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s N THREADS REPEATS (N floats, e.g. 153117184 for olmo3-100m)\n", argv[0]);
    return 2;
  }
  const int64_t n = std::atoll(argv[1]);
  const int threads = std::atoi(argv[2]), repeats = std::atoi(argv[3]);
  if (n <= 0 || threads <= 0 || repeats <= 0) {
    std::fprintf(stderr, "%s: N, THREADS and REPEATS must be positive (got %s %s %s)\n", argv[0], argv[1], argv[2],
                 argv[3]);
    return 2;
  }
  dist::Layout layout;
  layout.total = n;
  const dist::StatePlacement placement;
  dist::Comm& world = dist::world();
  ThreadPool pool(threads);
  for (const char* name : {"cpu", "cuda-host"}) {
    const std::unique_ptr<Executor> ex = make_executor(name, nullptr);
    Buffer<float> state;
    state.reset(*ex, n, "the benchmark's parameter vector");
    fill_random(state);
    StateDigest overlap({*ex, layout, placement, world}), pooled({*ex, layout, placement, world}, &pool);
    uint64_t sent = 0;
    std::string want, got_overlap, got_pool;
    // The best of each, the three taken in turn (as bench/step_time.sh alternates binaries) so that the other work
    // of a shared machine weighs on all three alike.
    double before = 1e30, alone = 1e30, pooled_s = 1e30;
    for (int r = 0; r < repeats; ++r) {
      before = std::min(before, seconds([&] { return digest_before(*ex, state); }, want));
      alone = std::min(alone, seconds([&] { return overlap(state, sent); }, got_overlap));
      pooled_s = std::min(pooled_s, seconds([&] { return pooled(state, sent); }, got_pool));
    }
    if (got_overlap != want || got_pool != want)
      throw std::runtime_error(std::string(name) + ": the roots differ: before " + want + ", overlap " + got_overlap +
                               ", pool " + got_pool);
    std::printf("%-9s n %lld  before %.4f s  overlap %.4f s  pool(%d) %.4f s  speedup %.2fx  (%.2f GB/s)  root %s\n",
                name, static_cast<long long>(n), before, alone, threads, pooled_s, before / pooled_s,
                4.0 * static_cast<double>(n) / pooled_s / 1e9, want.c_str());
  }
  return 0;
}
