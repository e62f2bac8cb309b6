// model/idle_pass.cpp — the collectives of a pass without instances. A data-parallel rank with fewer micro-batches
// than others in its groups still joins every parameter gather (FSDP) and, under expert parallelism, every MoE
// layer's exchange, serving as an expert owner, so every communicator sees the same sequence of collectives on
// every rank (docs/canonical/moe.md "Lockstep"). The order is the walk's (Olmo3::walk_training_pass, the same as
// forward_backward's); these steps only make the exchanges.
#include "model/olmo3.h"

namespace olmoref {

// A block's exchanges with no rows of its own (all nullptr): it serves its experts to the ranks that send rows.
class Olmo3::IdleSteps final : public Olmo3::PassSteps {
 public:
  IdleSteps(Olmo3& model, const float* params) : PassSteps(false), m_(model), params_(params) {}
  // Forward, and backward's recompute of a recomputed block: the same exchange again.
  void block_forward(int64_t l) override {
    if (m_.ep_now_) m_.ep_forward(m_.reading(params_), block(l), l, nullptr, nullptr, nullptr, nullptr);
  }
  void block_backward(int64_t l) override {
    if (m_.ep_now_) m_.ep_backward(m_.reading(params_), block(l), l, nullptr, nullptr, nullptr, nullptr, nullptr);
  }

 private:
  const BlockOffsets& block(int64_t l) const { return m_.layout_.blocks[static_cast<size_t>(l)]; }
  Olmo3& m_;
  const float* params_;
};

void Olmo3::idle_pass(const float* params) {
  if (!gate_ && !sink_ && !(ep_ != nullptr && cfg_.moe.enabled())) return;  // no collective to join
  IdleSteps steps(*this, params);
  walk_training_pass(steps);
}

}  // namespace olmoref
