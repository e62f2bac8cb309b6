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

std::vector<TraceRecord> run_training(const TrainConfig& cfg, const std::string& out_dir, int threads,
                                      int64_t steps, bool quiet) {
  namespace fs = std::filesystem;
  fs::create_directories(out_dir);
  const int64_t total = steps >= 0 ? steps : cfg.train.steps;
  Trainer trainer(cfg, threads, make_batch_source(cfg));
  write_run_manifest(out_dir + "/manifest.json", cfg, trainer.pool().size());
  TraceWriter trace;
  trace.open(out_dir + "/trace.jsonl", false);
  if (!quiet)
    std::fprintf(stderr, "olmoref train: %s, %.3fM params, %lld steps of %lld tokens, %d thread(s), out %s\n",
                 cfg.model.name.c_str(), static_cast<double>(trainer.n_params()) / 1e6, static_cast<long long>(total),
                 static_cast<long long>(cfg.train.global_batch_instances * cfg.train.seq_len), trainer.pool().size(),
                 out_dir.c_str());
  std::vector<TraceRecord> records;
  double elapsed = 0.0;
  for (int64_t s = 0; s < total; ++s) {
    const StepResult res = trainer.train_step();
    trace.write(res.record);
    records.push_back(res.record);
    elapsed += res.seconds;
    if (!quiet && (res.record.step % cfg.train.log_every == 0 || s + 1 == total)) {
      const double tps = static_cast<double>(cfg.train.global_batch_instances * cfg.train.seq_len) / res.seconds;
      std::fprintf(stderr, "step %5lld/%lld  loss %.4f  grad_norm %.4f  lr %.3e  %.0f tok/s  %s\n",
                   static_cast<long long>(res.record.step), static_cast<long long>(total), res.record.loss,
                   res.record.grad_norm, res.record.lr, tps, res.record.param_digest.substr(0, 12).c_str());
    }
  }
  if (!quiet && total > 0)
    std::fprintf(stderr, "done: %lld steps in %.1f s (%.0f tok/s); trace %s/trace.jsonl\n", static_cast<long long>(total),
                 elapsed, static_cast<double>(total * cfg.train.global_batch_instances * cfg.train.seq_len) / elapsed,
                 out_dir.c_str());
  return records;
}

}  // namespace olmoref
