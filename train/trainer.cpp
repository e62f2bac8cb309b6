#include "train/trainer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "golden/digest.h"
#include "ref/gemm.h"
#include "ref/init.h"
#include "ref/optim.h"
#include "ckpt/checkpoint.h"
#include "train/manifest.h"

namespace olmoref {

Trainer::Trainer(const TrainConfig& cfg, int threads, std::unique_ptr<BatchSource> source)
    : cfg_(cfg),
      pool_(threads),
      model_(cfg.model, cfg.train.micro_batch_instances, cfg.train.seq_len),
      source_(std::move(source)) {
  cfg_.validate();
  const int64_t n = model_.layout().total;
  params_.assign(static_cast<size_t>(n), 0.0f);
  m_.assign(static_cast<size_t>(n), 0.0f);
  v_.assign(static_cast<size_t>(n), 0.0f);
  init_params(cfg_.model, model_.layout(), params_.data());
}

// The canonical reduction over micro-batch indices [lo, hi): split at mid = lo + ceil((hi-lo)/2),
// sum = left + right elementwise. With 2^k ranks each holding a contiguous aligned block of the
// micro-batches, every rank's block is a whole subtree, so data-parallel layouts change only who
// computes which subtree (docs/canonical/step.md).
LossSums Trainer::reduce_range(const StepBatch& batch, int64_t lo, int64_t hi, size_t depth, float* logits_out) {
  const int64_t n = model_.layout().total;
  if (grad_stack_.size() <= depth) grad_stack_.resize(depth + 1);
  if (grad_stack_[depth].size() != static_cast<size_t>(n)) grad_stack_[depth].assign(static_cast<size_t>(n), 0.0f);
  if (hi - lo == 1) {
    const int64_t mb = cfg_.train.micro_batch_instances, T = cfg_.train.seq_len;
    float* lo_logits = logits_out ? logits_out + lo * mb * T * cfg_.model.vocab_size : nullptr;
    return model_.forward_backward(params_.data(), batch.tokens.data() + lo * mb * T, cfg_.targets_per_step(),
                                   grad_stack_[depth].data(), &pool_, lo_logits);
  }
  const int64_t mid = lo + (hi - lo + 1) / 2;
  LossSums left = reduce_range(batch, lo, mid, depth, logits_out);
  LossSums right = reduce_range(batch, mid, hi, depth + 1, logits_out);
  float* a = grad_stack_[depth].data();
  const float* b = grad_stack_[depth + 1].data();
  pool_.parallel_for(n, 1 << 15, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) a[i] = a[i] + b[i];
  });
  return {left.ce + right.ce, left.z + right.z, left.n_targets + right.n_targets};
}

LossSums Trainer::compute_gradient(const StepBatch& batch, float* grad, float* logits_out) {
  const LossSums sums = reduce_range(batch, 0, cfg_.micro_batches_per_step(), 0, logits_out);
  if (grad) std::copy(grad_stack_[0].begin(), grad_stack_[0].end(), grad);
  return sums;
}

StepResult Trainer::train_step() {
  if (!source_) throw std::logic_error("Trainer has no batch source");
  const auto t0 = std::chrono::steady_clock::now();
  const StepBatch batch = source_->next();
  const LossSums sums = reduce_range(batch, 0, cfg_.micro_batches_per_step(), 0, nullptr);
  float* grad = grad_stack_[0].data();
  const int64_t n = model_.layout().total;
  const double norm = grad_norm(grad, n, &pool_);
  const float clip = clip_coefficient(norm, cfg_.optim.max_grad_norm);
  scale_inplace(grad, n, clip, &pool_);
  const int64_t step = step_ + 1;
  const double lr = scheduled_lr(cfg_.schedule, cfg_.optim.lr, step, cfg_.train.steps);
  adamw_step(cfg_.optim, model_.layout(), step, lr, params_.data(), grad, m_.data(), v_.data(), &pool_);
  step_ = step;
  tokens_ += static_cast<int64_t>(batch.tokens.size());

  StepResult out;
  TraceRecord& r = out.record;
  const double N = static_cast<double>(cfg_.targets_per_step());
  r.step = step;
  r.epoch = batch.epoch;
  r.loss = static_cast<float>((sums.ce + sums.z) / N);
  r.ce = static_cast<float>(sums.ce / N);
  r.z = static_cast<float>(sums.z / N);
  r.grad_norm = static_cast<float>(norm);
  r.clip = clip;
  r.lr = lr;
  r.tokens = tokens_;
  r.data_digest = hex64(data_digest(batch.tokens.data(), static_cast<int64_t>(batch.tokens.size())));
  r.param_digest = merkle_digest(params_.data(), n).hex();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::string Trainer::save_checkpoint(const std::string& root) const {
  ckpt::CheckpointMeta meta;
  meta.step = step_;
  meta.tokens = tokens_;
  meta.loader_state = source_ ? source_->state() : nlohmann::json();
  meta.dataset_fingerprint = source_ ? source_->fingerprint() : "";
  meta.config_toml = cfg_.to_toml();
  meta.resume_hash = cfg_.resume_hash();
  meta.model_hash = cfg_.model_hash();
  meta.data_layout = {{"seq_len", cfg_.train.seq_len},
                      {"micro_batch_instances", cfg_.train.micro_batch_instances},
                      {"global_batch_instances", cfg_.train.global_batch_instances},
                      {"dp_shard", 1},
                      {"dp_replicate", 1}};
  meta.precision = cfg_.train.precision;
  meta.executor = cfg_.train.executor;
  meta.extra = {{"build", build_facts()}};
  std::vector<ckpt::Segment> segments;
  for (const ParamInfo& p : model_.layout().params) segments.push_back({p.name, p.offset, p.numel});
  ckpt::SaveOptions opts;
  opts.zstd_level = static_cast<int>(cfg_.checkpoint.zstd_level);
  opts.zstd_threads = cfg_.checkpoint.zstd_threads > 0 ? static_cast<int>(cfg_.checkpoint.zstd_threads) : pool_.size();
  opts.keep_last = static_cast<int>(cfg_.checkpoint.keep_last);
  // The vectors are only read; StateVectors carries mutable pointers because load() shares it.
  auto& self = const_cast<Trainer&>(*this);
  return ckpt::save(root, meta, {n_params(), self.params_.data(), self.m_.data(), self.v_.data()}, segments, opts);
}

void Trainer::resume(const std::string& dir, const ResumeOptions& opts) {
  ckpt::CheckpointMeta expect;
  expect.model_hash = cfg_.model_hash();
  expect.resume_hash = cfg_.resume_hash();
  expect.dataset_fingerprint = source_ ? source_->fingerprint() : "";
  ckpt::LoadOptions lo;
  lo.ignore_fingerprint_mismatch = opts.ignore_fingerprint_mismatch;
  lo.allow_config_change = opts.allow_config_change;
  std::vector<float> m_fresh, v_fresh;
  if (opts.skip_moments) {
    m_fresh = m_;
    v_fresh = v_;
  }
  const ckpt::CheckpointMeta meta = ckpt::load(dir, {n_params(), params_.data(), m_.data(), v_.data()}, expect, lo);
  if (opts.skip_moments) {
    m_ = std::move(m_fresh);
    v_ = std::move(v_fresh);
  }
  if (!opts.skip_step) step_ = meta.step;
  tokens_ = meta.tokens;
  if (source_ && !opts.skip_loader) source_->restore(meta.loader_state, opts.ignore_fingerprint_mismatch);
}

namespace {

// Keeps the records (trace or audit lines, each with a "step") of steps <= last_step: a killed run
// may have written records past its newest checkpoint, and the resumed run writes them again.
void truncate_jsonl(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    int64_t step = 0;
    try {
      step = nlohmann::json::parse(line).at("step").get<int64_t>();
    } catch (const std::exception&) {
      break;  // a record torn by a kill: everything after it is discarded too
    }
    if (step > last_step) break;
    kept += line + "\n";
  }
  in.close();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept;
    if (!out) throw std::runtime_error(tmp + ": cannot rewrite the trace");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

std::vector<TraceRecord> run_training(const TrainConfig& cfg, const RunOptions& opts) {
  namespace fs = std::filesystem;
  const std::string& out_dir = opts.out_dir;
  fs::create_directories(out_dir);
  const std::string ckpt_root = out_dir + "/checkpoints";
  const int64_t total = cfg.train.steps;
  const int64_t stop = opts.stop_after >= 0 ? std::min(opts.stop_after, total) : total;
  std::string resume_dir = opts.resume_from;
  if (opts.resume && resume_dir.empty()) {
    const auto newest = ckpt::newest_complete(ckpt_root);
    if (!newest)
      throw std::runtime_error(ckpt_root + ": no complete checkpoint to resume from (run without --resume to start fresh)");
    resume_dir = *newest;
  }
  const std::string audit_path = cfg.data.audit ? out_dir + "/audit.jsonl" : "";
  if (!resume_dir.empty()) {
    // Records past the checkpoint are rewritten by this run; cut them before any log is reopened.
    const int64_t ckpt_step = ckpt::manifest_step(resume_dir);
    truncate_jsonl(out_dir + "/trace.jsonl", ckpt_step);
    if (!audit_path.empty()) truncate_jsonl(audit_path, ckpt_step);
  }
  Trainer trainer(cfg, opts.threads, make_batch_source(cfg, audit_path, !resume_dir.empty()));
  if (!resume_dir.empty()) {
    trainer.resume(resume_dir, opts.resume_opts);
    if (!opts.quiet)
      std::fprintf(stderr, "olmoref train: resumed from %s at step %lld\n", resume_dir.c_str(),
                   static_cast<long long>(trainer.step()));
  }
  write_run_manifest(out_dir + "/manifest.json", cfg, trainer.pool().size());
  TraceWriter trace;
  trace.open(out_dir + "/trace.jsonl", !resume_dir.empty());
  if (!opts.quiet)
    std::fprintf(stderr, "olmoref train: %s, %.3fM params, steps %lld..%lld of %lld (%lld tokens each), %d thread(s), data %s, out %s\n",
                 cfg.model.name.c_str(), static_cast<double>(trainer.n_params()) / 1e6,
                 static_cast<long long>(trainer.step() + 1), static_cast<long long>(stop), static_cast<long long>(total),
                 static_cast<long long>(cfg.train.global_batch_instances * cfg.train.seq_len), trainer.pool().size(),
                 trainer.source().describe().c_str(), out_dir.c_str());
  std::vector<TraceRecord> records;
  double elapsed = 0.0;
  int64_t done = 0;
  while (trainer.step() < stop) {
    const StepResult res = trainer.train_step();
    trace.write(res.record);
    records.push_back(res.record);
    elapsed += res.seconds;
    ++done;
    const int64_t s = res.record.step;
    if (!opts.quiet && (s % cfg.train.log_every == 0 || s == stop)) {
      const double tps = static_cast<double>(cfg.train.global_batch_instances * cfg.train.seq_len) / res.seconds;
      std::fprintf(stderr, "step %5lld/%lld  loss %.4f  grad_norm %.4f  lr %.3e  %.0f tok/s  %s\n",
                   static_cast<long long>(s), static_cast<long long>(total), res.record.loss, res.record.grad_norm,
                   res.record.lr, tps, res.record.param_digest.substr(0, 12).c_str());
    }
    const bool periodic = cfg.checkpoint.interval > 0 && s % cfg.checkpoint.interval == 0;
    if (periodic || s == stop) {
      trainer.source_mut().flush_audit();
      const std::string dir = trainer.save_checkpoint(ckpt_root);
      if (!opts.quiet) std::fprintf(stderr, "checkpoint %s\n", dir.c_str());
    }
  }
  if (!opts.quiet && done > 0)
    std::fprintf(stderr, "done: %lld steps in %.1f s (%.0f tok/s); trace %s/trace.jsonl\n", static_cast<long long>(done),
                 elapsed, static_cast<double>(done * cfg.train.global_batch_instances * cfg.train.seq_len) / elapsed,
                 out_dir.c_str());
  return records;
}

}  // namespace olmoref
