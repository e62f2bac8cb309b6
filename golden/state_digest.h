// golden/state_digest.h — the whole-vector Merkle root (golden/digest.h) of a state vector that is split over the
// ranks: the step's parameter digest, and a checkpoint's parameter and moment digests. Every layout gives the
// single-process root, because the leaves are the same chunks of the flat vector, hashed where they lie.
// The leaves are hashed on the trainer's pool (each in its own slot: no bit depends on the thread count); a device
// executor's range reaches the host in blocks, the next block downloading while the pool hashes this one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/executor.h"
#include "dist/state_pieces.h"
#include "golden/digest.h"

namespace olmoref {

class ThreadPool;  // core/parallel.h

class StateDigest {
 public:
  // pool: the threads that hash the leaves (nullptr: the calling thread alone). It must outlive the digest.
  explicit StateDigest(const dist::ShardedState& state, ThreadPool* pool = nullptr) : s_(state), pool_(pool) {}
  // Collective over the world: the root of `state` (this rank's buffer of `span`, in executor memory). Each rank
  // hashes its optimizer range's chunks, which it always holds, except for the parameters under expert-resident
  // state: there each rank hashes its StatePlacement::hashed_chunks after the pieces it lacks have come to it
  // (their bytes added to pieces_sent).
  std::string operator()(const Buffer<float>& state, dist::Span span, uint64_t& pieces_sent);
  // The parameters' (a vector on each rank's shard range).
  std::string operator()(const Buffer<float>& state, uint64_t& pieces_sent) {
    return (*this)(state, dist::Span::shard, pieces_sent);
  }
  // Chunks a device executor's state passes through the host at a time: 256 chunks of 64 Ki floats, 64 MiB. The
  // digest is hashed on the host, so a device copy of the whole range (29 GiB of fp32 parameters at 7B) would
  // otherwise sit there every step; by blocks the host holds two blocks (one downloading, one hashed), whatever the
  // model's size.
  static constexpr int64_t kStreamChunks = 256;
  // TEST ONLY: chunks per block instead of kStreamChunks, so that a small vector crosses several block boundaries.
  void set_debug_stream_chunks(int64_t chunks) { stream_chunks_ = chunks; }

 private:
  // The leaves of every rank's optimizer range, all-gathered over the world.
  std::string sharded(const Buffer<float>& state, dist::Span span);
  // The Merkle leaves of chunks [c0, c1) of the whole vector, read from `state`, which holds [lo, hi) of it.
  std::vector<Digest128> range_leaves(const Buffer<float>& state, int64_t lo, int64_t hi, int64_t c0, int64_t c1);
  dist::ShardedState s_;
  ThreadPool* pool_;
  int64_t stream_chunks_ = kStreamChunks;
  std::vector<std::vector<int64_t>> hashed_chunks_;  // every rank's, made on first use
  // The two blocks' host copies, kept from digest to digest: a fresh 64 MiB buffer costs its page faults each time.
  std::vector<float> staging_[2];
};

}  // namespace olmoref
