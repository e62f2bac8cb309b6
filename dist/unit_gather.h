// dist/unit_gather.h — FSDP's parameter units (docs/canonical/step.md, "Across ranks"): each unit of the flat
// vector is gathered within the replicate group just before the model reads it and handed back to the OS right
// after, so a rank never holds more than a unit or two of other ranks' parameters. And the model's expert
// exchange over an EP group's communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/executor.h"
#include "dist/comm.h"
#include "dist/layout.h"
#include "dist/nccl_comm.h"
#include "dist/side_stream.h"
#include "model/olmo3.h"

namespace olmoref::dist {

// How UnitGather serves the unit the model announces next (ParamGate::prefetch).
enum class Prefetch {
  off,         // gather each unit when it is acquired
  on,          // gather the announced unit on a thread of its own, under the model's work on this one
  other_unit,  // TEST ONLY: gather the unit after the announced one, so that every acquire finds the wrong unit
  // TEST ONLY: the acquire of a prefetched unit does not wait for the side stream (the staged prefetch's copies, or
  // NCCL's groups): the model then reads the unit before it has landed (dist-prefetch's and dist-nccl-transport's
  // control of the host execution's side streams).
  no_stream_wait,
};

class UnitGather : public ParamGate {
 public:
  // params: this rank's shard [layout.lo(), layout.hi()) of the master parameters, in ex's memory; shard_group: the
  // ranks of this replicate group, ordered by shard index; ep: the expert-parallel group size (under expert
  // parallelism a rank reads only its own experts). All are borrowed and must outlive the gather. prefetch (not off):
  // gather the unit the walk announces next (ParamGate::prefetch) on a thread of its own while the model works on
  // this one (needs MPI_THREAD_MULTIPLE: dist::concurrent_collectives); its collectives run on a duplicate of
  // shard_group, so they never interleave with the main thread's. nccl (the same group's, or nullptr): every unit moves
  // from the shard to a unit buffer on the device, and the prefetch gathers the next one into a second buffer on a
  // stream of its own (no thread, no MPI). Collective: every rank of shard_group constructs it together.
  UnitGather(const Olmo3& model, const Layout& layout, int ep, Executor& ex, const Buffer<float>& params,
             Comm& shard_group, Prefetch prefetch = Prefetch::off, NcclComm* nccl = nullptr);
  ~UnitGather() override;
  UnitGather(const UnitGather&) = delete;
  UnitGather& operator=(const UnitGather&) = delete;

  // The unit in the unit buffer, read at the flat vector's offsets (unit_at_flat_offsets).
  const float* acquire(int unit) override;
  void release(int) override {}  // the next acquire overwrites the buffer
  void prefetch(int unit) override;
  // The step's gathers are over: a prefetch still in flight is collected and dropped, and the staging freed (a
  // sharded run keeps none between steps: the memory model's transients; the next gather makes it again).
  void release_staging();

  // What the prefetching thread's communicator sent (merged into the trainer's --report-comm figures).
  uint64_t prefetch_bytes_sent() const { return prefetch_comm_ ? prefetch_comm_->bytes_sent() : 0; }
  const std::map<std::string, uint64_t>* prefetch_bytes_by_what() const {
    return prefetch_comm_ ? &prefetch_comm_->bytes_sent_by_what() : nullptr;
  }
  // Acquires served by a finished prefetch, and those that gathered on the spot (a pass's first unit, or a unit
  // other than the announced one): what `train --report-comm` prints.
  int64_t prefetch_hits() const { return hits_; }
  int64_t gathers_on_the_spot() const { return misses_; }


 private:
  // One unit's all-to-all: what this rank sends (its part, packed) and receives (every piece of the unit it reads,
  // recv_pieces: their [begin, end) in the flat vector, shard by shard, back to back in recv).
  struct Gather {
    int unit = -1;
    StagingVector<float> send, recv;  // the executor's staging (page-locked on a device), recycled gather to gather
    std::vector<int64_t> send_counts, recv_counts, send_at;
    std::vector<std::pair<int64_t, int64_t>> recv_pieces;
    float* land = nullptr;  // the staged prefetch: the buffer the thread lands the unit in (next_unit_), read at
    int64_t land_at = 0;    // the flat vector's offsets less land_at
  };
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  struct Pieces {
    std::vector<Ranges> send, recv;  // [shard]: flat ranges of my part it reads; of its part I read
  };
  Pieces pieces_of(int unit) const;
  // My send block of a gather: ranks that read the same pieces of my part (all of them, without expert parallelism)
  // share one copy. Per rank its count and offset; the distinct piece lists at their offsets; the block's length.
  struct SendBlock {
    std::vector<int64_t> counts, at;
    std::vector<Ranges> lists;
    std::vector<int64_t> lists_at;
    int64_t total = 0;
  };
  static SendBlock send_block(const Pieces& p);
  const float* gather_on_device(int unit, Buffer<float>& into, void* stream);  // the NCCL transport
  const float* acquire_on_device(int unit);
  void grow_unit_buffer();
  // The executor's reads, on the calling (main) thread: by blocking copies, or (on_side) queued on the side stream.
  Gather pack(int unit, bool on_side = false);
  static void exchange(Gather& g, Comm& comm);    // the all-to-all alone: on either thread
  // The staged prefetch's last leg, on its thread: the received pieces into g.land, by the side stream's asynchronous
  // copies (a device's, or the host execution's worker), else the executor's.
  static void land(Gather& g, Executor& ex, SideStream* side);
  const float* unpack(Gather& g);                 // into the unit buffer (the executor's writes), then recycled
  void recycle(Gather& g);                        // its staging back to spare_
  void side_wait();                               // the host waits for the side stream (a device's; else nothing)

  const Olmo3& model_;
  const Layout& layout_;
  const int ep_;
  Executor& ex_;
  const Buffer<float>& params_;
  Comm& shard_group_;
  // The unit in use [largest unit] in the executor's memory, reused by every unit (the model acquires one at a time:
  // Olmo3::walk_forward), so no rank holds more than the largest unit of the gathered parameters, host or device.
  Buffer<float> unit_;
  // The MPI transport's staging, one unit's send and receive blocks, kept with their capacity from gather to gather
  // (page-locked memory is slow to make): the gather in flight holds them, else they wait here. One set serves every
  // gather, since a gather on the spot never overlaps the prefetch's (acquire collects the prefetch first).
  StagingVector<float> spare_send_, spare_recv_;
  int64_t most_sent_ = 0, most_received_ = 0;  // over every unit: the staging is made this long, once per step
  // Prefetch: the announced unit's gather in flight (its staging, at most one unit's, owned by the future).
  const Prefetch prefetch_;
  std::unique_ptr<Comm> prefetch_comm_;
  std::future<Gather> next_;
  NcclComm* const nccl_;
  // The prefetch's second unit buffer (NCCL's, and the staged prefetch's on a device executor): the next unit gathered
  // into next_unit_ (the two buffers swap at each hit), on a stream of its own (side_: dist/side_stream.h, a device's
  // or the host execution's worker); under NCCL pending_unit_ the unit queued (-1: none).
  Buffer<float> next_unit_;
  int pending_unit_ = -1;
  std::unique_ptr<SideStream> side_;
  // The MPI transport's prefetch on a device executor (cuda, and cuda-host standing in for it): the thread also lands
  // the unit in next_unit_ (on a device by the side stream, after the pieces' copies to the host on it too), so that
  // neither the copies over PCIe nor the all-to-all wait on the model's work; the buffers swap at each hit. On cpu the
  // received unit is copied in at the acquire, into the one unit buffer.
  const bool land_in_thread_;
  int64_t hits_ = 0, misses_ = 0;
};

// The model's expert exchange (model/olmo3.h) over the communicator of one EP group.
// nccl (the same group's, or nullptr): the rows move between executor buffers by NCCL (device_resident), the row
// counts still over the group's MPI communicator.
class CommExpertExchange : public ExpertExchange {
 public:
  explicit CommExpertExchange(Comm& group, NcclComm* nccl = nullptr) : group_(group), nccl_(nccl) {}
  int size() const override { return group_.size(); }
  int index() const override { return group_.rank(); }
  void allgather(const int64_t* mine, int64_t n, int64_t* all) override;
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                 const std::vector<int64_t>& recv_counts) override;
  bool device_resident() const override { return nccl_ != nullptr; }
  void move(const std::vector<const float*>& src, const std::vector<float*>& dst, const ExchangePlan& plan) override;

 private:
  Comm& group_;
  NcclComm* nccl_;
};

// The model's context exchange (model/olmo3.h) over the communicator of one context-parallel group.
// nccl (the same group's, or nullptr): attention's gathers and the chains' partials move between executor buffers by
// NCCL (device_resident); the small host-side gathers (the routing rows, the loss's terms) still by MPI.
class CommContextExchange : public ContextExchange {
 public:
  explicit CommContextExchange(Comm& group, NcclComm* nccl = nullptr) : group_(group), nccl_(nccl) {}
  int size() const override { return group_.size(); }
  int index() const override { return group_.rank(); }
  void allgather(const void* mine, size_t bytes, void* all) override;
  void send_next(const float* partial, int64_t n) override;
  void recv_prev(float* partial, int64_t n) override;
  bool device_resident() const override { return nccl_ != nullptr; }
  void move_positions(const std::vector<const float*>& src, const std::vector<float*>& dst,
                      const ExchangePlan& plan) override;
  void send_next_on_device(const float* partial, int64_t n) override;
  void recv_prev_on_device(float* partial, int64_t n) override;

 private:
  Comm& group_;
  NcclComm* nccl_;
};

}  // namespace olmoref::dist
