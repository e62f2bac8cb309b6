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

}  // namespace olmoref
