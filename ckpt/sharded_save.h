// ckpt/sharded_save.h — one checkpoint of a run whose state is split over ranks (docs/formats/checkpoint.md):
// every rank writes its file in parallel (the moments of its optimizer range; replicate group 0 also the parameters
// of its shard), frame by frame from the live state, then rank 0 gathers what each wrote, writes the manifest with
// the whole-state digests and renames the directory. Collective over the world.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/executor.h"
#include "dist/state_pieces.h"
#include "golden/state_digest.h"

namespace olmoref::ckpt {

// This rank's buffers of the state vectors, in executor memory: the parameters on its shard's range, the moments
// on its optimizer range (dist::Span).
struct ShardBuffers {
  const Buffer<float>& params;
  const Buffer<float>& adam_m;
  const Buffer<float>& adam_v;
};

// Writes <root>/stepNNNNNNNN (meta.step) and returns its path. `digest` hashes the whole vectors for the
// manifest; the bytes of state pieces sent to the writers and hashers (moments split over replicas,
// expert-resident state) are added to pieces_sent.
std::string save_sharded(const std::string& root, const CheckpointMeta& meta, const std::vector<Segment>& segments,
                         const SaveOptions& opts, const dist::ShardedState& state, const ShardBuffers& buffers,
                         StateDigest& digest, uint64_t& pieces_sent);

}  // namespace olmoref::ckpt
