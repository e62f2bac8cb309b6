#include "train/weights.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "ckpt/checkpoint.h"
#include "interop/hf_export.h"
#include "model/init.h"
#include "core/params.h"

#include <algorithm>
#include <memory>

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

namespace {
// The weights' SHA-256, refused when the config pins another one.
std::string pinned_hf_sha256(const TrainConfig& cfg) {
  const std::string got = hf_weights_sha256(cfg.init.hf_dir);
  // An export of olmoref's carries its files' SHA-256: a file changed since (a flipped bit) is refused here, where
  // the digest is in hand, not taken as the weights.
  verify_export_checksums(cfg.init.hf_dir, got);
  if (!cfg.init.hf_sha256.empty() && got != cfg.init.hf_sha256)
    throw std::runtime_error(cfg.init.hf_dir + ": the weights have SHA-256 " + got + " but init.hf_sha256 is " +
                             cfg.init.hf_sha256 + "; point init.hf_dir at the checkpoint the config pins, or drop "
                             "init.hf_sha256 to take these weights");
  return got;
}
}  // namespace

WeightStream checkpoint_weight_stream(const std::string& dir, const std::vector<std::string>& overrides) {
  WeightStream w;
  w.config = load_checkpoint_config(dir, overrides);
  auto reader = std::make_shared<ckpt::VectorReader>(dir, "params");
  if (reader->total() != ParamLayout(w.config.model).total)
    throw std::runtime_error(dir + "/manifest.json: holds " + std::to_string(reader->total()) + " parameters, but the "
                             "config it records has " + std::to_string(ParamLayout(w.config.model).total));
  w.step = ckpt::manifest_step(dir);
  // The digest is checked as the last piece is read, so a writer streaming the weights fails before its file is
  // renamed into place.
  w.read = [reader](int64_t a, int64_t b, float* out) {
    reader->read(a, b, out);
    if (b == reader->total()) reader->finish();
  };
  w.finish = [reader] { reader->finish(); };
  return w;
}

WeightStream initial_weight_stream(const TrainConfig& cfg) {
  if (!cfg.init.checkpoint.empty()) {  // another run's checkpoint (its weights; the optimizer state is the run's affair)
    WeightStream w = checkpoint_weight_stream(cfg.init.checkpoint);
    if (ParamLayout(w.config.model).total != ParamLayout(cfg.model).total)
      throw std::runtime_error(cfg.init.checkpoint + ": holds " + std::to_string(ParamLayout(w.config.model).total) +
                               " parameters, but this config's model has " + std::to_string(ParamLayout(cfg.model).total) +
                               "; set [model] to the checkpoint's, or point init.checkpoint at a checkpoint of this model");
    w.config = cfg;
    w.step = 0;
    return w;
  }
  WeightStream w;
  w.config = cfg;
  w.finish = [] {};
  if (cfg.init.hf_dir.empty()) {
    auto layout = std::make_shared<ParamLayout>(cfg.model);
    const ModelConfig model = cfg.model;
    w.read = [layout, model](int64_t a, int64_t b, float* out) { init_params_range(model, *layout, a, b, out); };
    return w;
  }
  require_hf_form(cfg, "Hugging Face import");
  // Verified before use: the digest is what the run's resume_hash and manifest say it started from.
  if (!cfg.init.hf_sha256.empty()) pinned_hf_sha256(cfg);
  const ParamLayout layout(cfg.model);
  auto hf = std::make_shared<HfWeights>(cfg.init.hf_dir, cfg.model, layout);
  w.read = [hf](int64_t a, int64_t b, float* out) { hf->read(a, b, out); };
  return w;
}

namespace {
RunWeights read_whole(WeightStream&& w) {
  RunWeights out;
  out.config = std::move(w.config);
  out.step = w.step;
  out.params.assign(static_cast<size_t>(ParamLayout(out.config.model).total), 0.0f);
  w.read(0, static_cast<int64_t>(out.params.size()), out.params.data());
  w.finish();
  return out;
}
}  // namespace

RunWeights load_checkpoint_weights(const std::string& dir, const std::vector<std::string>& overrides) {
  return read_whole(checkpoint_weight_stream(dir, overrides));
}

RunWeights initial_weights(const TrainConfig& cfg) { return read_whole(initial_weight_stream(cfg)); }

void require_hf_form(const TrainConfig& cfg, const char* what) {
  try {
    check_hf_representable(cfg.model, what);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(cfg.in_file(e.what()));
  }
}

namespace {
// Each key of section `sec` whose value differs between the two resolved configs (except `skip`), as
// "sec.key = A here but B in the checkpoint".
std::vector<std::string> section_differences(const TrainConfig& here, const TrainConfig& there, const char* sec,
                                             const std::vector<std::string>& skip) {
  const toml::table a = toml::parse(here.to_toml()), b = toml::parse(there.to_toml());
  const toml::table* ta = a[sec].as_table();
  const toml::table* tb = b[sec].as_table();
  auto text = [](const toml::table* t, const std::string& k) {
    if (!t || !t->contains(k)) return std::string("(not set)");
    std::ostringstream o;
    o << (*t)[k];
    return o.str();
  };
  std::vector<std::string> keys;
  for (const toml::table* t : {ta, tb})
    if (t)
      for (const auto& [k, v] : *t) {
        (void)v;
        const std::string name(k.str());
        if (std::find(keys.begin(), keys.end(), name) == keys.end()) keys.push_back(name);
      }
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    if (std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
    const std::string x = text(ta, k), y = text(tb, k);
    if (x != y) out.push_back(std::string(sec) + "." + k + " = " + x + " here but " + y + " in the checkpoint");
  }
  return out;
}
}  // namespace

ModelConfig with_rope_of(ModelConfig model, const ModelConfig& source) {
  model.rope_theta = source.rope_theta;
  model.rope_scaling = source.rope_scaling;  // every rope_yarn_* key and rope_scaling_full_attention_only
  return model;
}

void resolve_checkpoint_init(TrainConfig& cfg) {
  if (cfg.init.checkpoint.empty()) return;
  namespace fs = std::filesystem;
  const std::string& dir = cfg.init.checkpoint;
  const std::string key = "config key 'init.checkpoint'";
  if (!fs::is_directory(dir))
    throw std::runtime_error(cfg.in_file(key + ": " + dir + ": no such directory; point it at a checkpoint of an "
                                         "olmoref run (OUT/checkpoints/stepNNNNNNNN)"));
  if (!fs::exists(dir + "/manifest.json")) {
    const auto newest = ckpt::newest_complete(dir);
    throw std::runtime_error(cfg.in_file(key + ": " + dir + " is not a checkpoint (no manifest.json); point it at "
                                         "one stepNNNNNNNN directory" +
                                         (newest ? " (the newest here is " + *newest + ")" : std::string())));
  }
  const TrainConfig src = load_checkpoint_config(dir);
  // The weights are loaded as they are: every [model] key that shapes or places them must agree. The name and the
  // init's seed and scale only describe how stage 1 began, and the RoPE keys hold no weights (kRopeModelKeys).
  std::vector<std::string> free_keys = {"name", "init_seed", "init_std"};
  free_keys.insert(free_keys.end(), kRopeModelKeys.begin(), kRopeModelKeys.end());
  const std::vector<std::string> model_diff = section_differences(cfg, src, "model", free_keys);
  if (!model_diff.empty())
    throw std::runtime_error(cfg.in_file(key + ": " + dir + " holds another model: " + model_diff.front() +
                                         "; set the [model] section to the checkpoint's (olmoref ckpt inspect " + dir +
                                         " shows its config), or start from a checkpoint of this model"));
  // OLMo-core's load of the optimizer state (torch's Optimizer.load_state_dict) also takes each param group's
  // betas, eps and weight_decay from the checkpoint; only initial_lr is reset to the new config (OptimConfig's
  // fixed_fields). olmoref uses the config's values, so it refuses a config whose values OLMo-core would ignore.
  if (cfg.init.load_optimizer) {
    const std::vector<std::string> optim_diff =
        section_differences(cfg, src, "optim", {"kind", "lr", "max_grad_norm", "rolling_interval_length",
                                                "sigma_factor", "step_increment_bugfix"});
    if (!optim_diff.empty())
      throw std::runtime_error(cfg.in_file(key + ": " + optim_diff.front() + " (" + dir + "): loading the optimizer "
                                           "state takes the checkpoint's betas, eps and weight decay (as OLMo-core's "
                                           "load does); set the same value, or init.load_optimizer = false"));
  }
  // Every manifest check a resume makes (its checksum, its record against itself); the shards are verified as they
  // are read at the start of the run.
  try {
    ckpt::check_resumable(dir, cfg.model.n_params(), ckpt::CheckpointMeta{}, ckpt::LoadOptions{});
  } catch (const std::exception& e) {
    throw std::runtime_error(cfg.in_file(key + ": " + e.what()));
  }
  std::ifstream in(dir + "/manifest.json");
  const std::string got = nlohmann::json::parse(in).at("manifest_xxh3").get<std::string>();
  if (!cfg.init.checkpoint_xxh3.empty() && got != cfg.init.checkpoint_xxh3)
    throw std::runtime_error(cfg.in_file(key + ": " + dir + "/manifest.json has manifest_xxh3 " + got +
                                         " but init.checkpoint_xxh3 is " + cfg.init.checkpoint_xxh3 +
                                         "; point init.checkpoint at the checkpoint the config pins, or drop "
                                         "init.checkpoint_xxh3 to take this one"));
  cfg.init.checkpoint_xxh3 = got;
}

void resolve_hf_init(TrainConfig& cfg) {
  if (cfg.init.hf_dir.empty()) return;
  cfg.init.hf_sha256 = pinned_hf_sha256(cfg);
}

}  // namespace olmoref
