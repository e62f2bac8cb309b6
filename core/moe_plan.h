// core/moe_plan.h — the mixture-of-experts index work both executors and the distribution layer share: which
// slot goes where (the dispatch plan), the expert counts of a unit of rows, which experts an expert-parallel rank
// owns and how its received rows are reordered, and the routing digest (docs/canonical/moe.md).
//
// Shapes: R token rows of one micro-batch (instance-major: row = b·T + t), E experts, k choices per token
// (top_k). A "slot" is one (row r, choice j) pair, r·k + j.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace olmoref::moe {

// The dispatch order of a micro-batch: every slot sorted by (expert, row, j). Rows are instance-major, so the
// slots of one instance for one expert are contiguous, in token order (the weight-gradient leaves need that).
struct Plan {
  int64_t R = 0, k = 0, E = 0;
  std::vector<int64_t> expert_begin;  // [E + 1]: expert e's slots are positions [expert_begin[e], expert_begin[e+1])
  std::vector<int64_t> row_of;        // [R·k]: the token row of position p
  std::vector<int64_t> position;      // [R·k]: the position of slot r·k + j

  int64_t count(int64_t e) const { return expert_begin[static_cast<size_t>(e) + 1] - expert_begin[static_cast<size_t>(e)]; }
  // Positions of expert e whose rows lie in [row_begin, row_end): [first, last).
  std::pair<int64_t, int64_t> segment(int64_t e, int64_t row_begin, int64_t row_end) const;
};
Plan make_plan(const int32_t* top, int64_t R, int64_t k, int64_t E);

// The experts' load over rows [row_begin, row_end) of top [R, k]: c [E], the slots routed to each expert.
std::vector<int64_t> counts(const int32_t* top, int64_t row_begin, int64_t row_end, int64_t k, int64_t E);

// ---- Expert parallelism (docs/canonical/moe.md "Expert parallelism") ----
// The experts rank i of an EP group of n owns: [first, last), E split as evenly as possible, the first E mod n
// ranks one expert more. A rank's slots for those experts are one contiguous run of its plan's positions,
// [expert_begin[first], expert_begin[last]), so what it sends each owner is a plain slice of xg.
std::pair<int64_t, int64_t> ep_experts(int64_t E, int n, int i);

// An owner's received rows, width w, between two orders:
//   source-major: source 0's rows for experts first..last-1 (expert, then its row order), then source 1's, ...
//                 (what the all-to-all delivers and takes back);
//   expert-major: expert first's rows from source 0, source 1, ..., then expert first+1's ... (one GEMM per expert).
// counts [n_src, E]: the rows source s sent for expert e. Pure data movement: the bits of every row are kept.
void ep_to_expert_major(const float* source_major, const int64_t* counts, int n_src, int64_t E, int64_t first,
                        int64_t last, int64_t w, float* expert_major);
void ep_to_source_major(const float* expert_major, const int64_t* counts, int n_src, int64_t E, int64_t first,
                        int64_t last, int64_t w, float* source_major);

// A 64-bit digest of rows' expert choices (top [rows, k]), chained from `seed`: the routing fingerprint's leaf.
uint64_t routing_digest(const int32_t* top, int64_t rows, int64_t k, uint64_t seed);

}  // namespace olmoref::moe
