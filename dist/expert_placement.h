// dist/expert_placement.h — expert-resident state under expert parallelism (train --ep N).
//
// Without EP every rank of a replicate group holds its shard's range [begin(s), end(s)) of the parameters
// (dist/layout.h), so each replicate group holds every expert. With EP a replicate group holds, of its ranges, only
// the experts that one of its own ranks runs (its EP owner): those are all it ever reads, since a rank reads only
// its own experts and FSDP gathers stay inside the replicate group. The other groups hold the rest, so every expert
// is held by at least one group (the EP groups' ranks together run every expert, and N | world). A rank also holds
// all of its optimizer range (dist/layout.h), whoever runs the experts there: it updates them (its reduced
// gradient and moments cover the whole range) and sends them to the replicas that hold them. The AdamW moments are
// the optimizer range's alone, never cut by experts. Nothing the update computes changes: the update is
// elementwise, so holding fewer elements only skips copies.
//
// Where a whole vector is needed — the Merkle digests and the checkpoint writes — pieces move to the rank that
// hashes or writes them (StatePlacement::source), so the digests and files are exactly those of a full placement.
//
// Which layouts drop anything: a replicate group of S consecutive ranks runs every expert when S ≥ N (its ranks
// cover every EP index), so only dp_shard < ep drops, e.g. DDP (1 x W) with any --ep > 1, or 2x2 with --ep 4.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "dist/layout.h"

namespace olmoref::dist {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// One expert's rows of one MoE weight tensor ([E·h, d] per layer for w1, w2 and w3): [begin, end) of the flat vector.
struct ExpertSpan {
  int64_t begin = 0, end = 0;
  int64_t expert = 0;
};

int64_t floats_in(const Ranges& ranges);  // their total length

class StatePlacement {
 public:
  StatePlacement() = default;
  // spans: every expert span of the model (any order); ep = 1 or no spans: every rank holds its whole range.
  StatePlacement(const Layout& layout, int ep, int64_t n_experts, std::vector<ExpertSpan> spans);

  // A run of [begin, end) that is one expert's (expert >= 0) or no expert's (-1).
  struct Piece {
    int64_t begin = 0, end = 0;
    int64_t expert = -1;
  };
  // [a, b) cut at the expert spans, in order.
  std::vector<Piece> pieces(int64_t a, int64_t b) const;

  // Does replicate group g hold expert e (one of its ranks is e's EP owner)? Always true for e = -1.
  bool group_holds(int replicate_index, int64_t expert) const;
  bool holds(int rank, int64_t expert) const { return group_holds(layout_.replicate_index_of(rank), expert); }
  // What rank r's group holds of r's shard's range: the experts one of its ranks runs and the pieces of no expert.
  // Sorted, disjoint ranges.
  Ranges held(int rank) const;
  // What rank r holds of the parameters: held(r) and its whole optimizer range (it updates every element there).
  Ranges held_parameters(int rank) const;
  int64_t held_floats(int rank) const;
  // Some rank holds less than its whole range (else every path is the full placement's).
  bool drops_any() const { return drops_any_; }
  // The rank that serves shard s's piece of `expert` to ranks without it: the lowest replicate group holding it.
  int source(int shard, int64_t expert) const;

  // The digest chunks (kDigestChunk floats, dist::kShardAlign) rank r hashes, ascending. Chunk c of shard s goes to
  // the replica holding most of it (ties rotate with c), so whole chunks are hashed where they lie and only pieces
  // of mixed chunks travel.
  std::vector<int64_t> hashed_chunks(int rank) const;

 private:
  Layout layout_;
  int ep_ = 1;
  int64_t n_experts_ = 0;
  std::vector<ExpertSpan> spans_;                // sorted by begin, disjoint
  std::vector<std::vector<char>> group_holds_;   // [replicate group][expert]
  bool drops_any_ = false;
  Ranges held_with(int rank, int64_t o0, int64_t o1) const;  // held(rank) and [o0, o1)
  mutable std::vector<int> hasher_;  // chunk -> the replicate index hashing it, made on first use
};

}  // namespace olmoref::dist
