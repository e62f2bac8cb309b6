#include "data/loader.h"

#include "core/documents.h"
#include "core/instance_tree.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

namespace olmoref::data {

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"format", "olmoref-loader-state-v1"},
                     {"epoch", s.epoch},
                     {"batches_processed", s.batches_processed},
                     {"seed", s.seed},
                     {"fingerprint", s.fingerprint},
                     {"global_batch_instances", s.global_batch_instances},
                     {"sequence_length", s.sequence_length},
                     {"tokens_processed", s.tokens_processed},
                     {"dataset_type", "fsl"}};
}

void from_json(const nlohmann::json& j, LoaderState& s) {
  if (j.value("format", "") != "olmoref-loader-state-v1") {
    throw std::runtime_error("loader state: expected format olmoref-loader-state-v1, got '" +
                             j.value("format", std::string("<missing>")) + "'; was it written by another tool?");
  }
  s.epoch = j.at("epoch").get<int64_t>();
  s.batches_processed = j.at("batches_processed").get<int64_t>();
  s.seed = j.at("seed").get<uint64_t>();
  s.fingerprint = j.at("fingerprint").get<std::string>();
  s.global_batch_instances = j.at("global_batch_instances").get<int64_t>();
  s.sequence_length = j.at("sequence_length").get<int64_t>();
  s.tokens_processed = j.value("tokens_processed", int64_t{0});
}

int64_t GlobalBatch::microbatch_size(int64_t m) const {
  return std::min(microbatch_instances, n_instances() - m * microbatch_instances);
}

std::span<const int64_t> GlobalBatch::microbatch_ids(int64_t m) const {
  return std::span<const int64_t>(instance_ids)
      .subspan(static_cast<size_t>(m * microbatch_instances), static_cast<size_t>(microbatch_size(m)));
}

std::span<const uint32_t> GlobalBatch::microbatch_tokens(int64_t m) const {
  return std::span<const uint32_t>(tokens).subspan(static_cast<size_t>(m * microbatch_instances * sequence_length),
                                                   static_cast<size_t>(microbatch_size(m) * sequence_length));
}

Loader::Loader(LoaderConfig config) : config_(std::move(config)), seed_(config_.seed) {
  if (!config_.dataset) throw std::invalid_argument("LoaderConfig.dataset is not set");
  const int64_t g = config_.global_batch_instances, mb = config_.microbatch_instances;
  if (g <= 0 || mb <= 0)
    throw std::invalid_argument("the global batch (" + std::to_string(g) + " instances) and the micro-batch (" +
                                std::to_string(mb) + " instances) must be positive");
  if (config_.world_size <= 0) throw std::invalid_argument("world size must be >= 1");
  BatchSplit{g, mb, config_.world_size}.validate();
  if (config_.rank < -1 || config_.rank >= config_.world_size) {
    throw std::invalid_argument("rank " + std::to_string(config_.rank) + " is outside world size " +
                                std::to_string(config_.world_size));
  }
  batches_per_epoch_ = config_.dataset->size() / g;
  ensure_order();  // also reports a dataset smaller than one global batch right away
  if (config_.debug_bug != PlantedBug::none) PlantedBugHooks::after_construct(*this);  // TEST-ONLY
}

void Loader::ensure_order() {
  uint64_t seed = seed_;
  int64_t epoch = epoch_, n = config_.dataset->size();
  if (config_.debug_bug != PlantedBug::none) PlantedBugHooks::order_key(*this, seed, epoch, n);  // TEST-ONLY
  if (!order_ || order_->seed() != seed || order_->epoch() != epoch) {
    order_.reset();  // free the old permutation before building the next (it can be GBs)
    order_ = std::make_unique<GlobalOrder>(seed, epoch, n, config_.global_batch_instances,
                                           config_.dataset->chunk_instances());
  }
}

GlobalBatch Loader::next_batch() {
  GlobalBatch b;
  next_batch(b);
  return b;
}

void Loader::next_batch(GlobalBatch& out) {
  if (batches_processed_ >= batches_per_epoch_) {
    ++epoch_;
    batches_processed_ = 0;
  }
  ensure_order();
  const FslDataset& ds = *config_.dataset;
  const int64_t g = config_.global_batch_instances, L = ds.sequence_length();
  out.step = (epoch_ - 1) * batches_per_epoch_ + batches_processed_ + 1;
  out.epoch = epoch_;
  out.batch = batches_processed_;
  out.sequence_length = L;
  out.microbatch_instances = config_.microbatch_instances;
  if (config_.debug_bug == PlantedBug::none) {
    const std::span<const uint32_t> row = order_->batch(batches_processed_);
    out.instance_ids.assign(row.begin(), row.end());
  } else {
    PlantedBugHooks::fill_row(*this, out.instance_ids);  // TEST-ONLY
  }
  out.tokens.resize(static_cast<size_t>(g * L));
  // The first batch after construction, restore() or an epoch change was not announced yet; asking
  // for all its instances before copying lets their cold reads overlap each other.
  if (config_.prefetch && (prefetched_epoch_ != epoch_ || prefetched_batch_ != batches_processed_)) {
    prefetch_row(batches_processed_);
  }
  for (int64_t i = 0; i < g; ++i) {
    ds.read_instance(out.instance_ids[static_cast<size_t>(i)],
                     std::span<uint32_t>(out.tokens).subspan(static_cast<size_t>(i * L), static_cast<size_t>(L)));
  }
  ++batches_processed_;
  if (config_.prefetch && batches_processed_ < batches_per_epoch_) prefetch_row(batches_processed_);
  if (config_.audit) write_audit(out, *config_.audit, config_.rank);
}

void Loader::prefetch_row(int64_t batch) {
  for (uint32_t id : order_->batch(batch)) config_.dataset->prefetch_instance(id);
  prefetched_epoch_ = epoch_;
  prefetched_batch_ = batch;
}

LoaderState Loader::state() const {
  LoaderState s;
  s.epoch = epoch_;
  s.batches_processed = batches_processed_;
  s.seed = seed_;
  s.fingerprint = config_.dataset->fingerprint();
  s.global_batch_instances = config_.global_batch_instances;
  s.sequence_length = config_.dataset->sequence_length();
  s.tokens_processed = batches_processed_ * config_.global_batch_instances * s.sequence_length;
  return s;
}

LoaderState rebatched_state(const LoaderState& s, int64_t global_batch_instances) {
  if (global_batch_instances < 1 || s.sequence_length < 1)
    throw std::invalid_argument("rebatched_state: a global batch of " + std::to_string(global_batch_instances) +
                                " instances of " + std::to_string(s.sequence_length) + " tokens");
  // olmoref's own states know their batch, so the tokens seen are exact; a state without one has only the count.
  const int64_t seen = s.global_batch_instances > 0 ? s.batches_processed * s.global_batch_instances * s.sequence_length
                                                    : s.tokens_processed;
  LoaderState out = s;
  out.global_batch_instances = global_batch_instances;
  out.batches_processed = seen / (global_batch_instances * s.sequence_length);
  out.tokens_processed = out.batches_processed * global_batch_instances * s.sequence_length;
  return out;
}

void Loader::restore(const LoaderState& s, bool ignore_fingerprint_mismatch) {
  const FslDataset& ds = *config_.dataset;
  if (s.fingerprint != ds.fingerprint() && !ignore_fingerprint_mismatch) {
    throw std::runtime_error(
        "refusing to resume: the checkpoint's data loader was built on dataset " + s.fingerprint +
        " but this run's dataset (mix '" + ds.mix().source + "') is " + ds.fingerprint() +
        " (file names, sizes, order, dtype or sequence length differ). Use the original mix, or set "
        "ignore_fingerprint_mismatch to resume on different data anyway.");
  }
  if (s.global_batch_instances != config_.global_batch_instances) {
    throw std::runtime_error("refusing to resume: the checkpoint used global batches of " +
                             std::to_string(s.global_batch_instances) + " instances, this run uses " +
                             std::to_string(config_.global_batch_instances) +
                             "; batches_processed would address other rows of the global order. Use the "
                             "checkpoint's global batch size.");
  }
  if (s.sequence_length != ds.sequence_length() && !ignore_fingerprint_mismatch) {
    throw std::runtime_error("refusing to resume: the checkpoint used sequence length " +
                             std::to_string(s.sequence_length) + ", this run uses " +
                             std::to_string(ds.sequence_length()));
  }
  if (s.epoch < 1 || s.batches_processed < 0 || s.batches_processed > batches_per_epoch_) {
    throw std::runtime_error("cannot resume at epoch " + std::to_string(s.epoch) + " after " +
                             std::to_string(s.batches_processed) + " batches: an epoch of this dataset has " +
                             std::to_string(batches_per_epoch_) + " global batches");
  }
  seed_ = s.seed;  // the checkpoint's seed wins, as in OLMo-core
  epoch_ = s.epoch;
  batches_processed_ = s.batches_processed;
  prefetched_epoch_ = prefetched_batch_ = -1;
  ensure_order();
  if (config_.debug_bug != PlantedBug::none) PlantedBugHooks::after_restore(*this, s);  // TEST-ONLY
}

std::shared_ptr<const FslDataset> Loader::holdout_dataset() const {
  if (config_.holdout.kind == HoldoutKind::none) {
    throw std::runtime_error("this run has no holdout data: configure a holdout mix or a document split manifest");
  }
  const FslDataset& ds = *config_.dataset;
  DatasetOptions o;
  o.sequence_length = ds.sequence_length();
  o.vocab_size = ds.vocab_size();
  o.dtype = ds.dtype();
  o.eos_id = ds.eos_id();
  return std::make_shared<FslDataset>(config_.holdout.mix, o);
}

int Loader::rank_of_microbatch(int64_t microbatch, int64_t n_microbatches, int world_size) {
  return olmoref::rank_of_microbatch(microbatch, n_microbatches, world_size);
}

std::vector<int64_t> Loader::microbatches_of_rank(int rank, int64_t n_microbatches, int world_size) {
  return olmoref::microbatches_of_rank(rank, n_microbatches, world_size);
}

void Loader::write_audit(const GlobalBatch& batch, AuditLog& log, int rank) const {
  const FslDataset& ds = *config_.dataset;
  const int64_t M = batch.n_microbatches(), mb = batch.microbatch_instances, L = batch.sequence_length;
  for (int64_t m = 0; m < M; ++m) {
    const int r = rank_of_microbatch(m, M, config_.world_size);
    if (rank >= 0 && r != rank) continue;
    for (int64_t k = 0; k < batch.microbatch_size(m); ++k) {
      const int64_t i = m * mb + k;
      const int64_t id = batch.instance_ids[static_cast<size_t>(i)];
      const FslDataset::Location loc = ds.locate(id);
      AuditRecord rec;
      rec.step = batch.step;
      rec.epoch = batch.epoch;
      rec.batch = batch.batch;
      rec.microbatch = m;
      rec.rank = r;
      rec.instance = id;
      rec.file = ds.file(static_cast<size_t>(loc.file)).path();
      rec.file_index = loc.file;
      rec.token_start = loc.token_start;
      rec.token_end = loc.token_start + L;
      const std::span<const uint32_t> tokens =
          std::span<const uint32_t>(batch.tokens).subspan(static_cast<size_t>(i * L), static_cast<size_t>(L));
      rec.xxh3 = xxh3_tokens(tokens);
      if (config_.document_eos) rec.documents = document_lengths(tokens.data(), L, *config_.document_eos);
      log.write(rec);
    }
  }
}

}  // namespace olmoref::data
