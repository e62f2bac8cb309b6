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
// Under ExchangeOverlap::on the unit in flight keeps its send blocks while the next unit fills others: send 2·k·u
// (over NCCL both on the device; over MPI the one filling on the device, the one in flight on the host).
// No gradient value held is ever the flat vector's length.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "core/executor.h"
#include "core/instance_tree.h"
#include "dist/comm.h"
#include "dist/layout.h"
#include "dist/nccl_comm.h"
#include "dist/side_stream.h"
#include "model/gradient_tree.h"
#include "model/olmo3.h"

namespace olmoref::dist {

// A unit's exchange runs in C all-to-alls, each on one chunk of every owner's piece, so an owner receives W·k blocks
// of a chunk (about k pieces' worth when C = W), not W·k pieces. Chunks pay only when pieces are large (each
// all-to-all costs a round of latency): C = min(W, 16, ceil(longest piece / 4 MiB)), the same on every rank.
constexpr int kMaxExchangeChunks = 16;
constexpr int64_t kExchangeChunkFloats = int64_t{1} << 20;
int exchange_chunks(const Layout& layout, const std::vector<std::pair<int64_t, int64_t>>& units);

// When a unit's exchange runs (OwnerReduction).
enum class ExchangeOverlap {
  off,  // when the unit's backward ends, its all-to-alls (NCCL's groups) and then the owners' adds, chunk by chunk
  // under the next unit's backward (executors cuda and cuda-host only). The adds of a unit touch only its slice of the
  // owner slots and keep their order, so no bit changes.
  // MPI: the backward's subtrees go to a device send block (copies on the device, as NCCL's), which a side stream of
  // their own (dist/side_stream.h) copies to the host's page-locked block when the unit's backward ends, so no copy
  // to the host blocks the backward; the next unit's first subtree has the executor wait for that copy before it
  // refills the block. On a thread of its own, which first waits for that copy: the all-to-alls (on a duplicate of
  // the communicator, so they never interleave with the main thread's collectives) and the owners' adds, chunk by
  // chunk, the adds' executor ops (copies to the device, tree adds) on a second side stream (these executors' ops
  // share no state between threads) that the thread waits for before the next chunk refills the receive block; the
  // thread is waited for when the next unit's backward ends or the step's tree is finished.
  // NCCL: on a side stream, after the backward that wrote the unit's send block, chunk by chunk its group and then the
  // owners' adds (the executor's ops queued there: SideStream::run); the next unit's subtrees fill a second send
  // block meanwhile, and when that unit's backward ends (or the step's tree is finished) the executor waits for the
  // side stream.
  on,
  // TEST ONLY: finish() reads the root before it waits for the last unit's exchange (dist-prefetch's control).
  no_wait,
  // TEST ONLY: nothing waits for the side stream: over NCCL the executor for the groups and adds, over MPI the thread
  // for its adds before the next all-to-all refills their receive block (dist-nccl-transport's and dist-prefetch's
  // controls: the host execution runs that stream's work late).
  no_stream_wait,
  // TEST ONLY, over MPI: the thread sends a unit's subtrees before their copy to the host has landed
  // (dist-prefetch's control).
  no_staging_wait,
  // TEST ONLY, over MPI: the next unit's backward refills the device send block before the copy to the host has read
  // it (dist-prefetch's control).
  no_refill_wait,
};

class OwnerReduction final : public UnitGradientSink {
 public:
  // units: the model's units [begin, end) (Olmo3::unit_range), which tile the flat vector. chunks: the exchange's
  // chunk count, 0 for exchange_chunks() (tests force others; any count gives the same bits). nccl (comm's ranks, or
  // nullptr): the send and receive blocks live in the executor's memory and NCCL moves them (the same blocks, the same
  // plan); else they live on the host and comm moves them. Either at the end of each unit's backward or (overlap; over
  // MPI it needs MPI_THREAD_MULTIPLE: dist::concurrent_collectives) under the next unit's. Collective over comm.
  OwnerReduction(Executor& ex, Comm& comm, const Layout& layout, const BatchSplit& split,
                 std::vector<std::pair<int64_t, int64_t>> units, int chunks = 0, NcclComm* nccl = nullptr,
                 ExchangeOverlap overlap = ExchangeOverlap::off);
  ~OwnerReduction() override;
  OwnerReduction(const OwnerReduction&) = delete;
  OwnerReduction& operator=(const OwnerReduction&) = delete;

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
  // What the exchange thread's communicator sent (merged into the trainer's --report-comm figures); nullptr without
  // one.
  const Comm* overlap_comm() const { return overlap_comm_.get(); }

  // The most gradient floats this rank held at once (local slots, send and receive blocks, owner slots) and the
  // longest single gradient value among them (a slot, or one block sent or received): what the memory model
  // predicts and tests/dist checks.
  int64_t peak_floats() const { return peak_floats_; }
  int64_t longest_buffer() const { return longest_buffer_; }
  // Wall seconds the main thread spent in the per-unit exchanges and the owners' adds, over the run (the exchange's
  // share of the step time: bench/hsdp_bench.sh); under overlap, waiting for the thread and the adds.
  double exchange_seconds() const { return exchange_seconds_; }

 private:
  struct OwnerFeed {
    int rank, index;      // subtree `index` of rank `rank`'s micro-batch in this round
    TreePlan::Step step;  // where the owner plan puts it and the adds that follow
  };
  // One unit's exchange, from its backward's first emitted value to the owners' last add: what the MPI transport's
  // thread needs and owns (the round's geometry is copied, since the next round replans before the adds run).
  struct UnitExchange {
    int unit = -1;
    std::vector<int> nodes_per_rank;  // how many subtrees each rank sends (0: idle in the round)
    std::vector<OwnerFeed> feeds;     // the round's owner steps, in rank then subtree order
    std::vector<int64_t> send_at;     // where owner j's blocks start in send; [W] = send's extent
    // The MPI transport's blocks, in the executor's staging (page-locked on a device); recv one chunk at a time.
    StagingVector<float> send, recv;
  };
  // Chunk c of a unit's exchange: per rank what goes out (count, offset in send) and comes in (count, offset in the
  // chunk's receive block); my piece's [lo, lo + len) of the chunk.
  struct ChunkPlan {
    std::vector<int64_t> send_counts, send_at, recv_counts, recv_at;
    int64_t received = 0, my_lo = 0, my_len = 0;
  };
  ChunkPlan chunk_plan(const UnitExchange& e, int c) const;
  ExchangePlan nccl_plan(const ChunkPlan& p) const;
  int64_t piece_floats(int unit, int rank) const;  // |unit ∩ rank's optimizer range|
  int64_t chunk_floats(int64_t piece) const;       // a piece is exchanged in chunks_ chunks of this many floats
  // The owner plan's steps of e's round on chunk c of my slice of its unit, reading the chunk's blocks at recv.
  void owner_adds(const UnitExchange& e, int c, const float* recv, bool recv_on_device);
  void settle();  // the exchange in flight, if any, waited for (over NCCL: its adds queued); its blocks kept
  // NCCL under overlap: e's groups and adds queued on the side stream, after the unit before's.
  void exchange_on_side(const UnitExchange& e);
  static std::shared_ptr<const UnitExchange> geometry_of(const UnitExchange& e);
  // NCCL under overlap: the step's send and receive blocks, made before any is in flight (most_sent: the most subtrees
  // this rank sends in a round; most_received: the most every rank sends in one).
  void size_device_blocks(int64_t most_sent, int64_t most_received);
  void grow_owner_slots(size_t slots);  // at least `slots` owner slots, each the optimizer range
  void note_memory(const UnitExchange* in_hand);  // in_hand: an exchange held outside the members, or nullptr

  Executor* ex_;
  Comm* comm_;
  NcclComm* nccl_;
  Layout layout_;
  BatchSplit split_;
  std::vector<std::pair<int64_t, int64_t>> units_;
  int64_t longest_unit_ = 0;
  int64_t widest_mine_ = 0;  // the most floats of one unit in my optimizer range
  GradientTree local_;
  TreePlan owner_plan_;
  std::vector<Buffer<float>> owner_slots_;  // [max_slots][optimizer range]
  std::vector<int> nodes_per_rank_;         // this round: how many subtrees each rank sends (0: idle)
  std::vector<OwnerFeed> feeds_;            // this round's owner steps, in rank then subtree order
  UnitExchange filling_;                    // the unit whose backward runs: its subtrees go into filling_.send
  // The MPI transport's blocks between exchanges, kept with their capacity through the step (page-locked memory is
  // slow to make): made once a step as long as the longest unit needs.
  StagingVector<float> spare_send_, spare_recv_;
  Buffer<float> send_dev_, recv_dev_;   // the NCCL transport's (executor memory), grown to the largest so far
  // NCCL under overlap: the send block of the unit whose groups are in flight (send_dev_ is the filling unit's), and
  // whether one is. Under overlap the stream the adds run on (and over NCCL the groups).
  Buffer<float> send_dev_flight_;
  bool device_in_flight_ = false;
  std::unique_ptr<SideStream> side_;
  // MPI under overlap: the stream that copies a unit's device send block (send_dev_) to the host's, and whether the
  // next subtree written there must first have the executor wait for that copy.
  std::unique_ptr<SideStream> staging_;
  bool refill_waits_ = false;
  int unit_ = -1;                           // the unit whose backward runs; -1 between units
  int chunks_;  // exchange_chunks()
  const ExchangeOverlap overlap_;
  int64_t delay_us_ = 0;  // TEST ONLY (OLMOREF_TEST_EXCHANGE_DELAY_US): the thread's pause before its all-to-alls
  int device_ = -1;       // executor cuda: the rank's device, made current on the thread
  int64_t peak_floats_ = 0, longest_buffer_ = 0;
  double exchange_seconds_ = 0.0;
  // Under overlap: the exchange in flight (its unit's blocks and geometry) and its thread, which runs on
  // overlap_comm_; declared last, so that a thread still running is waited for before what it uses goes.
  std::unique_ptr<Comm> overlap_comm_;
  UnitExchange flight_;
  std::future<void> in_flight_;
};

}  // namespace olmoref::dist
