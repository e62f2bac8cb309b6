#include "model/gradient_tree.h"

#include <stdexcept>


namespace olmoref {

GradientTree::GradientTree(int64_t n_instances, int64_t n_floats, ThreadPool* pool, TreeShape shape,
                           int64_t microbatch_instances)
    : GradientTree(n_instances, n_floats, std::make_unique<CpuExecutor>(pool), nullptr, shape, microbatch_instances) {}

GradientTree::GradientTree(int64_t n_instances, int64_t n_floats, Executor& ex, TreeShape shape,
                           int64_t microbatch_instances)
    : GradientTree(n_instances, n_floats, nullptr, &ex, shape, microbatch_instances) {}

GradientTree::GradientTree(int64_t n_instances, int64_t n_floats, std::unique_ptr<CpuExecutor> own, Executor* ex,
                           TreeShape shape, int64_t microbatch_instances)
    : n_instances_(n_instances),
      n_floats_(n_floats),
      own_(std::move(own)),
      ex_(ex ? ex : own_.get()),
      shape_(shape),
      mb_(microbatch_instances),
      plan_(n_instances),
      mb_plan_((n_instances + microbatch_instances - 1) / microbatch_instances),
      slot_floats_(n_floats),
      window_hi_(n_floats) {}

void GradientTree::use_windows(int64_t floats) {
  if (floats < 1 || floats > n_floats_) throw std::logic_error("GradientTree: window capacity out of range");
  if (floats != slot_floats_) release();
  slot_floats_ = floats;
  window_lo_ = 0, window_hi_ = 0;  // no leaf until the first window is set
}

void GradientTree::set_window(int64_t lo, int64_t hi) {
  if (lo < 0 || hi > n_floats_ || hi < lo || hi - lo > slot_floats_)
    throw std::logic_error("GradientTree: window [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           ") does not fit slots of " + std::to_string(slot_floats_) + " floats");
  window_lo_ = lo, window_hi_ = hi;
}

float* GradientTree::at(int slot, int64_t offset, int64_t n) {
  if (offset < window_lo_ || offset + n > window_hi_)
    throw std::logic_error("GradientTree: a leaf [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                           ") outside the unit whose backward runs [" + std::to_string(window_lo_) + ", " +
                           std::to_string(window_hi_) + ")");
  return slots_[static_cast<size_t>(slot)].data() + (offset - window_lo_);
}

void GradientTree::reset_emitting(int64_t first, int64_t last, EmitFn emit) {
  if (shape_ != TreeShape::balanced) throw std::logic_error("GradientTree: emission needs the balanced tree");
  reset();
  plan_ = TreePlan(n_instances_, first, last);
  emit_ = std::move(emit);
}

void GradientTree::reset() {
  emit_ = nullptr;
  plan_ = TreePlan(n_instances_);
  mb_plan_ = TreePlan((n_instances_ + mb_ - 1) / mb_);
  steps_.clear();
  count_ = 0;
}

void GradientTree::begin_microbatch(int64_t first, int64_t count) {
  if (count < 1 || first < 0 || first + count > n_instances_)
    throw std::logic_error("GradientTree: micro-batch outside the step's instances");
  steps_.assign(static_cast<size_t>(count), {});
  count_ = count;
  int needed = 0;
  if (shape_ == TreeShape::balanced) {
    for (int64_t b = 0; b < count; ++b) {
      steps_[static_cast<size_t>(b)] = plan_.feed_leaf(first + b);
      needed = std::max(needed, steps_[static_cast<size_t>(b)].slot + 1);
    }
  } else {
    // Negative control: a chain over the micro-batch's instances in slot p (instance b >= 1 written to
    // p + 1 and added into p), then the micro-batch node joins the tree over micro-batch index.
    if (first % mb_ != 0) throw std::logic_error("GradientTree: the micro-batch-chain control needs aligned micro-batches");
    const TreePlan::Step mstep = mb_plan_.feed_leaf(first / mb_);
    for (int64_t b = 0; b < count; ++b) {
      TreePlan::Step& s = steps_[static_cast<size_t>(b)];
      s.slot = mstep.slot + (b == 0 ? 0 : 1);
      if (b > 0) s.merges.push_back({mstep.slot, mstep.slot + 1});
      if (b == count - 1) s.merges.insert(s.merges.end(), mstep.merges.begin(), mstep.merges.end());
    }
    needed = mstep.slot + (count > 1 ? 2 : 1);
  }
  if (static_cast<int>(slots_.size()) < needed) slots_.resize(static_cast<size_t>(needed));
  for (int i = 0; i < needed; ++i)
    if (slots_[static_cast<size_t>(i)].size() != slot_floats_)
      slots_[static_cast<size_t>(i)].reset(*ex_, slot_floats_,
                                           "instance-tree slot " + std::to_string(i) +
                                               (slot_floats_ == n_floats_ ? " (a full gradient)" : " (one unit)"));
  peak_ = std::max(peak_, needed);
}

float* GradientTree::leaf(int64_t instance, int64_t offset, int64_t n) {
  return at(steps_[static_cast<size_t>(instance)].slot, offset, n);
}

void GradientTree::commit(int64_t instance, int64_t offset, int64_t n) {
  const TreePlan::Step& st = steps_[static_cast<size_t>(instance)];
  for (const TreePlan::Merge& m : st.merges) ex_->tree_add(at(m.dst, offset, n), at(m.src, offset, n), n);
  if (st.emit_slot >= 0) emit_(st.emit_index, at(st.emit_slot, offset, n), offset, n);
}

void GradientTree::release() { std::vector<Buffer<float>>().swap(slots_); }

}  // namespace olmoref
