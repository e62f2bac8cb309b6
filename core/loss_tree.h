// core/loss_tree.h — the step's loss totals from its instances' (docs/canonical/step.md): every field is added by
// the instance tree in fp64, the same tree as the gradient, so the loss bits do not depend on who computed which
// instance.
#pragma once

#include <cstdint>
#include <vector>

#include "core/op_types.h"

namespace olmoref {

// per_instance [n] (n >= 1, global instance order) -> the sums over [0, n): ce, z and the MoE auxiliary sums
// (moe_lb, moe_z: 0 for a dense model, whose sums then stay 0) each by the instance tree; n_targets is the plain
// sum of the instances' counts (integers: any order).
LossSums loss_tree_sums(const LossSums* per_instance, int64_t n);
inline LossSums loss_tree_sums(const std::vector<LossSums>& per_instance) {
  return loss_tree_sums(per_instance.data(), static_cast<int64_t>(per_instance.size()));
}

}  // namespace olmoref
