#include "train/weights.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "ckpt/checkpoint.h"
#include "interop/hf_export.h"
#include "model/init.h"
#include "core/params.h"

namespace olmoref {

TrainConfig load_checkpoint_config(const std::string& dir, const std::vector<std::string>& overrides) {
  std::ifstream in(dir + "/manifest.json");
  if (!in) throw std::runtime_error(dir + ": not a checkpoint directory (no manifest.json)");
  nlohmann::json man;
  try {
    man = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(dir + "/manifest.json: not valid JSON (" + e.what() + ")");
  }
  if (!man.contains("config_toml") || !man["config_toml"].is_string())
    throw std::runtime_error(dir + "/manifest.json: has no config_toml; is this a checkpoint written by olmoref train?");
  return parse_config_text(man["config_toml"].get<std::string>(), dir + "/manifest.json", overrides);
}

RunWeights load_checkpoint_weights(const std::string& dir, const std::vector<std::string>& overrides) {
  RunWeights w;
  w.config = load_checkpoint_config(dir, overrides);
  const ParamLayout layout(w.config.model);
  w.params.assign(static_cast<size_t>(layout.total), 0.0f);
  std::vector<float> m(w.params.size()), v(w.params.size());  // the moments are verified too, then dropped
  const ckpt::CheckpointMeta meta =
      ckpt::load(dir, {layout.total, w.params.data(), m.data(), v.data()}, ckpt::CheckpointMeta{}, {});
  w.step = meta.step;
  return w;
}

namespace {
// The weights' SHA-256, refused when the config pins another one.
std::string pinned_hf_sha256(const TrainConfig& cfg) {
  const std::string got = hf_weights_sha256(cfg.init.hf_dir);
  if (!cfg.init.hf_sha256.empty() && got != cfg.init.hf_sha256)
    throw std::runtime_error(cfg.init.hf_dir + ": the weights have SHA-256 " + got + " but init.hf_sha256 is " +
                             cfg.init.hf_sha256 + "; point init.hf_dir at the checkpoint the config pins, or drop "
                             "init.hf_sha256 to take these weights");
  return got;
}
}  // namespace

RunWeights initial_weights(const TrainConfig& cfg) {
  RunWeights w;
  w.config = cfg;
  const ParamLayout layout(cfg.model);
  w.params.assign(static_cast<size_t>(layout.total), 0.0f);
  if (cfg.init.hf_dir.empty()) {
    init_params(cfg.model, layout, w.params.data());
    return w;
  }
  require_hf_form(cfg, "Hugging Face import");
  // Verified before use: the digest is what the run's resume_hash and manifest say it started from.
  if (!cfg.init.hf_sha256.empty()) pinned_hf_sha256(cfg);
  import_hf_checkpoint(cfg.init.hf_dir, cfg.model, layout, w.params.data());
  return w;
}

void require_hf_form(const TrainConfig& cfg, const char* what) {
  try {
    check_hf_representable(cfg.model, what);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(cfg.in_file(e.what()));
  }
}

void resolve_hf_init(TrainConfig& cfg) {
  if (cfg.init.hf_dir.empty()) return;
  cfg.init.hf_sha256 = pinned_hf_sha256(cfg);
}

}  // namespace olmoref
