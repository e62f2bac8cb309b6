#include "train/batch_source.h"

#include <cstdio>
#include <stdexcept>

#include "data/audit.h"
#include "data/dataset.h"
#include "data/holdout.h"
#include "data/loader.h"
#include "data/mix.h"

namespace olmoref {

data::MixResolve mix_resolve(const DataConfig& d) { return {d.mix_base_dir, d.mix_tokenizer}; }

data::Mix train_mix(const DataConfig& d) {
  if (!d.train_mix.empty()) return data::Mix::parse_file(d.train_mix, mix_resolve(d));
  if (d.train_files.empty())
    throw std::invalid_argument("config key 'data.train_files': no training data given (set data.train_files or data.train_mix)");
  return data::Mix::from_paths(d.train_files);
}

data::HoldoutSpec holdout_spec(const DataConfig& d) {
  if (!d.holdout_mix.empty()) return data::HoldoutSpec::separate(data::Mix::parse_file(d.holdout_mix, mix_resolve(d)));
  if (!d.holdout_files.empty()) return data::HoldoutSpec::separate(data::Mix::from_paths(d.holdout_files));
  return {};
}

data::DatasetOptions dataset_options(const TrainConfig& cfg) {
  data::DatasetOptions o;
  o.sequence_length = cfg.train.seq_len;
  o.vocab_size = cfg.model.vocab_size;
  if (cfg.data.dtype != "auto") o.dtype = data::parse_dtype(cfg.data.dtype);
  if (cfg.data.eos_id >= 0) o.eos_id = static_cast<uint32_t>(cfg.data.eos_id);
  o.max_target_sequence_length = cfg.data.max_target_sequence_length;
  return o;
}

namespace {

// train_mix, with the config file named when the config gives no training data.
data::Mix train_mix_named(const TrainConfig& cfg) {
  try {
    return train_mix(cfg.data);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(cfg.in_file(e.what()));
  }
}

// An entry as the user wrote it: its config key and position, or its mix file and line.
std::string entry_name(const data::Mix& m, size_t i, const std::string& files_key, const std::string& mix_key) {
  const data::MixEntry& e = m.entries[i];
  if (e.line > 0) return mix_key + " (" + m.source + " line " + std::to_string(e.line) + ": '" + e.path + "')";
  return files_key + " entry " + std::to_string(i + 1) + " ('" + e.path + "')";
}

}  // namespace

void check_evaluation_data_separate(const TrainConfig& cfg) {
  const DataConfig& d = cfg.data;
  struct Side {
    std::string files_key, mix_key, what;
    data::Mix mix;
  };
  std::vector<Side> sides;
  if (!d.holdout_mix.empty() || !d.holdout_files.empty())
    sides.push_back({"data.holdout_files", "data.holdout_mix", "the holdout", holdout_spec(d).mix});
  // The fresh split is read only while [eval] is on (a config may keep eval.fresh_mix with eval.interval = 0 and the
  // files absent); parsed as train/eval.cpp parses it (no OLMo-core base directory).
  if (cfg.eval.interval > 0 && !cfg.eval.fresh_mix.empty())
    sides.push_back({"eval.fresh_files", "eval.fresh_mix", "the fresh split", data::Mix::parse_file(cfg.eval.fresh_mix)});
  else if (cfg.eval.interval > 0 && !cfg.eval.fresh_files.empty())
    sides.push_back({"eval.fresh_files", "eval.fresh_mix", "the fresh split", data::Mix::from_paths(cfg.eval.fresh_files)});
  if (sides.empty()) return;
  const data::Mix train = train_mix_named(cfg);
  for (const Side& s : sides) {
    const std::vector<data::SharedFile> shared = data::shared_files(train, s.mix);
    if (shared.empty()) continue;
    const data::SharedFile& f = shared.front();
    char digest[24];
    std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(f.xxh3));
    const std::string how = f.same_path ? "is the same file (" + f.canonical + ")"
                                        : "holds the same bytes (" + std::to_string(f.bytes) + " bytes, XXH3 " + digest +
                                              "): a copy under another name";
    std::string msg = entry_name(s.mix, f.b, s.files_key, s.mix_key) + " is also training data: " +
                      entry_name(train, f.a, "data.train_files", "data.train_mix") + " " + how + ". Training on " +
                      s.what + " contaminates every evaluation on it; remove it from the training data or from " + s.what;
    if (shared.size() > 1) msg += " (and " + std::to_string(shared.size() - 1) + " more file(s) both sides hold)";
    msg += ". `olmoref leakcheck --config " + (cfg.source_path.empty() ? std::string("FILE") : cfg.source_path) +
           "` reports what a run on both would deliver";
    throw std::invalid_argument(cfg.in_file(msg));
  }
}

void check_global_batch_fits_data(const TrainConfig& cfg) {
  const data::Mix mix = train_mix_named(cfg);
  const data::FslDataset ds(mix, dataset_options(cfg));
  // The loader orders whole chunks (data.max_target_sequence_length), so a batch is cut from those alone.
  const int64_t usable = ds.size() / ds.chunk_instances() * ds.chunk_instances(), G = cfg.train.global_batch_instances;
  if (G <= usable) return;
  throw std::invalid_argument(cfg.in_file(
      "train.global_batch_instances = " + std::to_string(G) + " is more than the training data holds: " +
      (mix.source.empty() || mix.source == "<list>" ? "the " + std::to_string(mix.size()) + " file(s) of data.train_files"
                                                     : "data.train_mix '" + mix.source + "'") +
      " give " +
      std::to_string(usable) + " instances of seq_len " + std::to_string(cfg.train.seq_len) +
      ", fewer than one global batch. Lower train.global_batch_instances to at most " + std::to_string(usable) +
      ", add data, or shorten train.seq_len"));
}

data::LoaderConfig loader_config(const TrainConfig& cfg) {
  data::LoaderConfig lc;
  lc.dataset = std::make_shared<data::FslDataset>(train_mix_named(cfg), dataset_options(cfg));
  lc.seed = cfg.data.seed;
  lc.global_batch_instances = cfg.train.global_batch_instances;
  lc.microbatch_instances = cfg.train.micro_batch_instances;
  lc.holdout = holdout_spec(cfg.data);
  if (cfg.data.document_masking) lc.document_eos = static_cast<uint32_t>(cfg.data.eos_id);
  return lc;
}

namespace {

// The OLMo-core-compatible loader (data/loader.h): global batch b of epoch e is row b of
// PCG64(seed + e)'s shuffle of the instances, cut into the run's canonical micro-batches.
class LoaderSource : public BatchSource {
 public:
  LoaderSource(const TrainConfig& cfg, const std::string& audit_path, bool audit_append, int world, int rank) {
    check_evaluation_data_separate(cfg);
    data::LoaderConfig lc = loader_config(cfg);  // shared with `olmoref leakcheck`
    lc.world_size = world;
    lc.rank = world == 1 ? -1 : rank;
    if (!audit_path.empty())
      lc.audit = std::make_shared<data::AuditLog>(audit_path, audit_append ? data::AuditLog::Mode::append
                                                                           : data::AuditLog::Mode::truncate);
    loader_ = std::make_unique<data::Loader>(std::move(lc));
  }

  StepBatch next() override {
    loader_->next_batch(batch_);
    StepBatch b;
    b.epoch = batch_.epoch;
    b.instance_ids = batch_.instance_ids;
    b.tokens = batch_.tokens;
    return b;
  }
  nlohmann::json state() const override { return loader_->state(); }
  void restore(const nlohmann::json& s, bool ignore_fingerprint_mismatch) override {
    loader_->restore(s.get<data::LoaderState>(), ignore_fingerprint_mismatch);
  }
  std::string fingerprint() const override { return loader_->dataset().fingerprint(); }
  int64_t batches_per_epoch() const override { return loader_->batches_per_epoch(); }
  std::string describe() const override {
    const auto& ds = loader_->dataset();
    return std::to_string(ds.n_files()) + " file(s), " + std::to_string(ds.size()) + " instances, " +
           std::to_string(loader_->batches_per_epoch()) + " batches/epoch, seed " + std::to_string(loader_->seed()) +
           ", holdout " + loader_->holdout().describe();
  }
  void flush_audit() override {
    if (loader_->config().audit) loader_->config().audit->flush();
  }

 private:
  std::unique_ptr<data::Loader> loader_;
  data::GlobalBatch batch_;
};

}  // namespace

std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& cfg, const std::string& audit_path, bool audit_append,
                                               int world, int rank) {
  return std::make_unique<LoaderSource>(cfg, audit_path, audit_append, world, rank);
}

}  // namespace olmoref
