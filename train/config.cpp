#include "train/config.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>
#include <xxhash.h>
#include <cstdio>

namespace olmoref {

namespace {

[[noreturn]] void fail(const std::string& origin, const std::string& msg) {
  throw std::invalid_argument(origin + ": " + msg);
}

// Applies "section.key=value" to the parsed table before anything reads it, so an override is
// validated exactly like a value written in the file.
void apply_override(toml::table& root, const std::string& ov, const std::string& origin) {
  const auto eq = ov.find('=');
  if (eq == std::string::npos) fail(origin, "override '" + ov + "' must look like section.key=value");
  const std::string path = ov.substr(0, eq), value = ov.substr(eq + 1);
  const auto dot = path.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == path.size())
    fail(origin, "override '" + ov + "': the key must be section.key (e.g. optim.lr=1e-3)");
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word: take it as a string
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* sec = root[section].as_table();
  if (!sec) fail(origin, "override '" + ov + "': '" + section + "' is not a section");
  sec->insert_or_assign(key, *parsed["v"].node());
}

class Reader {
 public:
  Reader(const toml::table& root, std::string origin) : root_(root), origin_(std::move(origin)) {}

  template <typename T>
  void get(const std::string& section, const std::string& key, T& out) {
    seen_.insert(section + "." + key);
    const toml::node* n = root_.at_path(section + "." + key).node();
    if (!n) return;
    if constexpr (std::is_same_v<T, std::string>) {
      if (!n->is_string()) bad(section, key, "a string");
      out = n->value<std::string>().value();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!n->is_boolean()) bad(section, key, "true or false");
      out = n->value<bool>().value();
    } else if constexpr (std::is_integral_v<T>) {
      if (!n->is_integer()) bad(section, key, "an integer");
      out = static_cast<T>(n->value<int64_t>().value());
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!n->is_number()) bad(section, key, "a number");
      out = static_cast<T>(n->value<double>().value());
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      const toml::array* a = n->as_array();
      if (!a) bad(section, key, "an array of integers");
      out.clear();
      for (const auto& e : *a) {
        if (!e.is_integer()) bad(section, key, "an array of integers");
        out.push_back(e.value<int64_t>().value());
      }
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      out.clear();
      if (n->is_string()) {
        out.push_back(n->value<std::string>().value());
        return;
      }
      const toml::array* a = n->as_array();
      if (!a) bad(section, key, "a string or an array of strings");
      for (const auto& e : *a) {
        if (!e.is_string()) bad(section, key, "an array of strings");
        out.push_back(e.value<std::string>().value());
      }
    }
  }

  // The node itself, for values with a structure of their own (marked as read; nullptr when absent).
  const toml::node* raw(const std::string& section, const std::string& key) {
    seen_.insert(section + "." + key);
    return root_.at_path(section + "." + key).node();
  }

  bool has(const std::string& section, const std::string& key) const {
    return root_.at_path(section + "." + key).node() != nullptr;
  }

  // Every key in the file must have been read by someone: a typo is an error, never ignored.
  void reject_unknown() const {
    for (const auto& [sec, node] : root_) {
      const toml::table* t = node.as_table();
      const std::string s(sec.str());
      if (!t) fail(origin_, "unknown top-level key '" + s + "' (expected sections [model], [train], [optim], [schedule], [data], [checkpoint], [eval], [init])");
      for (const auto& [k, v] : *t) {
        (void)v;
        const std::string full = s + "." + std::string(k.str());
        if (!seen_.count(full)) fail(origin_, "unknown config key '" + full + "'");
      }
    }
  }

  [[noreturn]] void bad(const std::string& section, const std::string& key, const std::string& want) const {
    fail(origin_, "config key '" + section + "." + key + "' must be " + want);
  }

 private:
  const toml::table& root_;
  std::string origin_;
  std::set<std::string> seen_;
};

// [[optim.group_overrides]] tables as OLMo-core's OptimGroupOverride: params (names or fnmatch wildcards) and opts.
void read_group_overrides(const toml::node& n, const std::string& origin, AdamWConfig& o) {
  const std::string key = "config key 'optim.group_overrides'";
  const std::string shape = " must be an array of tables {params = [\"embeddings.weight\", ...], opts = {weight_decay = 0.0, lr = ...}}";
  const toml::array* a = n.as_array();
  if (!a) fail(origin, key + shape);
  o.group_overrides_set = true;
  o.group_overrides.clear();
  for (size_t g = 0; g < a->size(); ++g) {
    const std::string at = key + " group " + std::to_string(g);
    const toml::table* t = (*a)[g].as_table();
    if (!t) fail(origin, key + shape);
    ParamGroupOverride go;
    for (const auto& [k, v] : *t) {
      const std::string name(k.str());
      if (name == "params") {
        if (v.is_string()) {
          go.params.push_back(v.value<std::string>().value());
        } else if (const toml::array* ps = v.as_array()) {
          for (const auto& e : *ps) {
            if (!e.is_string()) fail(origin, at + ": 'params' must be strings (parameter names or wildcards)");
            go.params.push_back(e.value<std::string>().value());
          }
        } else {
          fail(origin, at + ": 'params' must be a string or an array of strings");
        }
      } else if (name == "opts") {
        const toml::table* opts = v.as_table();
        if (!opts) fail(origin, at + ": 'opts' must be a table such as {weight_decay = 0.0}");
        for (const auto& [ok, ov] : *opts) {
          const std::string opt(ok.str());
          if (opt != "lr" && opt != "weight_decay")
            fail(origin, at + ": option '" + opt + "' is not supported (olmoref takes lr and weight_decay per group)");
          if (!ov.is_number()) fail(origin, at + ": option '" + opt + "' must be a number");
          const double x = ov.value<double>().value();
          if (!(x >= 0 && std::isfinite(x))) fail(origin, at + ": option '" + opt + "' must be finite and >= 0");
          (opt == "lr" ? go.lr : go.weight_decay) = x;
        }
      } else {
        fail(origin, at + ": unknown key '" + name + "' (expected params and opts)");
      }
    }
    if (go.params.empty()) fail(origin, at + ": 'params' is missing or empty");
    o.group_overrides.push_back(std::move(go));
  }
}

}  // namespace

TrainConfig parse_config_text(const std::string& toml_text, const std::string& origin,
                              const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "TOML syntax error at line " << e.source().begin.line << ", column " << e.source().begin.column << ": "
        << e.description();
    fail(origin, msg.str());
  }
  for (const auto& ov : overrides) apply_override(root, ov, origin);

  TrainConfig c;
  c.source_path = origin;
  c.overrides = overrides;
  Reader r(root, origin);
  ModelConfig& m = c.model;
  r.get("model", "name", m.name);
  r.get("model", "vocab_size", m.vocab_size);
  r.get("model", "d_model", m.d_model);
  r.get("model", "n_layers", m.n_layers);
  r.get("model", "n_heads", m.n_heads);
  m.n_kv_heads = -1;
  r.get("model", "n_kv_heads", m.n_kv_heads);
  if (m.n_kv_heads == -1) m.n_kv_heads = m.n_heads;
  r.get("model", "head_dim", m.head_dim);
  if (!r.has("model", "head_dim") && m.n_heads > 0) {
    if (m.d_model % m.n_heads != 0)
      fail(origin, "config key 'model.d_model' (" + std::to_string(m.d_model) + ") must be divisible by model.n_heads (" +
                       std::to_string(m.n_heads) + "), or set model.head_dim explicitly");
    m.head_dim = m.d_model / m.n_heads;
  }
  // FFN width as OLMo-core derives it unless given: int(8d/3), times the multiplier, rounded up.
  int64_t multiple_of = 256;
  double multiplier = 1.0;
  r.get("model", "ffn_multiple_of", multiple_of);
  r.get("model", "ffn_multiplier", multiplier);
  r.get("model", "ffn_hidden", m.ffn_hidden);
  if (!r.has("model", "ffn_hidden") && m.d_model > 0) {
    if (multiple_of <= 0) fail(origin, "config key 'model.ffn_multiple_of' must be > 0");
    int64_t h = static_cast<int64_t>(8.0 * static_cast<double>(m.d_model) / 3.0);
    h = static_cast<int64_t>(multiplier * static_cast<double>(h));
    m.ffn_hidden = multiple_of * ((h + multiple_of - 1) / multiple_of);
  }
  r.get("model", "rope_theta", m.rope_theta);
  r.get("model", "norm_eps", m.norm_eps);
  r.get("model", "swa_pattern", m.swa_pattern);
  r.get("model", "init_std", m.init_std);
  int64_t init_seed = 0;
  r.get("model", "init_seed", init_seed);
  if (init_seed < 0) r.bad("model", "init_seed", "an integer >= 0");
  m.init_seed = static_cast<uint64_t>(init_seed);
  // Mixture of experts (docs/canonical/moe.md): flat model.moe_* keys, as `--set model.moe_experts=8` reads them.
  r.get("model", "moe_experts", m.moe.n_experts);
  r.get("model", "moe_top_k", m.moe.top_k);
  r.get("model", "moe_hidden", m.moe.hidden);
  r.get("model", "moe_shared_hidden", m.moe.shared_hidden);
  r.get("model", "moe_lb_loss_weight", m.moe.lb_loss_weight);
  r.get("model", "moe_z_loss_weight", m.moe.z_loss_weight);
  r.get("model", "moe_scale_loss_by_num_layers", m.moe.scale_loss_by_num_layers);
  r.get("model", "moe_normalize_expert_weights", m.moe.normalize_expert_weights);
  {
    std::string g = "instance";
    r.get("model", "moe_lb_granularity", g);
    if (g == "instance")
      m.moe.lb_granularity = MoELbGranularity::instance;
    else if (g == "local_batch")
      m.moe.lb_granularity = MoELbGranularity::local_batch;
    else
      r.bad("model", "moe_lb_granularity",
            "\"instance\" (layout-free, the default) or \"local_batch\" (OLMo-core's default: the loss then depends on "
            "the micro-batch size and the data-parallel layout)");
  }
  if (m.moe.n_experts == 0)
    for (const char* key : {"moe_top_k", "moe_hidden", "moe_shared_hidden", "moe_lb_loss_weight", "moe_z_loss_weight",
                            "moe_scale_loss_by_num_layers", "moe_lb_granularity", "moe_normalize_expert_weights"})
      if (r.has("model", key))
        fail(origin, std::string("config key 'model.") + key + "' is set but model.moe_experts is 0 (a dense model); "
                     "set model.moe_experts to the number of experts, or remove the key");

  TrainLoopConfig& t = c.train;
  r.get("train", "seq_len", t.seq_len);
  r.get("train", "micro_batch_instances", t.micro_batch_instances);
  r.get("train", "global_batch_instances", t.global_batch_instances);
  r.get("train", "steps", t.steps);
  r.get("train", "z_loss", t.z_loss);
  r.get("train", "precision", t.precision);
  r.get("train", "executor", t.executor);
  r.get("train", "log_every", t.log_every);

  AdamWConfig& o = c.optim;
  r.get("optim", "lr", o.lr);
  r.get("optim", "beta1", o.beta1);
  r.get("optim", "beta2", o.beta2);
  r.get("optim", "eps", o.eps);
  r.get("optim", "weight_decay", o.weight_decay);
  r.get("optim", "max_grad_norm", o.max_grad_norm);
  r.get("optim", "kind", o.kind);
  r.get("optim", "rolling_interval_length", o.rolling_interval_length);
  r.get("optim", "sigma_factor", o.sigma_factor);
  r.get("optim", "step_increment_bugfix", o.step_increment_bugfix);
  if (const toml::node* n = r.raw("optim", "group_overrides")) read_group_overrides(*n, origin, o);

  ScheduleConfig& s = c.schedule;
  r.get("schedule", "kind", s.kind);
  r.get("schedule", "units", s.units);
  r.get("schedule", "warmup", s.warmup);
  r.get("schedule", "warmup_fraction", s.warmup_fraction);
  r.get("schedule", "warmup_min_lr", s.warmup_min_lr);
  r.get("schedule", "alpha_f", s.alpha_f);
  r.get("schedule", "t_max", s.t_max);
  r.get("schedule", "decay", s.decay);
  r.get("schedule", "decay_fraction", s.decay_fraction);
  r.get("schedule", "decay_min_lr", s.decay_min_lr);
  // OLMo-core takes exactly one of each pair; a written negative would read as "not set", so it is refused here.
  if (r.has("schedule", "warmup_fraction")) {
    if (!(s.warmup_fraction >= 0 && s.warmup_fraction <= 1)) r.bad("schedule", "warmup_fraction", "a number in [0, 1]");
    if (r.has("schedule", "warmup") && s.warmup != 0)
      fail(origin, "config keys 'schedule.warmup' and 'schedule.warmup_fraction': give one of them, not both (as OLMo-core requires)");
  }
  if (r.has("schedule", "decay")) {
    if (s.decay < 0) r.bad("schedule", "decay", "an integer >= 0 (or leave it out: schedule.decay_fraction decides)");
    if (r.has("schedule", "decay_fraction"))
      fail(origin, "config keys 'schedule.decay' and 'schedule.decay_fraction': give one of them, not both (as OLMo-core requires)");
  }

  DataConfig& d = c.data;
  r.get("data", "train_files", d.train_files);
  r.get("data", "train_mix", d.train_mix);
  r.get("data", "holdout_files", d.holdout_files);
  r.get("data", "holdout_mix", d.holdout_mix);
  r.get("data", "dtype", d.dtype);
  int64_t seed = static_cast<int64_t>(d.seed);
  r.get("data", "seed", seed);
  d.seed = static_cast<uint64_t>(seed);
  r.get("data", "audit", d.audit);
  r.get("data", "eos_id", d.eos_id);
  r.get("data", "max_target_sequence_length", d.max_target_sequence_length);
  r.get("data", "mix_base_dir", d.mix_base_dir);
  r.get("data", "mix_tokenizer", d.mix_tokenizer);
  r.get("data", "pad_id", d.pad_id);
  r.get("data", "bos_id", d.bos_id);
  r.get("data", "olmo_core_state", d.olmo_core_state);

  CheckpointConfig& k = c.checkpoint;
  r.get("checkpoint", "interval", k.interval);
  r.get("checkpoint", "keep_last", k.keep_last);
  r.get("checkpoint", "zstd_level", k.zstd_level);
  r.get("checkpoint", "zstd_threads", k.zstd_threads);

  EvalConfig& ev = c.eval;
  r.get("eval", "interval", ev.interval);
  r.get("eval", "instances", ev.instances);
  r.get("eval", "fresh_files", ev.fresh_files);
  r.get("eval", "fresh_mix", ev.fresh_mix);
  r.get("eval", "bootstrap", ev.bootstrap);
  r.get("eval", "alpha", ev.alpha);
  int64_t eval_seed = static_cast<int64_t>(ev.seed);
  r.get("eval", "seed", eval_seed);
  ev.seed = static_cast<uint64_t>(eval_seed);

  r.get("init", "hf_dir", c.init.hf_dir);
  r.get("init", "hf_sha256", c.init.hf_sha256);

  r.reject_unknown();
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    fail(origin, e.what());
  }
  return c;
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(path + ": cannot open config file (check the path; shipped configs are in configs/)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config_text(ss.str(), path, overrides);
}

void TrainConfig::validate() const {
  model.validate();
  auto require = [](bool ok, const std::string& key, const std::string& why) {
    if (!ok) throw std::invalid_argument("config key '" + key + "': " + why);
  };
  require(train.seq_len >= 2, "train.seq_len", "must be >= 2 (one target needs two tokens)");
  require(train.micro_batch_instances > 0, "train.micro_batch_instances", "must be > 0");
  require(train.global_batch_instances > 0, "train.global_batch_instances", "must be > 0");
  require(train.steps >= 0, "train.steps", "must be >= 0");
  require(train.z_loss >= 0, "train.z_loss", "must be >= 0");
  require(train.precision == "fp32" || train.precision == "bf16", "train.precision",
          "must be \"fp32\" or \"bf16\" (the Olmo 3 recipe, docs/canonical/bf16.md)");
  require(train.executor == "cpu" || train.executor == "cuda" || train.executor == "cuda-host", "train.executor",
          "must be \"cpu\", \"cuda\" (the GPU) or \"cuda-host\" (the CUDA kernels executed on the host: a slow check)");
  require(train.log_every > 0, "train.log_every", "must be > 0");
  // The model refuses it too (model/olmo3.cpp), but only here does the error name the config file.
  require(!(model.moe.enabled() && train.precision != "fp32"), "train.precision",
          "mixture-of-experts models train in fp32 only so far (bf16 MoE is not implemented yet); set "
          "train.precision=\"fp32\"");
  // Every comparison below is false for NaN, so NaN is refused with the range; infinities need their own test.
  require(std::isfinite(train.z_loss), "train.z_loss", "must be finite");
  require(optim.lr >= 0 && std::isfinite(optim.lr), "optim.lr", "must be finite and >= 0");
  require(optim.beta1 >= 0 && optim.beta1 < 1, "optim.beta1", "must be in [0, 1)");
  require(optim.beta2 >= 0 && optim.beta2 < 1, "optim.beta2", "must be in [0, 1)");
  require(optim.eps > 0 && std::isfinite(optim.eps), "optim.eps", "must be finite and > 0");
  require(optim.weight_decay >= 0 && std::isfinite(optim.weight_decay), "optim.weight_decay", "must be finite and >= 0");
  require(optim.max_grad_norm > 0, "optim.max_grad_norm",
          "must be > 0 (the clipping threshold; write inf to train without clipping)");
  require(optim.kind == "adamw" || optim.kind == "skip_step_adamw", "optim.kind",
          "must be \"adamw\" or \"skip_step_adamw\" (OLMo-core's SkipStepAdamW, the Olmo 3 scripts' optimizer)");
  if (!optim.skip_step()) {
    require(optim.rolling_interval_length == 128, "optim.rolling_interval_length", "applies to optim.kind = \"skip_step_adamw\" only");
    require(optim.sigma_factor == 6, "optim.sigma_factor", "applies to optim.kind = \"skip_step_adamw\" only");
    require(optim.step_increment_bugfix, "optim.step_increment_bugfix", "applies to optim.kind = \"skip_step_adamw\" only");
  }
  require(optim.rolling_interval_length >= 1, "optim.rolling_interval_length", "must be >= 1 (OLMo-core's default: 128)");
  require(std::isfinite(optim.sigma_factor), "optim.sigma_factor", "must be finite (OLMo-core's default: 6)");
  // Every group's peak must admit the schedule's floors; the patterns must match (OLMo-core's strict build).
  const std::vector<ParamGroup> groups = param_groups(optim, ParamLayout(model));
  for (const ParamGroup& g : groups) validate_schedule(schedule, g.lr);
  require(data.dtype == "auto" || data.dtype == "u16" || data.dtype == "u32", "data.dtype", "must be \"u16\", \"u32\" or \"auto\"");
  require(data.eos_id == -1 || (data.eos_id >= 0 && data.eos_id < model.vocab_size), "data.eos_id",
          "must be a token id below model.vocab_size (" + std::to_string(model.vocab_size) + "), or -1 for none");
  require(data.max_target_sequence_length == 0 ||
              (data.max_target_sequence_length >= train.seq_len && data.max_target_sequence_length % train.seq_len == 0),
          "data.max_target_sequence_length",
          "must be 0 (none) or a multiple of train.seq_len (" + std::to_string(train.seq_len) + "), as OLMo-core requires");
  require(data.pad_id >= -1 && data.pad_id < model.vocab_size, "data.pad_id",
          "must be a token id below model.vocab_size, or -1 (unknown)");
  require(data.bos_id >= -1 && data.bos_id < model.vocab_size, "data.bos_id",
          "must be a token id below model.vocab_size, or -1 (none)");
  require(data.train_files.empty() || data.train_mix.empty(), "data.train_mix", "give either data.train_files or data.train_mix, not both");
  require(checkpoint.interval >= 0, "checkpoint.interval", "must be >= 0 (0 = only at the end)");
  require(checkpoint.keep_last >= 1, "checkpoint.keep_last", "must be >= 1");
  require(checkpoint.zstd_level >= 1 && checkpoint.zstd_level <= 22, "checkpoint.zstd_level", "must be in [1, 22]");
  require(checkpoint.zstd_threads >= 0, "checkpoint.zstd_threads", "must be >= 0 (0 = the run's threads)");
  require(data.holdout_files.empty() || data.holdout_mix.empty(), "data.holdout_mix", "give either data.holdout_files or data.holdout_mix, not both");
  require(eval.interval >= 0, "eval.interval", "must be >= 0 (0 = no in-loop evaluation)");
  require(eval.instances >= 2, "eval.instances", "must be >= 2 (the bootstrap needs a sample)");
  require(eval.bootstrap >= 10, "eval.bootstrap", "must be >= 10 resamples");
  require(eval.alpha > 0 && eval.alpha < 1, "eval.alpha", "must be in (0, 1)");
  require(eval.fresh_files.empty() || eval.fresh_mix.empty(), "eval.fresh_mix", "give either eval.fresh_files or eval.fresh_mix, not both");
  require(init.hf_sha256.empty() ||
              (init.hf_sha256.size() == 64 &&
               init.hf_sha256.find_first_not_of("0123456789abcdef") == std::string::npos),
          "init.hf_sha256", "must be 64 lowercase hex digits (a SHA-256, as sha256sum prints it)");
  if (eval.interval > 0) {
    require(!data.holdout_files.empty() || !data.holdout_mix.empty(), "eval.interval",
            "the holdout-vs-fresh backstop needs a holdout: set data.holdout_mix or data.holdout_files");
    require(!eval.fresh_files.empty() || !eval.fresh_mix.empty(), "eval.interval",
            "the backstop needs a sealed fresh split: set eval.fresh_mix or eval.fresh_files");
  }
}

std::string TrainConfig::to_toml() const {
  toml::array swa;
  for (int64_t w : model.swa_pattern) swa.push_back(w);
  auto strings = [](const std::vector<std::string>& v) {
    toml::array a;
    for (const auto& s : v) a.push_back(s);
    return a;
  };
  toml::table root{
      {"model", toml::table{{"name", model.name}, {"vocab_size", model.vocab_size}, {"d_model", model.d_model},
                            {"n_layers", model.n_layers}, {"n_heads", model.n_heads}, {"n_kv_heads", model.n_kv_heads},
                            {"head_dim", model.head_dim}, {"ffn_hidden", model.ffn_hidden},
                            {"rope_theta", model.rope_theta}, {"norm_eps", static_cast<double>(model.norm_eps)},
                            {"swa_pattern", swa}, {"init_std", model.init_std},
                            {"init_seed", static_cast<int64_t>(model.init_seed)}}},
      {"train", toml::table{{"seq_len", train.seq_len}, {"micro_batch_instances", train.micro_batch_instances},
                            {"global_batch_instances", train.global_batch_instances}, {"steps", train.steps},
                            {"z_loss", train.z_loss}, {"precision", train.precision}, {"executor", train.executor},
                            {"log_every", train.log_every}}},
      {"optim", toml::table{{"lr", optim.lr}, {"beta1", optim.beta1}, {"beta2", optim.beta2}, {"eps", optim.eps},
                            {"weight_decay", optim.weight_decay}, {"max_grad_norm", optim.max_grad_norm}}},
      {"schedule", toml::table{{"kind", schedule.kind}, {"warmup", schedule.warmup}, {"alpha_f", schedule.alpha_f},
                               {"t_max", schedule.t_max}}},
      {"data", toml::table{{"train_files", strings(data.train_files)}, {"train_mix", data.train_mix},
                           {"holdout_files", strings(data.holdout_files)}, {"holdout_mix", data.holdout_mix},
                           {"dtype", data.dtype}, {"seed", static_cast<int64_t>(data.seed)}, {"audit", data.audit},
                           {"eos_id", data.eos_id}}},
      {"checkpoint", toml::table{{"interval", checkpoint.interval}, {"keep_last", checkpoint.keep_last},
                                 {"zstd_level", checkpoint.zstd_level}, {"zstd_threads", checkpoint.zstd_threads}}},
      {"eval", toml::table{{"interval", eval.interval}, {"instances", eval.instances},
                           {"fresh_files", strings(eval.fresh_files)}, {"fresh_mix", eval.fresh_mix},
                           {"bootstrap", eval.bootstrap}, {"alpha", eval.alpha},
                           {"seed", static_cast<int64_t>(eval.seed)}}},
  };
  // Optimizer and schedule keys added with OLMo-core's optimizers and schedulers: written only when they differ
  // from the default, so existing configs, traces and resume hashes are what they were.
  if (model.moe.enabled()) {  // dense configs keep their text (and hashes) unchanged
    toml::table& mt = *root["model"].as_table();
    mt.insert("moe_experts", model.moe.n_experts);
    mt.insert("moe_top_k", model.moe.top_k);
    mt.insert("moe_hidden", model.moe.hidden);
    mt.insert("moe_shared_hidden", model.moe.shared_hidden);
    mt.insert("moe_lb_loss_weight", model.moe.lb_loss_weight);
    mt.insert("moe_z_loss_weight", model.moe.z_loss_weight);
    mt.insert("moe_scale_loss_by_num_layers", model.moe.scale_loss_by_num_layers);
    mt.insert("moe_normalize_expert_weights", model.moe.normalize_expert_weights);
    mt.insert("moe_lb_granularity",
              model.moe.lb_granularity == MoELbGranularity::instance ? "instance" : "local_batch");
  }
  toml::table& ot = *root["optim"].as_table();
  if (optim.kind != "adamw") ot.insert("kind", optim.kind);
  if (optim.rolling_interval_length != 128) ot.insert("rolling_interval_length", optim.rolling_interval_length);
  if (optim.sigma_factor != 6) ot.insert("sigma_factor", optim.sigma_factor);
  if (!optim.step_increment_bugfix) ot.insert("step_increment_bugfix", false);
  if (optim.group_overrides_set) {
    toml::array groups;
    for (const ParamGroupOverride& go : optim.group_overrides) {
      toml::table opts;
      if (go.lr >= 0) opts.insert("lr", go.lr);
      if (go.weight_decay >= 0) opts.insert("weight_decay", go.weight_decay);
      groups.push_back(toml::table{{"params", strings(go.params)}, {"opts", opts}});
    }
    ot.insert("group_overrides", groups);
  }
  toml::table& st = *root["schedule"].as_table();
  if (schedule.units != "steps") st.insert("units", schedule.units);
  if (schedule.warmup_fraction >= 0) st.insert("warmup_fraction", schedule.warmup_fraction);
  if (schedule.warmup_min_lr != 0) st.insert("warmup_min_lr", schedule.warmup_min_lr);
  if (schedule.decay != -1) st.insert("decay", schedule.decay);
  if (schedule.decay_fraction != 0.1) st.insert("decay_fraction", schedule.decay_fraction);
  if (schedule.decay_min_lr != 0) st.insert("decay_min_lr", schedule.decay_min_lr);
  // Written only when set, so the configs (and resume hashes) of runs without it stay as they were.
  if (data.max_target_sequence_length != 0)
    root["data"].as_table()->insert("max_target_sequence_length", data.max_target_sequence_length);
  if (!data.mix_base_dir.empty()) root["data"].as_table()->insert("mix_base_dir", data.mix_base_dir);
  if (!data.mix_tokenizer.empty()) root["data"].as_table()->insert("mix_tokenizer", data.mix_tokenizer);
  if (data.pad_id >= 0) root["data"].as_table()->insert("pad_id", data.pad_id);
  if (data.bos_id >= 0) root["data"].as_table()->insert("bos_id", data.bos_id);
  if (!data.olmo_core_state.empty()) root["data"].as_table()->insert("olmo_core_state", data.olmo_core_state);
  if (!init.hf_dir.empty() || !init.hf_sha256.empty())
    root.insert("init", toml::table{{"hf_dir", init.hf_dir}, {"hf_sha256", init.hf_sha256}});
  std::ostringstream out;
  out << toml::toml_formatter(root);
  return out.str();
}

namespace {
std::string hash_text(const std::string& s) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(s.data(), s.size())));
  return buf;
}
}  // namespace

std::string TrainConfig::model_hash() const {
  TrainConfig c;
  c.model = model;
  const std::string full = c.to_toml();
  return hash_text(full.substr(full.find("[model]")));
}

std::string TrainConfig::resume_hash() const {
  TrainConfig c = *this;
  c.train.log_every = 1;
  c.checkpoint = CheckpointConfig{};
  c.data.train_files.clear();
  c.data.train_mix.clear();
  c.data.holdout_files.clear();
  c.data.holdout_mix.clear();
  c.data.mix_base_dir.clear();  // where the files are, like the paths: the dataset fingerprint says what they hold
  c.data.mix_tokenizer.clear();
  c.data.pad_id = c.data.bos_id = -1;  // they only name OLMo-core's fingerprint; training never reads them
  c.data.olmo_core_state.clear();       // where the first run started; a resume continues from its checkpoint
  c.data.audit = false;
  c.model.name.clear();
  // Where the starting weights were read from does not matter, only which weights they were (their SHA-256).
  c.init.hf_dir.clear();
  // The micro-batch size only decides how many instances one forward/backward holds; the instance tree makes
  // it irrelevant to every bit (tier T6), so a resume may change it.
  c.train.micro_batch_instances = 1;
  // Every executor computes the same bits (tier T5), so a checkpoint written by one continues on another.
  c.train.executor = "cpu";
  // Evaluation never changes training: the [eval] section is left out of the hashed text entirely,
  // so the hash is also what it was before the section existed.
  std::string text = c.to_toml();
  if (const auto b = text.find("[eval]"); b != std::string::npos) {
    const auto e = text.find("\n[", b);
    text.erase(b, e == std::string::npos ? std::string::npos : e + 1 - b);
  }
  return hash_text(text);
}

std::string TrainConfig::pytorch_replay_unsupported() const {
  if (optim.skip_step())
    return "optim.kind = \"skip_step_adamw\": the PyTorch replays run plain AdamW (SkipStepAdamW is checked against "
           "OLMo-core's own optimizer by tests/optim)";
  if (optim.group_overrides_set)
    return "optim.group_overrides is set: the PyTorch replays use the Olmo 3 default groups (embeddings.weight "
           "without weight decay); remove the key to use them";
  return "";
}

}  // namespace olmoref
