// train/batch_source.h — where the trainer's global batches come from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"

namespace olmoref::data {
struct Mix;
struct HoldoutSpec;
struct DatasetOptions;
struct LoaderConfig;
}  // namespace olmoref::data

namespace olmoref {

// How the config's [data] section becomes the loader's inputs (train/batch_source.cpp). The
// trainer and `olmoref leakcheck` both build their loaders through loader_config(), so the detector
// checks the stream the trainer gets.
data::Mix train_mix(const DataConfig& d);
data::HoldoutSpec holdout_spec(const DataConfig& d);
data::DatasetOptions dataset_options(const TrainConfig& cfg);
// Dataset, seed, batch shape and holdout; the caller sets world_size, rank and audit.
data::LoaderConfig loader_config(const TrainConfig& cfg);

// Evaluation data is never trained on: a holdout entry (data.holdout_files / data.holdout_mix) or, with [eval] on,
// a fresh-split entry (eval.fresh_files / eval.fresh_mix) that is also a training file, by path or by content
// (data::shared_files), is refused with an std::invalid_argument naming the config file, both entries and their
// keys. `olmoref train` runs it before anything else and make_batch_source() again, so every run, resume-check and
// golden export gets it; `olmoref leakcheck` builds its loader through loader_config() without it, because
// examining such a config is its job: it reports the same files as contamination (check shared_files).
void check_evaluation_data_separate(const TrainConfig& cfg);

// The training data must hold at least one global batch: refused (std::invalid_argument naming the config file,
// train.global_batch_instances, the data's instance count and the fixes) before anything that grows with the global
// batch is built or modelled. Opens the token files only (their sizes give the instance count).
void check_global_batch_fits_data(const TrainConfig& cfg);

struct StepBatch {
  int64_t epoch = 1;
  std::vector<int64_t> instance_ids;  // global instance ids, in global batch order
  std::vector<uint32_t> tokens;       // [global_batch_instances, seq_len]
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual StepBatch next() = 0;
  virtual std::string describe() const = 0;
  // Position in the stream, for checkpoints; restore() continues exactly where state() was taken.
  virtual nlohmann::json state() const = 0;
  virtual void restore(const nlohmann::json& state, bool ignore_fingerprint_mismatch) = 0;
  // Identifies the data (files, sizes, dtype, sequence length); a resume on other data is refused.
  virtual std::string fingerprint() const = 0;
  // Global batches in one epoch of the data loader; 0 for a source that is not the loader (its position cannot be
  // recorded in a checkpoint's data_history).
  virtual int64_t batches_per_epoch() const { return 0; }
  virtual void flush_audit() {}
};

// The OLMo-core-compatible loader over the config's training data. With an audit path, one record per
// instance of every micro-batch goes there (data/audit.h); append continues an existing log (resume).
// world/rank: which rank's micro-batches the audit log records (rank -1: all of them).
std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& cfg, const std::string& audit_path = "",
                                               bool audit_append = false, int world = 1, int rank = -1);

// Batches fixed in advance (parity-dump's synthetic tokens, golden export's recomputed batches): the trainer gets
// exactly the tokens another implementation is handed.
class FixedBatchSource : public BatchSource {
 public:
  explicit FixedBatchSource(std::vector<StepBatch> batches, std::string fingerprint = "fixed")
      : batches_(std::move(batches)), fingerprint_(std::move(fingerprint)) {}
  StepBatch next() override { return batches_.at(next_++); }
  std::string describe() const override { return "fixed batches"; }
  nlohmann::json state() const override { return {{"next", next_}}; }
  void restore(const nlohmann::json& s, bool) override { next_ = s.at("next").get<size_t>(); }
  std::string fingerprint() const override { return fingerprint_; }

 private:
  std::vector<StepBatch> batches_;
  std::string fingerprint_;
  size_t next_ = 0;
};

}  // namespace olmoref
