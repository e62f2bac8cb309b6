// model/gradient_tree.h — the float side of the instance tree: stack slots holding partial gradients (full
// flat-vector length, in executor memory) and the adds the TreePlan prescribes (core/instance_tree.h), run by the
// executor's tree_add.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/executor.h"
#include "ref/cpu_executor.h"
#include "core/instance_tree.h"

namespace olmoref {

class ThreadPool;

// Receives a micro-batch's parameter gradients instance by instance, tensor by tensor: these are the
// leaves of the instance tree. For every parameter tensor [offset, offset + n) and every instance b of
// the micro-batch (0-based, in order), the model writes instance b's gradient of that tensor to
// leaf(b, offset, n) (overwriting n floats) and then calls commit(b, offset, n). The tree's adds are
// elementwise, so applying each instance's adds tensor slice by tensor slice gives the same bits as
// applying them to whole vectors, and no per-instance buffer is ever needed.
class GradientLeaves {
 public:
  virtual ~GradientLeaves() = default;
  virtual float* leaf(int64_t instance, int64_t offset, int64_t n) = 0;
  virtual void commit(int64_t instance, int64_t offset, int64_t n) = 0;
};

// A step's gradient tree evaluated left to right over the instances one process computes.
class GradientTree : public GradientLeaves {
 public:
  // n_instances: the step's global instance count N; n_floats: the flat gradient length; the slots live in
  // `ex`'s memory. shape/microbatch: TreeShape::microbatch_chain is the TEST-ONLY negative control.
  GradientTree(int64_t n_instances, int64_t n_floats, Executor& ex, TreeShape shape = TreeShape::balanced,
               int64_t microbatch_instances = 1);
  // On the CPU executor with these threads.
  GradientTree(int64_t n_instances, int64_t n_floats, ThreadPool* pool, TreeShape shape = TreeShape::balanced,
               int64_t microbatch_instances = 1);

  // Starts a step: the plan restarts at instance 0 (buffers are kept).
  void reset();
  // Receives a finished maximal subtree (output `index`), tensor slice by tensor slice: src[0..n) (executor
  // memory) holds its values of the flat vector's [offset, offset + n).
  using EmitFn = std::function<void(int index, const float* src, int64_t offset, int64_t n)>;
  // Starts a step of one rank of several, holding instances [first, last): each maximal subtree of that range
  // goes to `emit` as soon as it is complete, so at most ceil(log2 N) + 1 slots are ever live.
  void reset_emitting(int64_t first, int64_t last, EmitFn emit);
  // The next micro-batch is the global instances [first, first + count); they must follow the previous
  // micro-batch fed since reset() (or be the first of this process's range).
  void begin_microbatch(int64_t first, int64_t count);
  float* leaf(int64_t instance, int64_t offset, int64_t n) override;
  void commit(int64_t instance, int64_t offset, int64_t n) override;

  // Unit windows (the owners' reduction, dist/gradient_owners.h): slots hold `floats` values, not the whole flat
  // vector, and from set_window(lo, hi) on (hi - lo <= floats) leaves may only be written inside [lo, hi): a rank
  // then never holds a full-length gradient, only the unit whose backward runs.
  void use_windows(int64_t floats);
  void set_window(int64_t lo, int64_t hi);
  int64_t slot_floats() const { return slot_floats_; }

  // After the last micro-batch: the maximal whole subtrees of the fed range. Without emission slot i holds
  // node i; with emission they went to the EmitFn, in this order.
  const std::vector<TreeNode>& nodes() const { return emit_ ? plan_.emitted() : plan_.stack(); }
  float* slot(int i) { return slots_[static_cast<size_t>(i)].data(); }
  int peak_slots() const { return peak_; }
  void release();  // returns the slot buffers' memory (a sharded run keeps none between steps)

 private:
  GradientTree(int64_t n_instances, int64_t n_floats, std::unique_ptr<CpuExecutor> own, Executor* ex, TreeShape shape,
               int64_t microbatch_instances);
  int64_t n_instances_, n_floats_;
  std::unique_ptr<CpuExecutor> own_;  // the CPU executor of the ThreadPool constructor
  Executor* ex_;
  TreeShape shape_;
  int64_t mb_;
  TreePlan plan_;
  TreePlan mb_plan_;  // microbatch_chain only: the tree over micro-batch index
  EmitFn emit_;
  std::vector<TreePlan::Step> steps_;  // of the current micro-batch, one per instance
  int64_t count_ = 0;
  std::vector<Buffer<float>> slots_;
  int peak_ = 0;
  int64_t slot_floats_;                 // each slot's length: n_floats_, or the windows' capacity
  int64_t window_lo_ = 0, window_hi_;   // the flat-vector range the slots hold now
  float* at(int slot, int64_t offset, int64_t n);
};

}  // namespace olmoref
