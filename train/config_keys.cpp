#include "train/config_keys.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <variant>
#include <vector>

#include "model/olmo3.h"

namespace olmoref::config_keys {

void fail(const std::string& origin, const std::string& msg) { throw std::invalid_argument(origin + ": " + msg); }

template <typename T>
void Reader::get(const std::string& section, const std::string& key, T& out) {
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
    // uint64_t seeds too: read as TOML's int64 and reinterpreted, as they always were.
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
    if (n->is_string()) {  // one file needs no brackets
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

void Reader::reject_unknown() const {
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

namespace {

// ---- how a key reaches its value

// One generic lambda `[](auto& c) -> auto& { return c.train.seq_len; }` names the field for both the reader
// (TrainConfig&) and the writer (const TrainConfig&).
template <typename T>
struct Field {
  T& (*get)(TrainConfig&);
  const T& (*cget)(const TrainConfig&);
};

template <typename Locate>
auto field(Locate) {
  using T = std::remove_cvref_t<decltype(Locate{}(std::declval<TrainConfig&>()))>;
  return Field<T>{[](TrainConfig& c) -> T& { return Locate{}(c); },
                  [](const TrainConfig& c) -> const T& { return Locate{}(c); }};
}

// A value with a structure or spelling of its own. write == nullptr: an input of another key's derivation
// (read by that key's after_read), never written itself.
struct Custom {
  void (*read)(Reader&, TrainConfig&);
  void (*write)(const TrainConfig&, toml::table& section);
};

using Value = std::variant<Field<int64_t>, Field<uint64_t>, Field<double>, Field<float>, Field<bool>,
                           Field<std::string>, Field<std::vector<int64_t>>, Field<std::vector<std::string>>, Custom>;

// When the resolved TOML holds the key. Keys added after configs, traces and resume hashes were published are
// written only when they say something, so the text (and the hashes) of every run without them stay as they were.
enum class Written {
  always,
  unless_default,  // differs from a default-constructed TrainConfig
  with_moe,        // model.moe_experts > 0: dense configs keep their text
  with_init,       // init.hf_dir or init.hf_sha256 set: the section appears only for runs started from weights
  with_init_checkpoint,  // init.checkpoint or init.checkpoint_xxh3 set: runs that start from a checkpoint
  with_rope_scaling,  // model.rope_scaling is not "none": configs without it keep their text
};

// What the resume hash sees of the key: what must match to resume a run bit for bit.
enum class Resume {
  enters,    // shapes the numbers
  neutral,   // never changes a bit (paths, logging, checkpointing, micro-batch size, executor): hashed at its default
  blank,     // hashed empty (model.name: its default "custom" was never the hashed value)
  left_out,  // the [eval] section: evaluation never changes training, and the hash predates the section
};

struct Key;
using AfterRead = void (*)(Reader&, TrainConfig&, const Key&);
using Why = std::string;  // "" when the value is fine
using Check = Why (*)(const TrainConfig&);

struct Key {
  const char* section;
  const char* name;
  Value value;
  Written written = Written::always;
  Resume resume = Resume::enters;
  // Right after the key is read, present or not: values derived from other keys, checks of what the file itself
  // gave (errors "config key 'K' must be ...").
  AfterRead after_read = nullptr;
  // Validation of the resolved value, also for configs built in code (errors "config key 'K': why").
  Check check = nullptr;
};

// ---- the read-time rules

// OLMo-core's n_kv_heads defaults to n_heads (MHA); -1 written in a file means the same.
void kv_heads_default_to_heads(Reader&, TrainConfig& c, const Key&) {
  if (c.model.n_kv_heads == -1) c.model.n_kv_heads = c.model.n_heads;
}

void head_dim_from_d_model(Reader& r, TrainConfig& c, const Key&) {
  ModelConfig& m = c.model;
  if (r.has("model", "head_dim") || m.n_heads <= 0) return;
  if (m.d_model % m.n_heads != 0)
    fail(r.origin(), "config key 'model.d_model' (" + std::to_string(m.d_model) + ") must be divisible by model.n_heads (" +
                         std::to_string(m.n_heads) + "), or set model.head_dim explicitly");
  m.head_dim = m.d_model / m.n_heads;
}

// FFN width as OLMo-core derives it unless given: int(8d/3), times the multiplier, rounded up to a multiple.
void ffn_hidden_from_d_model(Reader& r, TrainConfig& c, const Key&) {
  int64_t multiple_of = 256;
  double multiplier = 1.0;
  r.get("model", "ffn_multiple_of", multiple_of);
  r.get("model", "ffn_multiplier", multiplier);
  ModelConfig& m = c.model;
  if (r.has("model", "ffn_hidden") || m.d_model <= 0) return;
  if (multiple_of <= 0) fail(r.origin(), "config key 'model.ffn_multiple_of' must be > 0");
  int64_t h = static_cast<int64_t>(8.0 * static_cast<double>(m.d_model) / 3.0);
  h = static_cast<int64_t>(multiplier * static_cast<double>(h));
  m.ffn_hidden = multiple_of * ((h + multiple_of - 1) / multiple_of);
}

// Read as TOML's int64: a negative seed would wrap to a huge unsigned one.
void init_seed_not_negative(Reader& r, TrainConfig& c, const Key&) {
  if (c.model.init_seed > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    r.bad("model", "init_seed", "an integer >= 0");
}

// A routed-expert setting on a dense model would be silently ignored.
void moe_key_needs_experts(Reader& r, TrainConfig& c, const Key& k) {
  if (c.model.moe.n_experts == 0 && r.has("model", k.name))
    fail(r.origin(), std::string("config key 'model.") + k.name + "' is set but model.moe_experts is 0 (a dense model); "
                     "set model.moe_experts to the number of experts, or remove the key");
}

// OLMo-core takes exactly one of each pair; a written negative would read as "not set", so it is refused here.
void warmup_fraction_alone(Reader& r, TrainConfig& c, const Key&) {
  const ScheduleConfig& s = c.schedule;
  if (!r.has("schedule", "warmup_fraction")) return;
  if (!(s.warmup_fraction >= 0 && s.warmup_fraction <= 1)) r.bad("schedule", "warmup_fraction", "a number in [0, 1]");
  if (r.has("schedule", "warmup") && s.warmup != 0)
    fail(r.origin(), "config keys 'schedule.warmup' and 'schedule.warmup_fraction': give one of them, not both (as OLMo-core requires)");
}

void decay_alone(Reader& r, TrainConfig& c, const Key&) {
  if (!r.has("schedule", "decay")) return;
  if (c.schedule.decay < 0) r.bad("schedule", "decay", "an integer >= 0 (or leave it out: schedule.decay_fraction decides)");
  if (r.has("schedule", "decay_fraction"))
    fail(r.origin(), "config keys 'schedule.decay' and 'schedule.decay_fraction': give one of them, not both (as OLMo-core requires)");
}

// ---- values with a structure of their own

void read_lb_granularity(Reader& r, TrainConfig& c) {
  std::string g = "instance";
  r.get("model", "moe_lb_granularity", g);
  if (g == "instance")
    c.model.moe.lb_granularity = MoELbGranularity::instance;
  else if (g == "local_batch")
    c.model.moe.lb_granularity = MoELbGranularity::local_batch;
  else
    r.bad("model", "moe_lb_granularity",
          "\"instance\" (layout-free, the default) or \"local_batch\" (OLMo-core's default: the loss then depends on "
          "the micro-batch size and the data-parallel layout)");
}

void write_lb_granularity(const TrainConfig& c, toml::table& t) {
  t.insert("moe_lb_granularity", c.model.moe.lb_granularity == MoELbGranularity::instance ? "instance" : "local_batch");
}

void read_rope_scaling(Reader& r, TrainConfig& c) {
  std::string kind = "none";
  r.get("model", "rope_scaling", kind);
  if (kind == "none")
    c.model.rope_scaling.kind = RopeScalingKind::none;
  else if (kind == "yarn")
    c.model.rope_scaling.kind = RopeScalingKind::yarn;
  else
    r.bad("model", "rope_scaling",
          "\"none\" (plain RoPE, the default) or \"yarn\" (YaRN, Olmo 3's long-context stage; its settings are the "
          "model.rope_yarn_* keys)");
}

void write_rope_scaling(const TrainConfig& c, toml::table& t) {
  t.insert("rope_scaling", c.model.rope_scaling.kind == RopeScalingKind::yarn ? "yarn" : "none");
}

// A YaRN setting without model.rope_scaling = "yarn" would be silently ignored.
void yarn_key_needs_yarn(Reader& r, TrainConfig& c, const Key& k) {
  if (!c.model.rope_scaling.on() && r.has("model", k.name))
    fail(r.origin(), std::string("config key 'model.") + k.name + "' is set but model.rope_scaling is \"none\"; set "
                     "model.rope_scaling = \"yarn\", or remove the key");
}

toml::array string_array(const std::vector<std::string>& v) {
  toml::array a;
  for (const auto& s : v) a.push_back(s);
  return a;
}

// [[optim.group_overrides]] tables as OLMo-core's OptimGroupOverride: params (names or fnmatch wildcards) and opts.
void read_group_overrides(Reader& r, TrainConfig& c) {
  const toml::node* n = r.raw("optim", "group_overrides");
  if (!n) return;
  const std::string& origin = r.origin();
  AdamWConfig& o = c.optim;
  const std::string key = "config key 'optim.group_overrides'";
  const std::string shape = " must be an array of tables {params = [\"embeddings.weight\", ...], opts = {weight_decay = 0.0, lr = ...}}";
  const toml::array* a = n->as_array();
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

// Written only when the file gave it (even empty): the Olmo 3 default groups are what an absent key means.
void write_group_overrides(const TrainConfig& c, toml::table& t) {
  if (!c.optim.group_overrides_set) return;
  toml::array groups;
  for (const ParamGroupOverride& go : c.optim.group_overrides) {
    toml::table opts;
    if (go.lr >= 0) opts.insert("lr", go.lr);
    if (go.weight_decay >= 0) opts.insert("weight_decay", go.weight_decay);
    groups.push_back(toml::table{{"params", string_array(go.params)}, {"opts", opts}});
  }
  t.insert("group_overrides", groups);
}

// ---- validation helpers

bool finite_nonneg(double x) { return x >= 0 && std::isfinite(x); }  // false for NaN, as every comparison is

Why token_id_below_vocab(int64_t id, const TrainConfig& c, const char* minus_one) {
  if (id >= -1 && id < c.model.vocab_size) return "";
  return std::string("must be a token id below model.vocab_size, or -1 (") + minus_one + ")";
}

Why one_of_files_or_mix(const std::vector<std::string>& files, const std::string& mix, const char* what) {
  return files.empty() || mix.empty() ? "" : std::string("give either ") + what;
}

const char* const kOnlySkipStep = "applies to optim.kind = \"skip_step_adamw\" only";

// ---- the table: read, checked and written in this order (the written TOML is sorted by toml++ regardless)

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      // [model]
      {"model", "name", field([](auto& c) -> auto& { return c.model.name; }), Written::always, Resume::blank},
      {"model", "vocab_size", field([](auto& c) -> auto& { return c.model.vocab_size; })},
      {"model", "d_model", field([](auto& c) -> auto& { return c.model.d_model; })},
      {"model", "n_layers", field([](auto& c) -> auto& { return c.model.n_layers; })},
      {"model", "n_heads", field([](auto& c) -> auto& { return c.model.n_heads; })},
      {"model", "n_kv_heads", field([](auto& c) -> auto& { return c.model.n_kv_heads; }), Written::always,
       Resume::enters, kv_heads_default_to_heads},
      {"model", "head_dim", field([](auto& c) -> auto& { return c.model.head_dim; }), Written::always, Resume::enters,
       head_dim_from_d_model},
      {"model", "ffn_multiple_of", Custom{nullptr, nullptr}},  // inputs of ffn_hidden's derivation
      {"model", "ffn_multiplier", Custom{nullptr, nullptr}},
      {"model", "ffn_hidden", field([](auto& c) -> auto& { return c.model.ffn_hidden; }), Written::always,
       Resume::enters, ffn_hidden_from_d_model},
      {"model", "rope_theta", field([](auto& c) -> auto& { return c.model.rope_theta; })},
      // Long-context RoPE scaling (core/model_config.h RopeScaling): written only when on, so every config without
      // it keeps its text and hashes.
      {"model", "rope_scaling", Custom{read_rope_scaling, write_rope_scaling}, Written::with_rope_scaling},
      {"model", "rope_yarn_factor", field([](auto& c) -> auto& { return c.model.rope_scaling.factor; }),
       Written::with_rope_scaling, Resume::enters, yarn_key_needs_yarn},
      {"model", "rope_yarn_beta_fast", field([](auto& c) -> auto& { return c.model.rope_scaling.beta_fast; }),
       Written::with_rope_scaling, Resume::enters, yarn_key_needs_yarn},
      {"model", "rope_yarn_beta_slow", field([](auto& c) -> auto& { return c.model.rope_scaling.beta_slow; }),
       Written::with_rope_scaling, Resume::enters, yarn_key_needs_yarn},
      {"model", "rope_yarn_old_context_len",
       field([](auto& c) -> auto& { return c.model.rope_scaling.old_context_len; }), Written::with_rope_scaling,
       Resume::enters, yarn_key_needs_yarn},
      {"model", "rope_scaling_full_attention_only",
       field([](auto& c) -> auto& { return c.model.rope_scaling.full_attention_only; }), Written::with_rope_scaling,
       Resume::enters, yarn_key_needs_yarn},
      {"model", "norm_eps", field([](auto& c) -> auto& { return c.model.norm_eps; })},
      {"model", "swa_pattern", field([](auto& c) -> auto& { return c.model.swa_pattern; })},
      {"model", "init_std", field([](auto& c) -> auto& { return c.model.init_std; })},
      {"model", "init_seed", field([](auto& c) -> auto& { return c.model.init_seed; }), Written::always,
       Resume::enters, init_seed_not_negative},
      // Mixture of experts (docs/canonical/moe.md): flat model.moe_* keys, as `--set model.moe_experts=8` reads them.
      {"model", "moe_experts", field([](auto& c) -> auto& { return c.model.moe.n_experts; }), Written::with_moe},
      {"model", "moe_top_k", field([](auto& c) -> auto& { return c.model.moe.top_k; }), Written::with_moe,
       Resume::enters, moe_key_needs_experts},
      {"model", "moe_hidden", field([](auto& c) -> auto& { return c.model.moe.hidden; }), Written::with_moe,
       Resume::enters, moe_key_needs_experts},
      {"model", "moe_shared_hidden", field([](auto& c) -> auto& { return c.model.moe.shared_hidden; }),
       Written::with_moe, Resume::enters, moe_key_needs_experts},
      {"model", "moe_lb_loss_weight", field([](auto& c) -> auto& { return c.model.moe.lb_loss_weight; }),
       Written::with_moe, Resume::enters, moe_key_needs_experts},
      {"model", "moe_z_loss_weight", field([](auto& c) -> auto& { return c.model.moe.z_loss_weight; }),
       Written::with_moe, Resume::enters, moe_key_needs_experts},
      {"model", "moe_scale_loss_by_num_layers",
       field([](auto& c) -> auto& { return c.model.moe.scale_loss_by_num_layers; }), Written::with_moe,
       Resume::enters, moe_key_needs_experts},
      {"model", "moe_normalize_expert_weights",
       field([](auto& c) -> auto& { return c.model.moe.normalize_expert_weights; }), Written::with_moe,
       Resume::enters, moe_key_needs_experts},
      {"model", "moe_lb_granularity", Custom{read_lb_granularity, write_lb_granularity}, Written::with_moe,
       Resume::enters, moe_key_needs_experts},

      // [train]
      {"train", "seq_len", field([](auto& c) -> auto& { return c.train.seq_len; }), Written::always, Resume::enters,
       nullptr, [](const TrainConfig& c) -> Why { return c.train.seq_len >= 2 ? "" : "must be >= 2 (one target needs two tokens)"; }},
      // The instance tree makes the micro-batch size irrelevant to every bit (tier T6): a resume may change it.
      {"train", "micro_batch_instances", field([](auto& c) -> auto& { return c.train.micro_batch_instances; }),
       Written::always, Resume::neutral, nullptr,
       [](const TrainConfig& c) -> Why { return c.train.micro_batch_instances > 0 ? "" : "must be > 0"; }},
      {"train", "global_batch_instances", field([](auto& c) -> auto& { return c.train.global_batch_instances; }),
       Written::always, Resume::enters, nullptr,
       // Instance ids are 32-bit (the data order's permutation, as numpy's uint32 one in OLMo-core), so no global batch
       // can hold more; refused here, for every command, before anything that grows with it is modelled or built.
       [](const TrainConfig& c) -> Why {
         if (c.train.global_batch_instances <= 0) return "must be > 0";
         return c.train.global_batch_instances <= int64_t{0xFFFFFFFF}
                    ? ""
                    : "must be at most 4294967295 (instance ids are 32-bit); the training data bounds it further";
       }},
      {"train", "steps", field([](auto& c) -> auto& { return c.train.steps; }), Written::always, Resume::enters,
       nullptr, [](const TrainConfig& c) -> Why { return c.train.steps >= 0 ? "" : "must be >= 0"; }},
      {"train", "z_loss", field([](auto& c) -> auto& { return c.train.z_loss; }), Written::always, Resume::enters,
       nullptr, [](const TrainConfig& c) -> Why {
         if (!(c.train.z_loss >= 0)) return "must be >= 0";
         return std::isfinite(c.train.z_loss) ? "" : "must be finite";
       }},
      {"train", "precision", field([](auto& c) -> auto& { return c.train.precision; }), Written::always,
       Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         if (c.train.precision != "fp32" && c.train.precision != "bf16")
           return "must be \"fp32\" or \"bf16\" (the Olmo 3 recipe, docs/canonical/bf16.md)";
         // The model refuses it too (model/olmo3.cpp), but only here does the error name the config file.
         if (c.model.moe.enabled() && c.train.precision != "fp32")
           return "mixture-of-experts models train in fp32 only so far (bf16 MoE is not implemented yet); set "
                  "train.precision=\"fp32\"";
         return "";
       }},
      // Every executor computes the same bits (tier T5): a checkpoint written by one continues on another.
      {"train", "executor", field([](auto& c) -> auto& { return c.train.executor; }), Written::always,
       Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         const std::string& e = c.train.executor;
         return e == "cpu" || e == "cuda" || e == "cuda-host"
                    ? ""
                    : "must be \"cpu\", \"cuda\" (the GPU) or \"cuda-host\" (the CUDA kernels executed on the host: a slow check)";
       }},
      // Never changes a bit (the recompute runs the same ops on the same inputs): hashed at its default, and written
      // only when set, so the resolved text and both hashes of every config without it stay as they were and a
      // checkpoint written before the key existed (or with the other mode) resumes.
      {"train", "activation_checkpointing", field([](auto& c) -> auto& { return c.train.activation_checkpointing; }),
       Written::unless_default, Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         const std::string& m = c.train.activation_checkpointing;
         if (m == "none" || m == "full" || m == "selected_blocks") return "";
         return "is \"" + m + "\"; " + activation_checkpointing_modes();
       }},
      // Which blocks selected_blocks recomputes (OLMo-core's block_interval): blocks 0, n, 2n, ... Never changes a bit,
      // like the mode.
      {"train", "activation_checkpointing_block_interval",
       field([](auto& c) -> auto& { return c.train.activation_checkpointing_block_interval; }), Written::unless_default,
       Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         const int64_t n = c.train.activation_checkpointing_block_interval;
         if (c.train.activation_checkpointing == "selected_blocks")
           return n >= 1 ? "" : "is " + std::to_string(n) + "; train.activation_checkpointing = \"selected_blocks\" needs "
                                "it >= 1 (blocks 0, n, 2n, ... are recomputed, as OLMo-core's block_interval)";
         return n == 0 ? "" : "is " + std::to_string(n) + " with train.activation_checkpointing = \"" +
                                  c.train.activation_checkpointing + "\": it applies to \"selected_blocks\" only; remove "
                                  "it or set that mode";
       }},
      // Never changes a bit (docs/canonical/context_parallel.md): hashed at its default and written only when set, so
      // a checkpoint resumes at any degree.
      {"train", "cp_degree", field([](auto& c) -> auto& { return c.train.cp_degree; }), Written::unless_default,
       Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         const int64_t n = c.train.cp_degree;
         if (n < 1) return "must be >= 1 (1: no context parallelism)";
         if (n == 1) return "";
         if (c.train.seq_len % n != 0)
           return "is " + std::to_string(n) + ", which does not divide train.seq_len = " +
                  std::to_string(c.train.seq_len) + ": each rank computes seq_len / cp_degree consecutive positions "
                  "of every instance; choose a divisor of seq_len";
         return "";
       }},
      {"train", "log_every", field([](auto& c) -> auto& { return c.train.log_every; }), Written::always,
       Resume::neutral, nullptr, [](const TrainConfig& c) -> Why { return c.train.log_every > 0 ? "" : "must be > 0"; }},

      // [optim]
      {"optim", "lr", field([](auto& c) -> auto& { return c.optim.lr; }), Written::always, Resume::enters, nullptr,
       [](const TrainConfig& c) -> Why { return finite_nonneg(c.optim.lr) ? "" : "must be finite and >= 0"; }},
      {"optim", "beta1", field([](auto& c) -> auto& { return c.optim.beta1; }), Written::always, Resume::enters,
       nullptr, [](const TrainConfig& c) -> Why { return c.optim.beta1 >= 0 && c.optim.beta1 < 1 ? "" : "must be in [0, 1)"; }},
      {"optim", "beta2", field([](auto& c) -> auto& { return c.optim.beta2; }), Written::always, Resume::enters,
       nullptr, [](const TrainConfig& c) -> Why { return c.optim.beta2 >= 0 && c.optim.beta2 < 1 ? "" : "must be in [0, 1)"; }},
      {"optim", "eps", field([](auto& c) -> auto& { return c.optim.eps; }), Written::always, Resume::enters, nullptr,
       [](const TrainConfig& c) -> Why { return c.optim.eps > 0 && std::isfinite(c.optim.eps) ? "" : "must be finite and > 0"; }},
      {"optim", "weight_decay", field([](auto& c) -> auto& { return c.optim.weight_decay; }), Written::always,
       Resume::enters, nullptr,
       [](const TrainConfig& c) -> Why { return finite_nonneg(c.optim.weight_decay) ? "" : "must be finite and >= 0"; }},
      {"optim", "max_grad_norm", field([](auto& c) -> auto& { return c.optim.max_grad_norm; }), Written::always,
       Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         return c.optim.max_grad_norm > 0 ? "" : "must be > 0 (the clipping threshold; write inf to train without clipping)";
       }},
      {"optim", "kind", field([](auto& c) -> auto& { return c.optim.kind; }), Written::unless_default,
       Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         return c.optim.kind == "adamw" || c.optim.kind == "skip_step_adamw"
                    ? ""
                    : "must be \"adamw\" or \"skip_step_adamw\" (OLMo-core's SkipStepAdamW, the Olmo 3 scripts' optimizer)";
       }},
      {"optim", "rolling_interval_length", field([](auto& c) -> auto& { return c.optim.rolling_interval_length; }),
       Written::unless_default, Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         if (!c.optim.skip_step() && c.optim.rolling_interval_length != 128) return kOnlySkipStep;
         return c.optim.rolling_interval_length >= 1 ? "" : "must be >= 1 (OLMo-core's default: 128)";
       }},
      {"optim", "sigma_factor", field([](auto& c) -> auto& { return c.optim.sigma_factor; }),
       Written::unless_default, Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         if (!c.optim.skip_step() && c.optim.sigma_factor != 6) return kOnlySkipStep;
         return std::isfinite(c.optim.sigma_factor) ? "" : "must be finite (OLMo-core's default: 6)";
       }},
      {"optim", "step_increment_bugfix", field([](auto& c) -> auto& { return c.optim.step_increment_bugfix; }),
       Written::unless_default, Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         return !c.optim.skip_step() && !c.optim.step_increment_bugfix ? kOnlySkipStep : "";
       }},
      {"optim", "group_overrides", Custom{read_group_overrides, write_group_overrides}},

      // [schedule]
      {"schedule", "kind", field([](auto& c) -> auto& { return c.schedule.kind; })},
      {"schedule", "units", field([](auto& c) -> auto& { return c.schedule.units; }), Written::unless_default},
      {"schedule", "warmup", field([](auto& c) -> auto& { return c.schedule.warmup; })},
      {"schedule", "warmup_fraction", field([](auto& c) -> auto& { return c.schedule.warmup_fraction; }),
       Written::unless_default, Resume::enters, warmup_fraction_alone},
      {"schedule", "warmup_min_lr", field([](auto& c) -> auto& { return c.schedule.warmup_min_lr; }),
       Written::unless_default},
      {"schedule", "alpha_f", field([](auto& c) -> auto& { return c.schedule.alpha_f; })},
      {"schedule", "t_max", field([](auto& c) -> auto& { return c.schedule.t_max; })},
      {"schedule", "decay", field([](auto& c) -> auto& { return c.schedule.decay; }), Written::unless_default,
       Resume::enters, decay_alone},
      {"schedule", "decay_fraction", field([](auto& c) -> auto& { return c.schedule.decay_fraction; }),
       Written::unless_default},
      {"schedule", "decay_min_lr", field([](auto& c) -> auto& { return c.schedule.decay_min_lr; }),
       Written::unless_default},

      // [data]: paths are not hashed (the dataset fingerprint says what the files hold)
      {"data", "train_files", field([](auto& c) -> auto& { return c.data.train_files; }), Written::always,
       Resume::neutral},
      {"data", "train_mix", field([](auto& c) -> auto& { return c.data.train_mix; }), Written::always,
       Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         return one_of_files_or_mix(c.data.train_files, c.data.train_mix, "data.train_files or data.train_mix, not both");
       }},
      {"data", "holdout_files", field([](auto& c) -> auto& { return c.data.holdout_files; }), Written::always,
       Resume::neutral},
      {"data", "holdout_mix", field([](auto& c) -> auto& { return c.data.holdout_mix; }), Written::always,
       Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         return one_of_files_or_mix(c.data.holdout_files, c.data.holdout_mix,
                                    "data.holdout_files or data.holdout_mix, not both");
       }},
      {"data", "dtype", field([](auto& c) -> auto& { return c.data.dtype; }), Written::always, Resume::enters,
       nullptr, [](const TrainConfig& c) -> Why {
         const std::string& d = c.data.dtype;
         return d == "auto" || d == "u16" || d == "u32" ? "" : "must be \"u16\", \"u32\" or \"auto\"";
       }},
      {"data", "seed", field([](auto& c) -> auto& { return c.data.seed; })},
      {"data", "audit", field([](auto& c) -> auto& { return c.data.audit; }), Written::always, Resume::neutral},
      {"data", "eos_id", field([](auto& c) -> auto& { return c.data.eos_id; }), Written::always, Resume::enters,
       nullptr, [](const TrainConfig& c) -> Why {
         const int64_t id = c.data.eos_id;
         return id == -1 || (id >= 0 && id < c.model.vocab_size)
                    ? ""
                    : "must be a token id below model.vocab_size (" + std::to_string(c.model.vocab_size) + "), or -1 for none";
       }},
      {"data", "document_masking", field([](auto& c) -> auto& { return c.data.document_masking; }),
       Written::unless_default, Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         return !c.data.document_masking || c.data.eos_id >= 0
                    ? ""
                    : "needs data.eos_id, the token that ends each document (100257 for the dolma2 tokenizer)";
       }},
      {"data", "max_target_sequence_length", field([](auto& c) -> auto& { return c.data.max_target_sequence_length; }),
       Written::unless_default, Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         const int64_t n = c.data.max_target_sequence_length, seq = c.train.seq_len;
         return n == 0 || (n >= seq && n % seq == 0)
                    ? ""
                    : "must be 0 (none) or a multiple of train.seq_len (" + std::to_string(seq) + "), as OLMo-core requires";
       }},
      // Where the files are, like the paths: the dataset fingerprint says what they hold.
      {"data", "mix_base_dir", field([](auto& c) -> auto& { return c.data.mix_base_dir; }), Written::unless_default,
       Resume::neutral},
      {"data", "mix_tokenizer", field([](auto& c) -> auto& { return c.data.mix_tokenizer; }), Written::unless_default,
       Resume::neutral},
      // They only name OLMo-core's dataset fingerprint; training never reads them.
      {"data", "pad_id", field([](auto& c) -> auto& { return c.data.pad_id; }), Written::unless_default,
       Resume::neutral, nullptr,
       [](const TrainConfig& c) -> Why { return token_id_below_vocab(c.data.pad_id, c, "unknown"); }},
      {"data", "bos_id", field([](auto& c) -> auto& { return c.data.bos_id; }), Written::unless_default,
       Resume::neutral, nullptr,
       [](const TrainConfig& c) -> Why { return token_id_below_vocab(c.data.bos_id, c, "none"); }},
      // Where the first run started; a resume continues from its checkpoint.
      {"data", "olmo_core_state", field([](auto& c) -> auto& { return c.data.olmo_core_state; }),
       Written::unless_default, Resume::neutral},

      // [checkpoint]: how often and how a run is saved never changes a bit of it
      {"checkpoint", "interval", field([](auto& c) -> auto& { return c.checkpoint.interval; }), Written::always,
       Resume::neutral, nullptr,
       [](const TrainConfig& c) -> Why { return c.checkpoint.interval >= 0 ? "" : "must be >= 0 (0 = only at the end)"; }},
      {"checkpoint", "keep_last", field([](auto& c) -> auto& { return c.checkpoint.keep_last; }), Written::always,
       Resume::neutral, nullptr,
       [](const TrainConfig& c) -> Why { return c.checkpoint.keep_last >= 1 ? "" : "must be >= 1"; }},
      {"checkpoint", "zstd_level", field([](auto& c) -> auto& { return c.checkpoint.zstd_level; }), Written::always,
       Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         return c.checkpoint.zstd_level >= 1 && c.checkpoint.zstd_level <= 22 ? "" : "must be in [1, 22]";
       }},
      {"checkpoint", "zstd_threads", field([](auto& c) -> auto& { return c.checkpoint.zstd_threads; }),
       Written::always, Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         return c.checkpoint.zstd_threads >= 0 ? "" : "must be >= 0 (0 = the run's threads)";
       }},

      // [eval]: the in-loop backstop never changes training
      {"eval", "interval", field([](auto& c) -> auto& { return c.eval.interval; }), Written::always,
       Resume::left_out, nullptr, [](const TrainConfig& c) -> Why {
         if (c.eval.interval < 0) return "must be >= 0 (0 = no in-loop evaluation)";
         if (c.eval.interval == 0) return "";
         if (c.data.holdout_files.empty() && c.data.holdout_mix.empty())
           return "the holdout-vs-fresh backstop needs a holdout: set data.holdout_mix or data.holdout_files";
         if (c.eval.fresh_files.empty() && c.eval.fresh_mix.empty())
           return "the backstop needs a sealed fresh split: set eval.fresh_mix or eval.fresh_files";
         return "";
       }},
      {"eval", "instances", field([](auto& c) -> auto& { return c.eval.instances; }), Written::always,
       Resume::left_out, nullptr, [](const TrainConfig& c) -> Why {
         return c.eval.instances >= 2 ? "" : "must be >= 2 (the bootstrap needs a sample)";
       }},
      {"eval", "fresh_files", field([](auto& c) -> auto& { return c.eval.fresh_files; }), Written::always,
       Resume::left_out},
      {"eval", "fresh_mix", field([](auto& c) -> auto& { return c.eval.fresh_mix; }), Written::always,
       Resume::left_out, nullptr, [](const TrainConfig& c) -> Why {
         return one_of_files_or_mix(c.eval.fresh_files, c.eval.fresh_mix, "eval.fresh_files or eval.fresh_mix, not both");
       }},
      {"eval", "bootstrap", field([](auto& c) -> auto& { return c.eval.bootstrap; }), Written::always,
       Resume::left_out, nullptr,
       [](const TrainConfig& c) -> Why { return c.eval.bootstrap >= 10 ? "" : "must be >= 10 resamples"; }},
      {"eval", "alpha", field([](auto& c) -> auto& { return c.eval.alpha; }), Written::always, Resume::left_out,
       nullptr, [](const TrainConfig& c) -> Why { return c.eval.alpha > 0 && c.eval.alpha < 1 ? "" : "must be in (0, 1)"; }},
      {"eval", "seed", field([](auto& c) -> auto& { return c.eval.seed; }), Written::always, Resume::left_out},

      // [init]: where the starting weights were read from does not matter, only which weights they were
      {"init", "hf_dir", field([](auto& c) -> auto& { return c.init.hf_dir; }), Written::with_init, Resume::neutral},
      {"init", "hf_sha256", field([](auto& c) -> auto& { return c.init.hf_sha256; }), Written::with_init,
       Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         const std::string& h = c.init.hf_sha256;
         return h.empty() || (h.size() == 64 && h.find_first_not_of("0123456789abcdef") == std::string::npos)
                    ? ""
                    : "must be 64 lowercase hex digits (a SHA-256, as sha256sum prints it)";
       }},
      // A new run from another run's checkpoint (Olmo 3 stage 2): which state it started from enters the hash, the
      // directory it was read from does not.
      {"init", "checkpoint", field([](auto& c) -> auto& { return c.init.checkpoint; }), Written::with_init_checkpoint,
       Resume::neutral, nullptr, [](const TrainConfig& c) -> Why {
         if (!c.init.checkpoint.empty() && (!c.init.hf_dir.empty() || !c.init.hf_sha256.empty()))
           return "is set together with init.hf_dir / init.hf_sha256, but a run starts from one set of weights: keep "
                  "init.checkpoint (an olmoref checkpoint) or init.hf_dir (Hugging Face weights), not both";
         return "";
       }},
      {"init", "load_optimizer", field([](auto& c) -> auto& { return c.init.load_optimizer; }),
       Written::with_init_checkpoint, Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         return c.init.load_optimizer || !c.init.checkpoint.empty() || !c.init.checkpoint_xxh3.empty()
                    ? ""
                    : "applies to init.checkpoint only (set init.checkpoint, or drop init.load_optimizer)";
       }},
      {"init", "checkpoint_xxh3", field([](auto& c) -> auto& { return c.init.checkpoint_xxh3; }),
       Written::with_init_checkpoint, Resume::enters, nullptr, [](const TrainConfig& c) -> Why {
         const std::string& h = c.init.checkpoint_xxh3;
         if (!h.empty() && (h.size() != 16 || h.find_first_not_of("0123456789abcdef") != std::string::npos))
           return "must be 16 lowercase hex digits (the source checkpoint's manifest_xxh3)";
         return "";
       }},
  };
  return table;
}

const TrainConfig& defaults() {
  static const TrainConfig d;
  return d;
}

bool is_written(const Key& k, const TrainConfig& c) {
  switch (k.written) {
    case Written::always: return true;
    case Written::with_moe: return c.model.moe.enabled();
    case Written::with_init: return !c.init.hf_dir.empty() || !c.init.hf_sha256.empty();
    case Written::with_init_checkpoint: return !c.init.checkpoint.empty() || !c.init.checkpoint_xxh3.empty();
    case Written::with_rope_scaling: return c.model.rope_scaling.on();
    case Written::unless_default:
      return std::visit(
          [&](const auto& v) {
            if constexpr (std::is_same_v<std::decay_t<decltype(v)>, Custom>) return true;
            else return v.cget(c) != v.cget(defaults());
          },
          k.value);
  }
  return true;
}

template <typename T>
void write_value(toml::table& t, const char* name, const T& v) {
  if constexpr (std::is_same_v<T, uint64_t>) {
    t.insert(name, static_cast<int64_t>(v));  // TOML integers are int64; seeds were always written so
  } else if constexpr (std::is_same_v<T, float>) {
    t.insert(name, static_cast<double>(v));
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    t.insert(name, string_array(v));
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    toml::array a;
    for (int64_t x : v) a.push_back(x);
    t.insert(name, a);
  } else {
    t.insert(name, v);
  }
}

}  // namespace

void read_keys(Reader& r, TrainConfig& c) {
  // Read as "not given", so an explicit -1 and an absent key both mean n_heads (kv_heads_default_to_heads).
  c.model.n_kv_heads = -1;
  for (const Key& k : keys()) {
    std::visit(
        [&](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, Custom>) {
            if (v.read) v.read(r, c);
          } else {
            r.get(k.section, k.name, v.get(c));
          }
        },
        k.value);
    if (k.after_read) k.after_read(r, c, k);
  }
}

void check_keys(const TrainConfig& c) {
  for (const Key& k : keys()) {
    if (!k.check) continue;
    const Why why = k.check(c);
    if (!why.empty()) throw std::invalid_argument("config key '" + std::string(k.section) + "." + k.name + "': " + why);
  }
}

toml::table write_keys(const TrainConfig& config, Purpose purpose) {
  TrainConfig c = config;
  if (purpose == Purpose::resume_hash) {
    for (const Key& k : keys()) {
      if (k.resume != Resume::neutral && k.resume != Resume::blank) continue;
      std::visit(
          [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (!std::is_same_v<V, Custom>) {
              using T = std::remove_cvref_t<decltype(v.get(c))>;
              v.get(c) = k.resume == Resume::blank ? T{} : v.cget(defaults());
            }
          },
          k.value);
    }
  }
  toml::table root;
  for (const Key& k : keys()) {
    if (purpose == Purpose::resume_hash && k.resume == Resume::left_out) continue;
    if (!is_written(k, c)) continue;
    if (!root.contains(k.section)) root.insert(k.section, toml::table{});
    toml::table& section = *root[k.section].as_table();
    std::visit(
        [&](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, Custom>) {
            if (v.write) v.write(c, section);
          } else {
            write_value(section, k.name, v.cget(c));
          }
        },
        k.value);
  }
  return root;
}

}  // namespace olmoref::config_keys
