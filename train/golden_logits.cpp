#include "train/golden_logits.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "ckpt/checkpoint.h"
#include "data/mix.h"
#include "data/token_file.h"
#include "interop/hf_export.h"
#include "interop/safetensors.h"
#include "core/bf16.h"
#include "model/init.h"
#include "model/olmo3.h"
#include "core/parallel.h"
#include "train/config.h"
#include "train/weights.h"

namespace olmoref {

namespace fs = std::filesystem;

LogitsBundleSummary write_logits_bundle(const LogitsBundleOptions& opts) {
  if (opts.seq_len < 2) throw std::invalid_argument("--seq-len must be >= 2");
  if (opts.instances < 1) throw std::invalid_argument("--instances must be >= 1");
  if (opts.config_path.empty() == opts.checkpoint.empty())
    throw std::invalid_argument("give exactly one of --config (step-0 weights) and --checkpoint (trained weights)");
  LogitsBundleSummary summary;

  // ---- config and weights ----
  RunWeights w = !opts.checkpoint.empty() ? load_checkpoint_weights(opts.checkpoint, opts.overrides)
                                          : initial_weights(load_config(opts.config_path, opts.overrides));
  const TrainConfig& cfg = w.config;
  if (cfg.data.document_masking)
    throw std::invalid_argument("golden logits: the config sets data.document_masking, which the logits' Hugging Face "
                                "peer does not do (it attends across documents); use a config without it");
  const std::vector<float>& params = w.params;
  summary.step = w.step;
  const Precision precision = parse_precision(opts.precision.empty() ? cfg.train.precision : opts.precision);
  const int64_t N = opts.instances, T = opts.seq_len, V = cfg.model.vocab_size;

  // ---- tokens: consecutive windows of real text ----
  std::string which = opts.data;
  const bool has_holdout = !cfg.data.holdout_mix.empty() || !cfg.data.holdout_files.empty();
  if (which == "auto") which = has_holdout ? "holdout" : "train";
  data::Mix mix;
  if (which == "holdout") {
    if (!has_holdout) throw std::invalid_argument("--data holdout: the config has no data.holdout_mix/holdout_files");
    mix = !cfg.data.holdout_mix.empty() ? data::Mix::parse_file(cfg.data.holdout_mix)
                                        : data::Mix::from_paths(cfg.data.holdout_files);
  } else if (which == "train") {
    if (cfg.data.train_mix.empty() && cfg.data.train_files.empty())
      throw std::invalid_argument("--data train: the config has no data.train_mix/train_files");
    mix = !cfg.data.train_mix.empty() ? data::Mix::parse_file(cfg.data.train_mix) : data::Mix::from_paths(cfg.data.train_files);
  } else {
    throw std::invalid_argument("--data must be holdout, train or auto");
  }
  if (mix.entries.empty()) throw std::runtime_error("the " + which + " mix has no files");
  const data::Dtype dtype = cfg.data.dtype == "auto" ? data::dtype_for_vocab(V) : data::parse_dtype(cfg.data.dtype);
  const data::TokenFile file(mix.entries.front().path, dtype);
  if (file.n_tokens() < N * T)
    throw std::runtime_error(file.path() + " holds " + std::to_string(file.n_tokens()) + " tokens; " +
                             std::to_string(N) + " windows of " + std::to_string(T) + " need " + std::to_string(N * T));
  std::vector<uint32_t> tokens(static_cast<size_t>(N * T));
  file.read(0, tokens, V);
  summary.tokens_from = file.path() + " [0, " + std::to_string(N * T) + ")";

  // ---- our logits ----
  const auto t0 = std::chrono::steady_clock::now();
  ThreadPool pool(opts.threads);
  Olmo3 model(cfg.model, N, T, precision);
  model.set_z_loss(cfg.train.z_loss);
  std::vector<float> logits(static_cast<size_t>(N * T * V));
  const LossSums sums = model.forward_loss(params.data(), tokens.data(), &pool, logits.data());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double n_targets = static_cast<double>(N * (T - 1));
  summary.loss = (sums.ce + sums.z) / n_targets;
  summary.ce = sums.ce / n_targets;
  summary.z = sums.z / n_targets;

  // ---- write ----
  fs::create_directories(opts.out_dir);
  const ParamLayout layout(cfg.model);
  HfExportOptions hf;
  hf.max_position_embeddings = T;
  if (cfg.data.eos_id >= 0 && cfg.data.eos_id < V) hf.eos_token_id = cfg.data.eos_id;
  export_hf_checkpoint(opts.out_dir + "/hf", cfg.model, layout, params.data(), hf);
  {
    std::ofstream tok(opts.out_dir + "/tokens.u32", std::ios::binary | std::ios::trunc);
    tok.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    if (!tok) throw std::runtime_error(opts.out_dir + "/tokens.u32: write failed");
  }
  write_safetensors(opts.out_dir + "/ours_logits.safetensors",
                    {{"logits", "F32", {N, T, V}, logits.data(), logits.size() * sizeof(float)}});
  nlohmann::json j;
  j["format"] = "olmoref-logits-bundle/1";
  j["precision"] = precision_name(precision);
  j["seq_len"] = T;
  j["instances"] = N;
  j["vocab_size"] = V;
  j["model"] = {{"name", cfg.model.name}, {"d_model", cfg.model.d_model}, {"n_layers", cfg.model.n_layers},
                {"n_heads", cfg.model.n_heads}, {"n_kv_heads", cfg.model.n_kv_heads},
                {"swa_pattern", cfg.model.swa_pattern}};
  j["weights"] = opts.checkpoint.empty() ? "step-0 (" + opts.config_path + ")" : opts.checkpoint;
  j["step"] = summary.step;
  j["tokens_from"] = summary.tokens_from;
  j["z_loss"] = cfg.train.z_loss;
  j["loss"] = summary.loss;
  j["ce"] = summary.ce;
  j["z"] = summary.z;
  std::ofstream out(opts.out_dir + "/ours.json");
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error(opts.out_dir + "/ours.json: write failed");
  return summary;
}

}  // namespace olmoref
