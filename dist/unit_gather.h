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
  ~UnitGather() override;
  UnitGather(const UnitGather&) = delete;
  UnitGather& operator=(const UnitGather&) = delete;

  // What the model reads [layout.total]: the device view, or the host view itself.
  float* base() { return device_view_.size() > 0 ? device_view_.data() : base_; }

  void acquire(int unit) override;
  void release(int unit) override;

 private:
  const Olmo3& model_;
  const Layout& layout_;
  const int ep_;
  Executor& ex_;
  const Buffer<float>& params_;
  Comm& shard_group_;
  // Address space for the whole vector (MAP_NORESERVE): only the units being used take pages.
  float* base_ = nullptr;
  size_t bytes_ = 0;
  Buffer<float> device_view_;  // device executors: the gathered units copied to the device
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

}  // namespace olmoref::dist
