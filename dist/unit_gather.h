// dist/unit_gather.h — FSDP's parameter units (docs/canonical/step.md, "Across ranks"): each unit of the flat
// vector is gathered within the replicate group just before the model reads it and handed back to the OS right
// after, so a rank never holds more than a unit or two of other ranks' parameters. And the model's expert
// exchange over an EP group's communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/executor.h"
#include "dist/comm.h"
#include "dist/layout.h"
#include "model/olmo3.h"

namespace olmoref::dist {

class UnitGather : public ParamGate {
 public:
  // params: this rank's shard [layout.lo(), layout.hi()) of the master parameters, in ex's memory; shard_group: the
  // ranks of this replicate group, ordered by shard index; ep: the expert-parallel group size (under expert
  // parallelism a rank reads only its own experts). All are borrowed and must outlive the gather.
  UnitGather(const Olmo3& model, const Layout& layout, int ep, Executor& ex, const Buffer<float>& params,
             Comm& shard_group);
  UnitGather(const UnitGather&) = delete;
  UnitGather& operator=(const UnitGather&) = delete;

  // The unit in the unit buffer, read at the flat vector's offsets (unit_at_flat_offsets).
  const float* acquire(int unit) override;
  void release(int) override {}  // the next acquire overwrites the buffer

 private:
  const Olmo3& model_;
  const Layout& layout_;
  const int ep_;
  Executor& ex_;
  const Buffer<float>& params_;
  Comm& shard_group_;
  // The unit in use [largest unit] in the executor's memory, reused by every unit (the model acquires one at a time:
  // Olmo3::walk_forward), so no rank holds more than the largest unit of the gathered parameters, host or device.
  Buffer<float> unit_;
};

// The model's expert exchange (model/olmo3.h) over the communicator of one EP group.
class CommExpertExchange : public ExpertExchange {
 public:
  explicit CommExpertExchange(Comm& group) : group_(group) {}
  int size() const override { return group_.size(); }
  int index() const override { return group_.rank(); }
  void allgather(const int64_t* mine, int64_t n, int64_t* all) override;
  void alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                 const std::vector<int64_t>& recv_counts) override;

 private:
  Comm& group_;
};

// The model's context exchange (model/olmo3.h) over the communicator of one context-parallel group.
class CommContextExchange : public ContextExchange {
 public:
  explicit CommContextExchange(Comm& group) : group_(group) {}
  int size() const override { return group_.size(); }
  int index() const override { return group_.rank(); }
  void allgather(const void* mine, size_t bytes, void* all) override;
  void send_next(const float* partial, int64_t n) override;
  void recv_prev(float* partial, int64_t n) override;

 private:
  Comm& group_;
};

}  // namespace olmoref::dist
