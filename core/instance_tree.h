// core/instance_tree.h — the canonical tree over the instances of a step (docs/canonical/step.md).
//
// The leaf of every token-axis reduction is one instance; the N instance contributions of a step are
// combined by ONE fixed balanced binary tree over the global instance index 0..N-1:
//     node [lo, hi) with hi - lo >= 2 has children [lo, mid) and [mid, hi), mid = lo + ceil((hi - lo) / 2),
//     value(node) = value(left) + value(right)    (elementwise fp32 add, left operand first)
// Micro-batches and ranks only decide who evaluates which nodes. This header holds the integer side of
// that: the tree's shape, the decomposition of a contiguous range into its maximal whole subtrees, and
// a left-to-right evaluation plan that uses a stack of at most ceil(log2 N) + 1 partial values. The
// float side (which buffers the plan's slots are) belongs to the caller, so the CPU and CUDA executors
// and the cross-rank exchange run the very same plan.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace olmoref {

struct TreeNode {
  int64_t lo = 0, hi = 0;  // the instances [lo, hi)
  bool operator==(const TreeNode&) const = default;
};

inline int64_t tree_mid(int64_t lo, int64_t hi) { return lo + (hi - lo + 1) / 2; }

// ceil(log2 n): the depth of the tree over n leaves (0 for one leaf).
inline int tree_depth(int64_t n) {
  int d = 0;
  while ((int64_t{1} << d) < n) ++d;
  return d;
}

// How a step's instances are combined. `balanced` is the canonical order. `microbatch_chain` is a
// TEST-ONLY negative control: the old order (each micro-batch a left-to-right chain of its instances,
// micro-batches combined by the balanced tree over micro-batch index), which depends on the micro-batch
// size and must therefore break the T6 tests.
enum class TreeShape { balanced, microbatch_chain };

// Is [lo, hi) a node of the tree over [0, n)?
inline bool is_tree_node(int64_t n, int64_t lo, int64_t hi) {
  int64_t a = 0, b = n;
  while (true) {
    if (a == lo && b == hi) return true;
    if (b - a < 2 || lo < a || hi > b) return false;
    const int64_t m = tree_mid(a, b);
    if (hi <= m) b = m;
    else if (lo >= m) a = m;
    else return false;
  }
}

// The maximal whole subtrees of the tree over [0, n) inside [lo, hi), left to right. They partition the
// range; an aligned range (itself a node) gives one node, any range at most 2·ceil(log2 n).
inline std::vector<TreeNode> maximal_subtrees(int64_t n, int64_t lo, int64_t hi) {
  std::vector<TreeNode> out;
  struct Frame { int64_t a, b; };
  std::vector<Frame> todo{{0, n}};
  while (!todo.empty()) {  // depth-first, left child first
    const Frame f = todo.back();
    todo.pop_back();
    if (f.b <= lo || f.a >= hi) continue;
    if (lo <= f.a && f.b <= hi) {
      out.push_back({f.a, f.b});
      continue;
    }
    const int64_t m = tree_mid(f.a, f.b);
    todo.push_back({m, f.b});
    todo.push_back({f.a, m});
  }
  return out;
}

// The parent of node [lo, hi) (not the root) in the tree over [0, n).
inline TreeNode tree_parent(int64_t n, TreeNode node) {
  int64_t a = 0, b = n;
  while (true) {
    const int64_t m = tree_mid(a, b);
    if ((node.lo == a && node.hi == m) || (node.lo == m && node.hi == b)) return {a, b};
    if (node.hi <= m) b = m;
    else a = m;
  }
}

// Left-to-right evaluation of the tree with a stack. Nodes are fed in index order, each starting where
// the previous one ended (leaves, or whole subtrees computed elsewhere); a fed node goes to the first free
// slot, and whenever the two top slots are the two children of one node they are added into the lower
// slot (slot[dst] = slot[dst] + slot[src]) and the upper one is freed. After the last node of a range
// the slots hold exactly that range's maximal subtrees, in order; after [0, n) slot 0 holds the root.
class TreePlan {
 public:
  struct Merge { int dst, src; };
  struct Step {
    int slot = 0;               // where the fed node's value must be written
    std::vector<Merge> merges;  // then these adds, in order
    // Emitting plans: after the adds, the value in slot `emit_slot` is output `emit_index` (a finished maximal
    // subtree of the range) and that slot is free again. -1: nothing emitted.
    int emit_slot = -1, emit_index = -1;
  };

  explicit TreePlan(int64_t n) : n_(n), r0_(0), r1_(n) {
    if (n < 1) throw std::invalid_argument("the instance tree needs at least one instance");
  }
  // A plan for one rank's range [r0, r1) that emits each maximal subtree of the range the moment it is
  // complete (it can never be added to within this rank), so the stack holds only pending nodes: at most
  // ceil(log2 N) + 1 slots whatever the range. emitted() lists the outputs in order.
  TreePlan(int64_t n, int64_t r0, int64_t r1) : TreePlan(n) {
    r0_ = r0;
    r1_ = r1;
    emitting_ = true;
  }
  const std::vector<TreeNode>& emitted() const { return emitted_; }
  int64_t size() const { return n_; }
  const std::vector<TreeNode>& stack() const { return stack_; }
  int peak_slots() const { return peak_; }
  // Bound on peak_slots() when feeding starts at instance 0, or for an emitting plan: one pending left
  // sibling per level plus the new node. A non-emitting plan over a range that starts inside a subtree also
  // keeps its finished boundary subtrees, at most ceil(log2 N) - 1 more.
  int max_slots() const { return tree_depth(n_) + 1; }

  Step feed(TreeNode node) {
    if (node.hi <= node.lo || !is_tree_node(n_, node.lo, node.hi))
      throw std::logic_error("instance tree: [" + std::to_string(node.lo) + ", " + std::to_string(node.hi) +
                             ") is not a node of the tree over " + std::to_string(n_) + " instances");
    if (fed_ && node.lo != next_) throw std::logic_error("instance tree: nodes must be fed in order without gaps");
    fed_ = true;
    next_ = node.hi;
    Step s;
    s.slot = static_cast<int>(stack_.size());
    stack_.push_back(node);
    peak_ = std::max(peak_, static_cast<int>(stack_.size()));
    while (stack_.size() >= 2) {
      const TreeNode right = stack_.back(), left = stack_[stack_.size() - 2];
      if (!is_tree_node(n_, left.lo, right.hi) || tree_mid(left.lo, right.hi) != left.hi) break;
      stack_.pop_back();
      stack_.back() = {left.lo, right.hi};
      s.merges.push_back({static_cast<int>(stack_.size()) - 1, static_cast<int>(stack_.size())});
    }
    if (emitting_) {
      const TreeNode top = stack_.back();
      const bool root = top.lo == 0 && top.hi == n_;
      const TreeNode parent = root ? top : tree_parent(n_, top);
      if (root || parent.lo < r0_ || parent.hi > r1_) {
        s.emit_slot = static_cast<int>(stack_.size()) - 1;
        s.emit_index = static_cast<int>(emitted_.size());
        emitted_.push_back(top);
        stack_.pop_back();
      }
    }
    return s;
  }
  Step feed_leaf(int64_t i) { return feed({i, i + 1}); }

 private:
  int64_t n_, r0_, r1_;
  bool emitting_ = false, fed_ = false;
  int64_t next_ = 0;
  std::vector<TreeNode> stack_, emitted_;
  int peak_ = 0;
};

// The same tree on scalars held in an array (per-instance fp64 loss totals): value(node) by recursion.
template <typename T>
T tree_sum_range(const T* x, int64_t lo, int64_t hi) {
  if (hi - lo == 1) return x[lo];
  const int64_t m = tree_mid(lo, hi);
  return tree_sum_range(x, lo, m) + tree_sum_range(x, m, hi);
}

// Micro-batch m of M runs on rank m mod W, in round m / W: in every round the ranks hold consecutive micro-batches,
// so the owners of the gradient (dist/gradient_owners.h) receive consecutive nodes of the tree and need no more
// slots than one process does. Rank r's micro-batches are r, r + W, r + 2W, ... (needs M >= W).
inline int rank_of_microbatch(int64_t m, int64_t /*M*/, int W) { return static_cast<int>(m % W); }
inline std::vector<int64_t> microbatches_of_rank(int r, int64_t M, int W) {
  std::vector<int64_t> out;
  for (int64_t m = r; m < M; m += W) out.push_back(m);
  return out;
}

// Which instances each micro-batch and each rank of a step holds. Micro-batch m is instances
// [m·mb, min((m+1)·mb, G)) (the last one may be shorter); rank r holds micro-batches r, r + W, ... (round t is
// micro-batches [t·W, (t+1)·W)), so any G, mb and W with M >= W are allowed and only change who computes which
// nodes of the tree.
//
// Context parallelism (cp > 1): the W ranks form W / cp groups of cp consecutive ranks, and micro-batch m runs on
// group m mod (W / cp), each rank of it computing a part of every instance's positions. The group's last rank ends
// every chain over positions (model/olmo3.h ContextExchange), so it alone holds the micro-batch's leaves and loss
// totals: to the instance tree it is the rank of the micro-batch, and the group's other ranks have none.
struct BatchSplit {
  int64_t global_instances = 0, microbatch_instances = 0;
  int world = 1;
  int cp = 1;

  int groups() const { return world / cp; }
  int64_t n_microbatches() const { return (global_instances + microbatch_instances - 1) / microbatch_instances; }
  // Every rank makes this many forward/backward passes; in the last round ranks past the last micro-batch join
  // without instances (Olmo3::idle_pass).
  int64_t n_rounds() const { return (n_microbatches() + groups() - 1) / groups(); }
  std::pair<int64_t, int64_t> instances_of_microbatch(int64_t m) const {
    return {m * microbatch_instances, std::min(global_instances, (m + 1) * microbatch_instances)};
  }
  // The micro-batch rank r computes (a part of, under context parallelism) in round t, or -1 when it has none there.
  int64_t group_microbatch_of(int r, int64_t round) const {
    const int64_t m = round * groups() + r / cp;
    return m < n_microbatches() ? m : -1;
  }
  // True when rank r holds its group's micro-batches (always without context parallelism).
  bool holds_microbatches(int r) const { return r % cp == cp - 1; }
  // Rank r's micro-batch in round t, or -1 when it holds none there.
  int64_t microbatch_of(int r, int64_t round) const {
    return holds_microbatches(r) ? group_microbatch_of(r, round) : -1;
  }
  std::vector<int64_t> microbatches_of_rank(int r) const {
    if (!holds_microbatches(r)) return {};
    return olmoref::microbatches_of_rank(r / cp, n_microbatches(), groups());
  }
  // Rank r's instances in the order it computes them (its micro-batches' instances, micro-batch by micro-batch).
  std::vector<int64_t> instances_of_rank(int r) const {
    std::vector<int64_t> out;
    for (const int64_t m : microbatches_of_rank(r))
      for (auto [a, b] = instances_of_microbatch(m); a < b; ++a) out.push_back(a);
    return out;
  }
  int rank_of_microbatch(int64_t m) const {
    return olmoref::rank_of_microbatch(m, n_microbatches(), groups()) * cp + cp - 1;
  }
  // Throws, saying what to change, when some rank would get no micro-batch.
  void validate() const {
    if (global_instances < 1 || microbatch_instances < 1)
      throw std::invalid_argument("train.global_batch_instances and train.micro_batch_instances must be >= 1");
    if (cp < 1 || world % cp != 0)
      throw std::invalid_argument("train.cp_degree = " + std::to_string(cp) + " does not divide the " +
                                  std::to_string(world) + " ranks: context-parallel groups are cp_degree consecutive "
                                  "ranks, so choose a cp_degree that divides the world size (dp_shard x dp_replicate)");
    if (n_microbatches() < groups())
      throw std::invalid_argument(
          "the step's " + std::to_string(global_instances) + " instances make " + std::to_string(n_microbatches()) +
          " micro-batch(es) of train.micro_batch_instances = " + std::to_string(microbatch_instances) + ", fewer than the " +
          std::to_string(groups()) + (cp > 1 ? " context-parallel groups" : " ranks") +
          " (every one needs at least one): set train.micro_batch_instances <= " +
          std::to_string(std::max<int64_t>(1, global_instances / groups())) + " or start at most " +
          std::to_string(n_microbatches() * cp) + " ranks");
  }
};

}  // namespace olmoref
