// dist/gradient_owners.h — the step's instance tree evaluated at the owners of the gradient (docs/canonical/step.md,
// "Across ranks").
//
// Micro-batch m runs on rank m mod W, so in round t the W ranks compute micro-batches [t·W, (t+1)·W): consecutive
// instances. Each rank evaluates its micro-batch's part of the tree in slots that hold one unit (embedding, a block,
// the head) at a time (GradientTree windows). When a unit's backward ends, every rank sends each rank j its
// micro-batch's finished maximal subtrees restricted to the unit ∩ j's optimizer range (one all-to-all per unit),
// and j feeds every rank's subtrees, in rank (= instance) order, to ONE TreePlan over the step's N instances,
// doing its adds on that slice only. The plan, its nodes and their order are the single process's, so the root an
// owner ends with is the single-process gradient on its range, bit for bit.
//
// Gradient memory per rank, in floats (u: the largest unit, n/W: the optimizer range, k <= 2·ceil(log2 mb)):
//   local slots  (ceil(log2 mb) + 1) · u     the micro-batch's pending nodes, one unit wide
//   send blocks  k · u                       this unit's finished subtrees, cut by owner
//   recv blocks  Σ_r k_r · (u ∩ n/W) / C      every rank's subtrees on a chunk of my slice (host; C chunks, one
//                                            all-to-all each: exchange_chunks)
//   owner slots  (ceil(log2 N) + 1) · n/W     the step's pending nodes on my optimizer range
// No gradient value held is ever the flat vector's length.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/executor.h"
#include "core/instance_tree.h"
#include "dist/comm.h"
#include "dist/layout.h"
#include "dist/nccl_comm.h"
#include "model/gradient_tree.h"
#include "model/olmo3.h"

namespace olmoref::dist {

// A unit's exchange runs in C all-to-alls, each on one chunk of every owner's piece, so an owner receives W·k blocks
// of a chunk (about k pieces' worth when C = W), not W·k pieces. Chunks pay only when pieces are large (each
// all-to-all costs a round of latency): C = min(W, 16, ceil(longest piece / 4 MiB)), the same on every rank.
constexpr int kMaxExchangeChunks = 16;
constexpr int64_t kExchangeChunkFloats = int64_t{1} << 20;
int exchange_chunks(const Layout& layout, const std::vector<std::pair<int64_t, int64_t>>& units);

class OwnerReduction final : public UnitGradientSink {
 public:
  // units: the model's units [begin, end) (Olmo3::unit_range), which tile the flat vector. chunks: the exchange's
  // chunk count, 0 for exchange_chunks() (tests force others; any count gives the same bits). nccl (comm's ranks, or
  // nullptr): the send and receive blocks live in the executor's memory and NCCL moves them (the same blocks, the same
  // plan); else they live on the host and comm moves them.
  OwnerReduction(Executor& ex, Comm& comm, const Layout& layout, const BatchSplit& split,
                 std::vector<std::pair<int64_t, int64_t>> units, int chunks = 0, NcclComm* nccl = nullptr);

  // Starts a step: the owner plan restarts at instance 0.
  void begin_step();
  // Round t: plans every rank's nodes of the round at the owner and, when this rank has a micro-batch in it, starts
  // the local tree on that micro-batch's instances and returns the leaves the model writes (nullptr: an idle round).
  GradientLeaves* begin_round(int64_t round);
  void unit_backward_begins(int unit) override;
  void unit_backward_done(int unit) override;
  // After the last round: the root of the tree on this rank's optimizer range, into shard_out (executor memory).
  void finish(float* shard_out);
  // Frees every buffer (a sharded run keeps none between steps).
  void release();

  // The most gradient floats this rank held at once (local slots, send and receive blocks, owner slots) and the
  // longest single gradient value among them (a slot, or one block sent or received): what the memory model
  // predicts and tests/dist checks.
  int64_t peak_floats() const { return peak_floats_; }
  int64_t longest_buffer() const { return longest_buffer_; }
  // Wall seconds spent in the per-unit exchanges and the owners' adds, over the run (the exchange's share of the
  // step time: bench/hsdp_bench.sh).
  double exchange_seconds() const { return exchange_seconds_; }

 private:
  struct OwnerFeed {
    int rank, index;      // subtree `index` of rank `rank`'s micro-batch in this round
    TreePlan::Step step;  // where the owner plan puts it and the adds that follow
  };
  int64_t piece_floats(int unit, int rank) const;  // |unit ∩ rank's optimizer range|
  int64_t chunk_floats(int64_t piece) const;       // a piece is exchanged in chunks_ chunks of this many floats
  void note_memory();

  Executor* ex_;
  Comm* comm_;
  NcclComm* nccl_;
  Layout layout_;
  BatchSplit split_;
  std::vector<std::pair<int64_t, int64_t>> units_;
  GradientTree local_;
  TreePlan owner_plan_;
  std::vector<Buffer<float>> owner_slots_;  // [max_slots][optimizer range]
  std::vector<int> nodes_per_rank_;         // this round: how many subtrees each rank sends (0: idle)
  std::vector<OwnerFeed> feeds_;            // this round's owner steps, in rank then subtree order
  std::vector<int64_t> send_at_;            // this unit: where owner j's blocks start in send_
  // The MPI transport's blocks: the executor's staging (page-locked on a device), kept through the step.
  StagingVector<float> send_, recv_;
  Buffer<float> send_dev_, recv_dev_;   // the NCCL transport's (executor memory), grown to the largest so far
  int64_t send_floats_ = 0, recv_floats_ = 0;  // the blocks' extent now (either transport)
  int unit_ = -1;                           // the unit whose backward runs; -1 between units
  int chunks_;  // exchange_chunks()
  int64_t peak_floats_ = 0, longest_buffer_ = 0;
  double exchange_seconds_ = 0.0;
};

}  // namespace olmoref::dist
