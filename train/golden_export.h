// train/golden_export.h — golden bundles: everything another framework needs to replay an olmoref run
// (docs/formats/golden-bundle.md). `olmoref golden export --run DIR --out BUNDLE` writes one.
//
//   BUNDLE/bundle.json      format "olmoref-golden-bundle/1": model, batch shape, loss, optimizer (per-step lr),
//                           schedule, precision, data files with sizes and the dataset fingerprint, resolved config
//   BUNDLE/hf/              step-0 weights as a Hugging Face Olmo3ForCausalLM checkpoint (model.safetensors,
//                           config.json); a mixture of experts, which Hugging Face has no model for, has instead
//   BUNDLE/olmo_core/       step-0 weights under OLMo-core's state_dict names (model.safetensors)
//   BUNDLE/batches.jsonl    per step, the global batch in order: instance id, file index, token range, XXH3
//   BUNDLE/trace.jsonl      the run's trace (the golden losses), steps 1..S
//   BUNDLE/run_manifest.json  the run's manifest, as written by `olmoref train`
//   BUNDLE/data/            (with copy_data) the token files themselves
//   BUNDLE/states/          olmoref's state after the steps a fixed-state replay needs (step-NNNNNNNN.safetensors:
//                           parameters, Adam's moments and, for a judged step, its pre-clip gradient), recomputed by
//                           training the run again and checked against every trace record on the way
//   BUNDLE/README.md        what the files are, for whoever receives the bundle
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/model_config.h"

namespace olmoref {

// A bundle's "model" dict (and parity-dump's) carries "rope_scaling" only when model.rope_scaling is on: {"kind":
// "yarn", "factor", "beta_fast", "beta_slow", "old_context_len", "full_attention_only"}, OLMo-core's
// YaRNRoPEScalingConfig fields and with_rope_scaling's flag. Adds it to `model`.
void add_rope_scaling_json(const ModelConfig& m, nlohmann::json& model);
void add_rope_scaling_json(const ModelConfig& m, nlohmann::ordered_json& model);
// ... and "moe" only for a mixture of experts: {"n_experts", "top_k", "hidden", "shared_hidden", "lb_loss_weight",
// "z_loss_weight", "scale_loss_by_num_layers", "normalize_expert_weights", "lb_granularity"}, the fields OLMo-core's
// MoEConfig takes (golden/parity/olmo_core_model.py builds it from them).
void add_moe_json(const ModelConfig& m, nlohmann::json& model);
void add_moe_json(const ModelConfig& m, nlohmann::ordered_json& model);

struct GoldenExportOptions {
  std::string run_dir;                  // a directory written by `olmoref train`
  std::string out_dir;                  // created; must be empty or absent
  std::vector<std::string> overrides;   // config overrides (e.g. data.train_mix=... when the run's paths moved)
  int64_t steps = -1;                   // export steps 1..steps (default: every step of the trace)
  bool copy_data = false;               // copy the token files into BUNDLE/data/
  // Which steps a replay can judge one at a time from olmoref's own state (docs/formats/golden-bundle.md,
  // "States"): "auto" (every step of an fp32 AdamW run while the states stay under kAutoStatesBytes, evenly spaced
  // steps beyond, none when one judged step alone is over that budget, for bf16 or SkipStepAdamW), "all", "none", or
  // a comma-separated list of steps.
  std::string states = "auto";
  int threads = 0;                      // for retraining the states (0: all hardware threads)
};

// The most bytes `--states auto` writes before it samples steps instead of taking every one.
inline constexpr int64_t kAutoStatesBytes = int64_t{1} << 30;

// The steps a fixed-state replay judges, from a --states value, for a bundle of `steps` steps whose state files hold
// `state_bytes` each. Throws std::invalid_argument naming the value and what is allowed. `note` says what auto chose
// and why when it chose less than every step.
std::vector<int64_t> judged_state_steps(const std::string& value, int64_t steps, int64_t state_bytes, bool fp32,
                                        bool skip_step, std::string* note);

struct GoldenExportSummary {
  int64_t steps = 0, instances_per_step = 0, seq_len = 0, n_files = 0, n_params = 0;
  bool audit_checked = false;  // the run's audit.jsonl agreed with the recomputed batches
  std::string fingerprint;
  std::string weights_dir;     // "hf" or (mixture of experts) "olmo_core"
  std::vector<int64_t> judged_steps;  // steps a fixed-state replay judges (empty: no states written)
  int64_t state_files = 0, state_bytes = 0;
  double retrain_seconds = 0;
  std::string states_note;            // why auto chose fewer steps than all, or none
};

// Recomputes the run's batches with the loader from the run's resolved config, checks every step's token
// digest against the trace (and the audit log when the run wrote one), and writes the bundle. Throws
// std::runtime_error naming what disagrees.
GoldenExportSummary export_golden_bundle(const GoldenExportOptions& opts);

}  // namespace olmoref
