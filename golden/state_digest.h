// golden/state_digest.h — the whole-vector Merkle root (golden/digest.h) of a state vector that is split over the
// ranks: the step's parameter digest, and a checkpoint's parameter and moment digests. Every layout gives the
// single-process root, because the leaves are the same chunks of the flat vector, hashed where they lie.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/executor.h"
#include "dist/state_pieces.h"

namespace olmoref {

class StateDigest {
 public:
  explicit StateDigest(const dist::ShardedState& state) : s_(state) {}
  // Collective over the world: the root of `state` (this rank's buffer of `span`, in executor memory). Each rank
  // hashes its optimizer range's chunks, which it always holds, except for the parameters under expert-resident
  // state: there each rank hashes its StatePlacement::hashed_chunks after the pieces it lacks have come to it
  // (their bytes added to pieces_sent).
  std::string operator()(const Buffer<float>& state, dist::Span span, uint64_t& pieces_sent);
  // The parameters' (a vector on each rank's shard range).
  std::string operator()(const Buffer<float>& state, uint64_t& pieces_sent) {
    return (*this)(state, dist::Span::shard, pieces_sent);
  }

 private:
  // The leaves of every rank's optimizer range, all-gathered over the world.
  std::string sharded(const Buffer<float>& state, dist::Span span);
  dist::ShardedState s_;
  std::vector<std::vector<int64_t>> hashed_chunks_;  // every rank's, made on first use
};

}  // namespace olmoref
