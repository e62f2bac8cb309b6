// data/loader.h — global batches in OLMo-core's order, resumable, audited.
//
// Global batch b of epoch e holds the instances of row b of OLMo-core's global order
// (shuffle.h: PCG64(seed + e), cropped to whole batches), in row order, so a PyTorch/OLMo-core run
// over the same mix and seed sees exactly the same tokens at every step.
//
// Micro-batches and ranks. The global batch of G instances is cut into M = ceil(G/mb) micro-batches:
// micro-batch m is instances [m*mb, min((m+1)*mb, G)) of the row (contiguous). With W data-parallel
// ranks, rank r computes a contiguous run of micro-batches (the first M%W ranks one more;
// core/instance_tree.h). OLMo-core instead gives rank r the strided instances row[r::W]; the *set* of
// instances per step is identical, only who computes which differs, and the instance tree of the
// gradient (docs/canonical/step.md) makes that assignment irrelevant to the result.
//
// Epochs. When an epoch's batches are used up, next_batch() moves to epoch+1 and reshuffles with
// seed + epoch + 1; batches_processed restarts at 0. Steps are numbered 1.. across epochs like
// OLMo-core's global_step.
//
// Resume. state() is what a checkpoint stores; restore() on a fresh loader continues the exact
// stream (mid-epoch or at an epoch boundary). As in OLMo-core, the seed stored in the state wins
// over the configured one, and a different dataset fingerprint is refused unless overridden.
//
// Audit. With an AuditLog configured, next_batch() writes one record per instance of every
// micro-batch that `rank` computes (all of them when rank = -1), with the rank from the layout
// above. Each rank process writes its own file; the union over ranks is the global batch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/audit.h"
#include "data/dataset.h"
#include "data/holdout.h"
#include "data/planted_bugs.h"
#include "data/shuffle.h"

namespace olmoref::data {

struct LoaderConfig {
  std::shared_ptr<const FslDataset> dataset;
  uint64_t seed = kOlmoCoreDefaultSeed;
  int64_t global_batch_instances = 0;  // OLMo-core global_batch_size / sequence_length
  int64_t microbatch_instances = 0;    // instances per micro-batch (the last of a step may be shorter)
  int world_size = 1;                  // data-parallel ranks: micro-batch m on rank m mod W (M >= W)
  int rank = -1;                       // which rank's micro-batches to audit; -1 = all
  std::shared_ptr<AuditLog> audit;     // optional
  // Intra-document masking's EOS (data.document_masking): the audit log records each instance's document lengths.
  std::optional<uint32_t> document_eos;
  HoldoutSpec holdout;                 // reported, and opened by holdout_dataset()
  // After delivering batch b, ask the kernel to start reading batch b+1 (madvise WILLNEED), so
  // its disk reads overlap the training step. About 3x faster from a cold page cache; costs one
  // syscall per instance when everything is cached already.
  bool prefetch = true;
  // TEST-ONLY: make this loader misbehave in one of the known ways (data/planted_bugs.h), so the
  // leakage detector can be shown to catch it. Leave at none.
  PlantedBug debug_bug = PlantedBug::none;
};

struct LoaderState {
  int64_t epoch = 1;              // 1-based, as OLMo-core
  int64_t batches_processed = 0;  // within `epoch`
  uint64_t seed = kOlmoCoreDefaultSeed;
  std::string fingerprint;        // FslDataset::fingerprint()
  // Beyond OLMo-core's fields: what must also match for batches_processed to mean the same rows.
  int64_t global_batch_instances = 0;
  int64_t sequence_length = 0;
  int64_t tokens_processed = 0;   // in this epoch (OLMo-core's field; informational here)

  bool operator==(const LoaderState&) const = default;
};
void to_json(nlohmann::json& j, const LoaderState& s);
void from_json(const nlohmann::json& j, LoaderState& s);  // throws on missing fields / wrong format

// The state that continues `s` in global batches of `global_batch_instances`, by OLMo-core's rule for a changed
// batch size (NumpyFSLDataLoader.load_state_dict): batches_processed = tokens_processed // (G' · L) within the
// epoch, over the same order of instances (only its cut into batches changes). When the new batches do not divide
// the tokens already seen, the position rounds down and those instances are trained again; never skipped.
LoaderState rebatched_state(const LoaderState& s, int64_t global_batch_instances);

struct GlobalBatch {
  int64_t step = 0;            // 1-based, across epochs: (epoch-1) * batches_per_epoch + batch + 1
  int64_t epoch = 0;           // 1-based
  int64_t batch = 0;           // row of the epoch's global order, 0-based
  int64_t sequence_length = 0;
  int64_t microbatch_instances = 0;
  std::vector<int64_t> instance_ids;  // [G], OLMo-core row order
  std::vector<uint32_t> tokens;       // [G * sequence_length], same order

  int64_t n_instances() const { return static_cast<int64_t>(instance_ids.size()); }
  // ceil(G / mb): the last micro-batch holds the remainder when mb does not divide G.
  int64_t n_microbatches() const { return (n_instances() + microbatch_instances - 1) / microbatch_instances; }
  int64_t microbatch_size(int64_t m) const;
  std::span<const int64_t> microbatch_ids(int64_t m) const;
  std::span<const uint32_t> microbatch_tokens(int64_t m) const;  // [microbatch_size(m) * sequence_length]
};

class Loader {
 public:
  explicit Loader(LoaderConfig config);

  GlobalBatch next_batch();
  void next_batch(GlobalBatch& out);  // reuses out's buffers

  LoaderState state() const;
  // Continue from a checkpointed state. Throws (naming both fingerprints and the fix) if the
  // dataset differs, unless ignore_fingerprint_mismatch; throws if the global batch or sequence
  // length differ (batches_processed would then address other rows).
  void restore(const LoaderState& state, bool ignore_fingerprint_mismatch = false);

  int64_t epoch() const { return epoch_; }
  int64_t batches_processed() const { return batches_processed_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  uint64_t seed() const { return seed_; }
  const FslDataset& dataset() const { return *config_.dataset; }
  const LoaderConfig& config() const { return config_; }
  const GlobalOrder& order() const { return *order_; }

  HoldoutKind holdout_kind() const { return config_.holdout.kind; }
  const HoldoutSpec& holdout() const { return config_.holdout; }
  // The holdout as a dataset with this loader's sequence length/vocab/dtype (eval reads it in
  // instance order, unshuffled). Throws if holdout_kind() is none.
  std::shared_ptr<const FslDataset> holdout_dataset() const;

  // Micro-batch <-> rank layout (micro-batch m on rank m mod W); see the header comment.
  static int rank_of_microbatch(int64_t microbatch, int64_t n_microbatches, int world_size);
  static std::vector<int64_t> microbatches_of_rank(int rank, int64_t n_microbatches, int world_size);

  // Writes the audit records of `batch` (what next_batch does when an audit log is configured).
  void write_audit(const GlobalBatch& batch, AuditLog& log, int rank) const;

 private:
  void ensure_order();
  void prefetch_row(int64_t batch);

  LoaderConfig config_;
  uint64_t seed_;
  int64_t epoch_ = 1;
  int64_t batches_processed_ = 0;
  int64_t batches_per_epoch_ = 0;
  std::unique_ptr<GlobalOrder> order_;  // for (seed_, epoch_); rebuilt lazily when either changes
  int64_t prefetched_epoch_ = -1, prefetched_batch_ = -1;  // the row already announced, if any
  friend struct PlantedBugHooks;  // TEST-ONLY switches (data/planted_bugs.h)
  PlantedBugState debug_;
};

}  // namespace olmoref::data
