#include "core/loss_tree.h"

#include <stdexcept>

#include "core/instance_tree.h"

namespace olmoref {

LossSums loss_tree_sums(const LossSums* per_instance, int64_t count) {
  const size_t n = static_cast<size_t>(count);
  if (count <= 0) throw std::logic_error("loss_tree_sums: a step has at least one instance");
  // tree_sum_range reads one field as an array: the fields are split out once.
  std::vector<double> ce(n), z(n), lb(n), rz(n);
  LossSums sums;
  for (size_t i = 0; i < n; ++i) {
    const LossSums& p = per_instance[i];
    ce[i] = p.ce, z[i] = p.z, lb[i] = p.moe_lb, rz[i] = p.moe_z;
    sums.n_targets += p.n_targets;
  }
  const int64_t N = static_cast<int64_t>(n);
  sums.ce = tree_sum_range(ce.data(), 0, N);
  sums.z = tree_sum_range(z.data(), 0, N);
  sums.moe_lb = tree_sum_range(lb.data(), 0, N);
  sums.moe_z = tree_sum_range(rz.data(), 0, N);
  return sums;
}

}  // namespace olmoref
