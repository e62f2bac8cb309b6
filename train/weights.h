// train/weights.h — a model's fp32 weights from wherever they live: a checkpoint written by `olmoref train` (with
// the run's own resolved config), the step-0 init of a config, or a Hugging Face Olmo 3 checkpoint the run starts
// from (`train --init-from-hf`, the [init] section of the config).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "interop/hf_export.h"
#include "train/config.h"

namespace olmoref {

struct RunWeights {
  TrainConfig config;         // the run's resolved configuration (overrides applied)
  std::vector<float> params;  // the flat canonical parameter vector (core/params.h)
  int64_t step = 0;           // optimizer steps completed (0: step-0 weights)
};

// The rotary embedding's [model] keys: they hold no weights, so a run from another run's checkpoint (init.checkpoint)
// may change them, as Olmo 3's long-context stage puts YaRN over stage 2's weights. Every other [model] key must agree.
inline const std::vector<std::string> kRopeModelKeys = {"rope_theta", "rope_scaling", "rope_yarn_factor",
                                                       "rope_yarn_beta_fast", "rope_yarn_beta_slow",
                                                       "rope_yarn_old_context_len", "rope_scaling_full_attention_only"};
// `model` with `source`'s rotary embedding (kRopeModelKeys): the model a checkpoint of `source` names by its
// model_hash when this run changes only the RoPE.
ModelConfig with_rope_of(ModelConfig model, const ModelConfig& source);

// The resolved config a checkpoint directory records (its manifest), without reading the weights.
TrainConfig load_checkpoint_config(const std::string& dir, const std::vector<std::string>& overrides = {});

// A model's weights read piece by piece, in the flat vector's order (interop/hf_export.h FlatReader), never held
// whole: a checkpoint's parameters frame by frame, a Hugging Face checkpoint's tensor slices, or the init computed on
// demand. finish() verifies what was read where the source can (a checkpoint: every frame's checksums as read, then
// the parameters' whole-state digest); call it after reading the whole vector.
struct WeightStream {
  TrainConfig config;  // the run's resolved configuration (overrides applied)
  int64_t step = 0;    // optimizer steps completed (0: step-0 weights)
  FlatReader read;
  std::function<void()> finish;
};
WeightStream checkpoint_weight_stream(const std::string& dir, const std::vector<std::string>& overrides = {});
WeightStream initial_weight_stream(const TrainConfig& cfg);

// The weights of a checkpoint directory (stepNNNNNNNN: its parameters, every frame and their digest verified; the
// moments are not read) and the config it records.
RunWeights load_checkpoint_weights(const std::string& dir, const std::vector<std::string>& overrides = {});

// The step-0 weights of `cfg`: those of the olmoref checkpoint or the Hugging Face checkpoint cfg.init names, else
// the init.
RunWeights initial_weights(const TrainConfig& cfg);

// Refuses (std::invalid_argument "CONFIG FILE: WHAT: config key '...': ...") a model with no Hugging Face Olmo3
// form: a mixture of experts, or sliding layers with different windows. `what` says who needs the form
// ("Hugging Face export", "Hugging Face import"); called before anything is written.
void require_hf_form(const TrainConfig& cfg, const char* what);

// Fills cfg.init.hf_sha256 from the files in cfg.init.hf_dir (interop/hf_export.h: hf_weights_sha256), or checks
// them against it when the config pins one. No-op without init.hf_dir. Throws naming the directory and both digests.
void resolve_hf_init(TrainConfig& cfg);

// init.checkpoint (a new run from another olmoref run's checkpoint, Olmo 3's stage 2): checks, before anything is
// written, that the directory is a checkpoint whose manifest verifies, whose [model] is this config's (and, with
// init.load_optimizer, whose optimizer betas, eps and weight decay are), and fills cfg.init.checkpoint_xxh3 with its
// manifest's checksum (or checks it against a pinned one). No-op without init.checkpoint. Throws naming the config
// file, the key, the checkpoint and both values.
void resolve_checkpoint_init(TrainConfig& cfg);

}  // namespace olmoref
