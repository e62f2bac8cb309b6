// dist/state_pieces.h — one rank's part of the flat state vectors (parameters, AdamW moments) and the collective
// that brings any ranges of them to the ranks that need them: a rank's moments cover only its optimizer range (the
// distributed optimizer, dist/layout.h), and under expert-resident state a rank holds only the experts its
// replicate group runs, so the ranks that hash a digest chunk or write a checkpoint shard receive the pieces they
// lack (docs/canonical/moe.md, "Expert-resident state").
#pragma once

#include <cstdint>
#include <vector>

#include "core/executor.h"
#include "dist/comm.h"
#include "dist/expert_placement.h"
#include "dist/layout.h"

namespace olmoref::dist {

// Who holds what of the state vectors, and the communicators that move it. Borrowed references.
struct ShardedState {
  Executor& ex;                      // where the state buffers live
  const Layout& layout;              // each rank's range [lo, hi)
  const StatePlacement& placement;   // which parts of its range a rank holds
  Comm& world;
};

// Which range of the flat vector a rank's buffer of one state vector is indexed by: the parameters cover the
// shard's range (FSDP gathers units from it), the reduced gradient and AdamW's moments the optimizer range.
enum class Span { shard, optimizer };
int64_t span_begin(const Layout& layout, Span span, int rank);
int64_t span_end(const Layout& layout, Span span, int rank);
// Does every rank's buffer of this span hold its whole shard range (so no rank needs pieces to write or hash it)?
bool holds_whole_shards(const ShardedState& s, Span span);

// b on the host: b itself for host-memory executors, else its copy in `staging`.
const float* host_view(const Buffer<float>& b, const Executor& ex, std::vector<float>& staging);
std::vector<float> host_copy(const Buffer<float>& b);

// Collective over the world: rank q receives, on the host, `want[q]` (ranges inside its shard's range) of `state`
// (this rank's buffer of `span`, in executor memory), concatenated in order; what q does not hold comes from the
// replica whose optimizer range holds it (Span::optimizer) or from StatePlacement::source. Adds the bytes this rank
// sent to pieces_sent.
std::vector<float> collect_pieces(const ShardedState& s, const Buffer<float>& state, Span span,
                                  const std::vector<Ranges>& want, uint64_t& pieces_sent);

}  // namespace olmoref::dist
