#include "interop/hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "data/bpe.h"
#include "interop/hf_tokenizer.h"
#include "interop/safetensors.h"
#include "interop/torch_state.h"

namespace olmoref {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kDolma2Eos = 100257, kDolma2Pad = 100277;
constexpr int64_t kDefaultMaxPositions = 8192;

// HF parses config floats as Python doubles and torch narrows eps to fp32 when adding it to an fp32 tensor, so
// writing the shortest decimal that round-trips our float gives HF exactly our eps (1e-6f -> 1e-06, not
// 9.99999997e-07).
double float_as_decimal(float f) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  double d = 0;
  std::from_chars(buf, r.ptr, d);
  return d;
}

struct LayerTypes {
  std::vector<std::string> types;  // "sliding_attention" / "full_attention" per layer
  int64_t sliding_window = 0;      // the one window of the sliding layers, 0 when there are none
};

LayerTypes layer_types_of(const ModelConfig& cfg) {
  LayerTypes lt;
  std::set<int64_t> windows;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const int64_t w = cfg.window(l);
    lt.types.push_back(w > 0 ? "sliding_attention" : "full_attention");
    if (w > 0) windows.insert(w);
  }
  if (windows.size() > 1) {
    std::string list;
    for (int64_t w : windows) list += (list.empty() ? "" : ", ") + std::to_string(w);
    throw std::invalid_argument(
        "config key 'model.swa_pattern' uses different sliding windows (" + list +
        "); Hugging Face Olmo3Config has a single `sliding_window` for all sliding layers, so this model has no "
        "Hugging Face form. Use one window size (and -1 for full layers) in model.swa_pattern.");
  }
  if (!windows.empty()) lt.sliding_window = *windows.begin();
  return lt;
}

std::optional<int64_t> token_id(const std::optional<int64_t>& given, int64_t fallback, int64_t vocab,
                                const char* what) {
  if (given) {
    if (*given < 0 || *given >= vocab)
      throw std::invalid_argument(std::string(what) + " " + std::to_string(*given) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + "); HF would fail to build the embedding. Pass an id < " +
                                  "vocab_size or leave it unset");
    return given;
  }
  if (fallback >= 0 && fallback < vocab) return fallback;
  return std::nullopt;
}

json id_or_null(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }

// transformers 5.x's rope_parameters entry for the full-attention (or sliding-window) layers: default RoPE, or YaRN
// in the form OLMo-core's YaRNRoPEScalingConfig.to_hf_config writes it (the attention factor given, not derived).
// Hugging Face clamps the ramp's upper end to head_dim - 1 where OLMo-core clamps it to head_dim/2 - 1; they agree
// whenever beta_slow's dimension is below head_dim/2, as at Olmo 3's settings (about 35 of 64).
json hf_rope_parameters(const ModelConfig& cfg, bool full_attention) {
  json p = {{"rope_type", "default"}, {"rope_theta", cfg.rope_theta}};
  const RopeScaling& s = cfg.rope_scaling;
  if (!s.on() || (!full_attention && s.full_attention_only)) return p;
  p["rope_type"] = "yarn";
  p["factor"] = s.factor;
  p["original_max_position_embeddings"] = s.old_context_len;
  p["beta_fast"] = s.beta_fast;
  p["beta_slow"] = s.beta_slow;
  p["attention_factor"] = s.attention_factor();
  return p;
}

struct TokenIds {
  std::optional<int64_t> eos, pad, bos;
};

TokenIds token_ids(const ModelConfig& cfg, const HfExportOptions& opts) {
  TokenIds ids;
  if (opts.tokenizer) {
    const data::BpeTokenizer& tok = *opts.tokenizer;
    // The model must have a row for every id the tokenizer can produce, or HF would index past the embedding.
    int64_t top = tok.eos_id();
    for (uint32_t b = 0; b < 256; ++b) top = std::max<int64_t>(top, tok.byte_id(static_cast<unsigned char>(b)));
    for (size_t i = 0; i < tok.n_merges(); ++i) top = std::max<int64_t>(top, tok.merge_id(i));
    if (tok.pad_id()) top = std::max<int64_t>(top, *tok.pad_id());
    if (top >= cfg.vocab_size)
      throw std::invalid_argument("the tokenizer uses id " + std::to_string(top) + " but model.vocab_size is " +
                                  std::to_string(cfg.vocab_size) + "; export with the tokenizer the run was trained on");
    ids.eos = token_id(opts.eos_token_id, tok.eos_id(), cfg.vocab_size, "eos_token_id");
    ids.pad = token_id(opts.pad_token_id, tok.pad_id() ? int64_t{*tok.pad_id()} : -1, cfg.vocab_size, "pad_token_id");
  } else {
    ids.eos = token_id(opts.eos_token_id, kDolma2Eos, cfg.vocab_size, "eos_token_id");
    ids.pad = token_id(opts.pad_token_id, kDolma2Pad, cfg.vocab_size, "pad_token_id");
  }
  ids.bos = token_id(opts.bos_token_id, -1, cfg.vocab_size, "bos_token_id");
  return ids;
}

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error(p.string() + ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error(p.string() + ": not valid JSON: " + e.what());
  }
}

// Compares config.json's architecture fields with cfg; returns one line per mismatch.
std::vector<std::string> config_mismatches(const json& hf, const ModelConfig& cfg) {
  std::vector<std::string> bad;
  auto check_int = [&](const char* key, int64_t ours, const char* our_key) {
    if (!hf.contains(key) || hf[key].is_null()) return;
    if (!hf[key].is_number_integer() || hf[key].get<int64_t>() != ours)
      bad.push_back(std::string(key) + " is " + hf[key].dump() + " in the checkpoint but " + our_key + " = " +
                    std::to_string(ours));
  };
  check_int("vocab_size", cfg.vocab_size, "model.vocab_size");
  check_int("hidden_size", cfg.d_model, "model.d_model");
  check_int("intermediate_size", cfg.ffn_hidden, "model.ffn_hidden");
  check_int("num_hidden_layers", cfg.n_layers, "model.n_layers");
  check_int("num_attention_heads", cfg.n_heads, "model.n_heads");
  check_int("num_key_value_heads", cfg.n_kv_heads, "model.n_kv_heads");
  if (hf.contains("head_dim") && !hf["head_dim"].is_null()) {
    check_int("head_dim", cfg.head_dim, "model.head_dim");
  } else if (hf.value("hidden_size", json()).is_number_integer() &&
             hf.value("num_attention_heads", json()).is_number_integer() &&
             hf["num_attention_heads"].get<int64_t>() > 0 &&
             hf["hidden_size"].get<int64_t>() / hf["num_attention_heads"].get<int64_t>() != cfg.head_dim) {
    bad.push_back("head_dim is absent (so hidden_size / num_attention_heads) in the checkpoint but model.head_dim = " +
                  std::to_string(cfg.head_dim));
  }
  if (hf.contains("rms_norm_eps") && hf["rms_norm_eps"].is_number() &&
      static_cast<float>(hf["rms_norm_eps"].get<double>()) != cfg.norm_eps)
    bad.push_back("rms_norm_eps is " + hf["rms_norm_eps"].dump() + " in the checkpoint but model.norm_eps = " +
                  std::to_string(cfg.norm_eps));
  auto check_theta = [&](const json& v, const std::string& where) {
    if (!v.is_number()) return;
    const double t = v.get<double>();
    if (std::fabs(t - cfg.rope_theta) > 1e-12 * std::fabs(cfg.rope_theta))
      bad.push_back(where + " is " + v.dump() + " in the checkpoint but model.rope_theta = " +
                    std::to_string(cfg.rope_theta));
  };
  if (hf.contains("rope_theta")) check_theta(hf["rope_theta"], "rope_theta");
  // The RoPE of each layer type must be the one the config gives it: default, or YaRN with the same settings.
  const json want_full = hf_rope_parameters(cfg, true), want_sliding = hf_rope_parameters(cfg, false);
  if (hf.contains("rope_parameters") && hf["rope_parameters"].is_object()) {
    for (const auto& [type, p] : hf["rope_parameters"].items()) {
      if (!p.is_object()) continue;
      if (p.contains("rope_theta")) check_theta(p["rope_theta"], "rope_parameters." + type + ".rope_theta");
      const json& want = type == "sliding_attention" ? want_sliding : want_full;
      const std::string theirs = p.value("rope_type", std::string("default")), ours = want["rope_type"];
      if (theirs != ours) {
        bad.push_back("rope_parameters." + type + ".rope_type is \"" + theirs + "\" in the checkpoint but the config gives " +
                      type + " layers \"" + ours + "\" RoPE (model.rope_scaling, model.rope_scaling_full_attention_only)");
        continue;
      }
      for (const char* key : {"factor", "beta_fast", "beta_slow", "original_max_position_embeddings"}) {
        if (ours != "yarn" || !p.contains(key) || !p[key].is_number()) continue;
        if (p[key].get<double>() != want[key].get<double>())
          bad.push_back("rope_parameters." + type + "." + key + " is " + p[key].dump() + " in the checkpoint but the " +
                        "config's model.rope_yarn_* settings give " + want[key].dump());
      }
    }
  }
  if (hf.contains("rope_scaling") && !hf["rope_scaling"].is_null() && !cfg.rope_scaling.on())
    bad.push_back("rope_scaling is set in the checkpoint but model.rope_scaling is \"none\" in the config; set "
                  "model.rope_scaling = \"yarn\" and its model.rope_yarn_* keys to the checkpoint's values");
  if (hf.contains("layer_types") && hf["layer_types"].is_array()) {
    const LayerTypes ours = layer_types_of(cfg);
    const auto theirs = hf["layer_types"].get<std::vector<std::string>>();
    if (theirs != ours.types) {
      std::string a, b;
      for (const auto& s : theirs) a += (a.empty() ? "" : ",") + s.substr(0, s.find('_'));
      for (const auto& s : ours.types) b += (b.empty() ? "" : ",") + s.substr(0, s.find('_'));
      bad.push_back("layer_types are [" + a + "] in the checkpoint but model.swa_pattern gives [" + b + "]");
    } else if (ours.sliding_window > 0 && hf.contains("sliding_window") &&
               (!hf["sliding_window"].is_number_integer() ||
                hf["sliding_window"].get<int64_t>() != ours.sliding_window)) {
      bad.push_back("sliding_window is " + hf["sliding_window"].dump() +
                    " in the checkpoint but model.swa_pattern uses " + std::to_string(ours.sliding_window));
    }
  }
  return bad;
}

}  // namespace

// Same tmp + fsync + rename discipline as the safetensors writer, so config.json is never half written.
void write_text_file_atomic(const std::string& path, const std::string& text) {
  const fs::path p(path);
  const std::string tmp = p.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error(tmp + ": write failed: " + std::strerror(e));
    }
    done += static_cast<size_t>(w);
  }
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), p.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(p.string() + ": cannot write " + tmp + " and rename it into place: " + std::strerror(e));
  }
}

// Hugging Face has no model these weights load into: Olmo3ForCausalLM is dense, and OlmoeForCausalLM is a
// pre-norm model (RMSNorm before attention and before the MoE) where OLMo-core 3's moe_reordered_norm block
// normalises the sublayers' outputs.
static void refuse_moe(const ModelConfig& cfg, const char* what) {
  if (cfg.moe.enabled())
    throw std::invalid_argument(
        std::string(what) + ": config key 'model.moe_experts' is " + std::to_string(cfg.moe.n_experts) +
        ": a mixture-of-experts model has no Hugging Face form (Olmo3ForCausalLM is dense; OlmoeForCausalLM is "
        "pre-norm, OLMo-core 3's moe_reordered_norm block is not); `olmoref parity-dump` writes the weights "
        "under OLMo-core's names (olmo_core/model.safetensors)");
}

void check_hf_representable(const ModelConfig& cfg, const char* what) {
  refuse_moe(cfg, what);
  try {
    layer_types_of(cfg);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(what) + ": " + e.what());
  }
}

std::string hf_config_json(const ModelConfig& cfg, const HfExportOptions& opts) {
  refuse_moe(cfg, "Hugging Face export");
  cfg.validate();
  const LayerTypes lt = layer_types_of(cfg);
  const TokenIds ids = token_ids(cfg, opts);
  const int64_t max_pos = opts.max_position_embeddings > 0 ? opts.max_position_embeddings : kDefaultMaxPositions;
  // transformers 5.x keeps rope theta per layer type in rope_parameters (and, when only the top-level rope_theta
  // is given, applies it to full_attention alone); 4.x reads the top-level rope_theta. We write both, equal.
  json c = {
      {"architectures", {"Olmo3ForCausalLM"}},
      {"model_type", "olmo3"},
      {"vocab_size", cfg.vocab_size},
      {"hidden_size", cfg.d_model},
      {"intermediate_size", cfg.ffn_hidden},
      {"num_hidden_layers", cfg.n_layers},
      {"num_attention_heads", cfg.n_heads},
      {"num_key_value_heads", cfg.n_kv_heads},
      {"head_dim", cfg.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", max_pos},
      {"initializer_range", cfg.init_std},
      {"rms_norm_eps", float_as_decimal(cfg.norm_eps)},
      {"rope_parameters",
       {{"full_attention", hf_rope_parameters(cfg, true)}, {"sliding_attention", hf_rope_parameters(cfg, false)}}},
      {"rope_theta", cfg.rope_theta},
      // HF builds the sliding-window mask even when no layer uses it and fails on null, so an all-full model
      // gets a harmless window as long as the context.
      {"sliding_window", lt.sliding_window > 0 ? lt.sliding_window : max_pos},
      {"layer_types", lt.types},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", false},
      {"use_cache", true},
      {"dtype", "float32"},
      {"bos_token_id", id_or_null(ids.bos)},
      {"eos_token_id", id_or_null(ids.eos)},
      {"pad_token_id", id_or_null(ids.pad)},
  };
  return c.dump(2) + "\n";
}

std::string hf_generation_config_json(const ModelConfig& cfg, const HfExportOptions& opts) {
  const TokenIds ids = token_ids(cfg, opts);
  // Only the token ids: everything else keeps GenerationConfig's defaults (greedy), which is what a reference
  // model should do unless the caller asks for more.
  const json g = {{"bos_token_id", id_or_null(ids.bos)},
                  {"eos_token_id", id_or_null(ids.eos)},
                  {"pad_token_id", id_or_null(ids.pad)}};
  return g.dump(2) + "\n";
}

namespace {
std::string file_sha256(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot open to compute its SHA-256");
  interop::Sha256 h;
  std::vector<char> buf(size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (const std::streamsize got = in.gcount(); got > 0) h.update(buf.data(), static_cast<size_t>(got));
  }
  if (in.bad()) throw std::runtime_error(p.string() + ": read failed while computing its SHA-256");
  return h.hex();
}
}  // namespace

void export_hf_checkpoint(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout,
                          const float* params, const HfExportOptions& opts) {
  export_hf_checkpoint(dir, cfg, layout,
                       [params](int64_t a, int64_t b, float* out) { std::copy(params + a, params + b, out); }, opts);
}

void export_hf_checkpoint(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout,
                          const FlatReader& read, const HfExportOptions& opts) {
  // Build the config first: if HF cannot represent the model we fail before touching the directory.
  const std::string config = hf_config_json(cfg, opts);
  const std::string generation = hf_generation_config_json(cfg, opts);
  if (opts.tokenizer) interop::hf_tokenizer_json(*opts.tokenizer);  // refuses an unexportable one up front
  if (layout.total != cfg.n_params())
    throw std::invalid_argument("export_hf_checkpoint: the parameter layout (" + std::to_string(layout.total) +
                                " floats) does not belong to this ModelConfig (" + std::to_string(cfg.n_params()) +
                                " parameters)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create checkpoint directory: " + ec.message());

  std::vector<SafeTensorView> views;
  views.reserve(layout.params.size());
  // Tensor by tensor, in pieces, as the file is written: the flat vector is read once, in order (the layout's order
  // is the vector's), and never held whole.
  for (const auto& p : layout.params) {
    SafeTensorView v{p.hf_name, "F32", p.shape, nullptr, static_cast<size_t>(p.numel) * sizeof(float), {}};
    const int64_t base = p.offset;
    v.fill = [&read, base](uint64_t at, uint64_t n, void* dst) {
      const int64_t a = base + static_cast<int64_t>(at / sizeof(float));
      read(a, a + static_cast<int64_t>(n / sizeof(float)), static_cast<float*>(dst));
    };
    views.push_back(std::move(v));
  }
  std::map<std::string, std::string> meta = opts.metadata;
  meta["format"] = "pt";  // what transformers writes; some loaders check it
  meta["olmoref.model"] = cfg.name;
  // Every file written, with its SHA-256 (kExportChecksums, last: a directory with it is complete).
  std::vector<std::pair<std::string, std::string>> sums;
  std::string weights_sha;
  write_safetensors((fs::path(dir) / "model.safetensors").string(), views, meta, &weights_sha);
  sums.emplace_back("model.safetensors", weights_sha);
  write_text_file_atomic((fs::path(dir) / "config.json").string(), config);
  write_text_file_atomic((fs::path(dir) / "generation_config.json").string(), generation);
  std::vector<std::string> small = {"config.json", "generation_config.json"};
  if (opts.tokenizer) {
    interop::write_hf_tokenizer(dir, *opts.tokenizer,
                                opts.max_position_embeddings > 0 ? opts.max_position_embeddings : kDefaultMaxPositions);
    small.insert(small.end(), {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"});
  }
  for (const std::string& name : small) sums.emplace_back(name, file_sha256(fs::path(dir) / name));
  std::string text;
  for (const auto& [name, sha] : sums) text += sha + "  " + name + "\n";
  write_text_file_atomic((fs::path(dir) / kExportChecksums).string(), text);
}

void verify_export_checksums(const std::string& dir, const std::string& weights_sha256) {
  const fs::path list = fs::path(dir) / kExportChecksums;
  if (!fs::exists(list)) return;  // not written by export-hf (save_pretrained writes none)
  std::ifstream in(list);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    // "<64 hex>  <name>", as sha256sum writes and checks it.
    if (line.size() < 67 || line.compare(64, 2, "  ") != 0 ||
        line.find_first_not_of("0123456789abcdef") < 64)
      throw std::runtime_error(list.string() + ":" + std::to_string(n) + ": not '<sha256>  <file>' (sha256sum's form)");
    const std::string want = line.substr(0, 64), name = line.substr(66);
    if (name.find('/') != std::string::npos)
      throw std::runtime_error(list.string() + ":" + std::to_string(n) + ": '" + name + "' is not a file of " + dir);
    const fs::path file = fs::path(dir) / name;
    if (!fs::exists(file))
      throw std::runtime_error(file.string() + ": missing, but " + list.string() + " lists it: the export is "
                               "incomplete; export it again");
    const std::string got = name == "model.safetensors" && !weights_sha256.empty() ? weights_sha256 : file_sha256(file);
    if (got != want)
      throw std::runtime_error(file.string() + ": SHA-256 " + got + ", but " + list.string() + " (written by " +
                               "olmoref export-hf) has " + want + ": the file changed after the export; export it again");
  }
}

std::string hf_weights_sha256(const std::string& dir) {
  const fs::path root(dir);
  if (fs::exists(root / "model.safetensors")) return file_sha256(root / "model.safetensors");
  const fs::path index = root / "model.safetensors.index.json";
  if (!fs::exists(index))
    throw std::runtime_error(dir + ": no model.safetensors (or model.safetensors.index.json) found; point to a "
                             "directory written by `olmoref export-hf` or save_pretrained(safe_serialization=True)");
  const json idx = read_json_file(index);
  if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
    throw std::runtime_error(index.string() + ": has no weight_map object");
  std::set<std::string> files;
  for (const auto& [name, file] : idx["weight_map"].items())
    if (file.is_string()) files.insert(file.get<std::string>());
  interop::Sha256 all;
  for (const auto& f : files) all.update(file_sha256(root / f) + "  " + f + "\n");
  return all.hex();
}

struct HfWeights::Impl {
  std::map<std::string, SafetensorsFile> shards;
  std::map<std::string, const SafetensorsFile*> where;  // tensor name -> file holding it
  std::vector<ParamInfo> params;                        // the layout's, in flat order
};

HfWeights::~HfWeights() = default;

HfWeights::HfWeights(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout)
    : impl_(std::make_unique<Impl>()) {
  auto& shards = impl_->shards;
  auto& where = impl_->where;
  impl_->params = layout.params;
  refuse_moe(cfg, (dir + ": Hugging Face import").c_str());
  const fs::path root(dir);
  const fs::path config_path = root / "config.json";
  if (fs::exists(config_path)) {
    std::vector<std::string> bad;
    try {
      bad = config_mismatches(read_json_file(config_path), cfg);
    } catch (const json::exception& e) {
      throw std::runtime_error(config_path.string() + ": a field has an unexpected type (" + e.what() +
                               "); is this a Hugging Face Olmo3 config.json?");
    }
    if (!bad.empty()) {
      std::string msg = config_path.string() + ": checkpoint does not match the model config:";
      for (const auto& b : bad) msg += "\n  - " + b;
      msg += "\nFix the [model] section of your config (or import a checkpoint of this model).";
      throw std::runtime_error(msg);
    }
  }

  // One file, or HF's sharded layout (model.safetensors.index.json naming a shard per tensor).
  const fs::path single = root / "model.safetensors", index = root / "model.safetensors.index.json";
  if (fs::exists(single)) {
    shards.emplace(single.string(), read_safetensors(single.string()));
  } else if (fs::exists(index)) {
    const json idx = read_json_file(index);
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      throw std::runtime_error(index.string() + ": has no weight_map object");
    for (const auto& [name, file] : idx["weight_map"].items()) {
      if (!file.is_string())
        throw std::runtime_error(index.string() + ": weight_map entry '" + name + "' is not a file name");
      const std::string shard = (root / file.get<std::string>()).string();
      if (!shards.count(shard)) shards.emplace(shard, read_safetensors(shard));
    }
  } else {
    throw std::runtime_error(dir + ": no model.safetensors (or model.safetensors.index.json) found; point to a "
                             "directory written by export_hf_checkpoint or save_pretrained(safe_serialization=True)");
  }
  for (const auto& [file, f] : shards)
    for (const auto& t : f.tensors) {
      if (where.count(t.name))
        throw std::runtime_error(file + ": tensor '" + t.name + "' also appears in " + where[t.name]->path);
      where[t.name] = &f;
    }

  std::vector<std::string> problems;
  std::set<std::string> expected;
  for (const auto& p : layout.params) {
    expected.insert(p.hf_name);
    const auto it = where.find(p.hf_name);
    if (it == where.end()) {
      problems.push_back("missing tensor '" + p.hf_name + "'");
      continue;
    }
    const SafeTensorInfo& t = it->second->info(p.hf_name);
    if (t.shape != p.shape) {
      auto str = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      std::string hint;
      if (p.kind == ParamKind::embedding || p.hf_name == "lm_head.weight")
        hint = " (HF releases truncate the vocabulary to the tokenizer size, e.g. 100278 instead of OLMo-core's "
               "padded 100352: set model.vocab_size to the checkpoint's row count)";
      problems.push_back("tensor '" + p.hf_name + "' has shape " + str(t.shape) + ", expected " + str(p.shape) + hint);
      continue;
    }
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
      problems.push_back("tensor '" + p.hf_name + "' has dtype " + t.dtype + "; expected F32, BF16 or F16");
  }
  for (const auto& [name, f] : where)
    if (!expected.count(name))
      problems.push_back("unexpected tensor '" + name + "' in " + f->path +
                         " (more layers than model.n_layers, tied/extra weights, or a different architecture)");
  if (!problems.empty()) {
    std::string msg = dir + ": checkpoint does not fit the model config (" + std::to_string(problems.size()) +
                      " problem" + (problems.size() > 1 ? "s" : "") + "):";
    const size_t shown = std::min<size_t>(problems.size(), 20);
    for (size_t i = 0; i < shown; ++i) msg += "\n  - " + problems[i];
    if (shown < problems.size()) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    throw std::runtime_error(msg);
  }
}

void HfWeights::read(int64_t a, int64_t b, float* out) const {
  // Each parameter's slice inside [a, b): a tensor's elements are the flat vector's, in the same row-major order.
  for (const ParamInfo& p : impl_->params) {
    const int64_t x = std::max(a, p.offset), y = std::min(b, p.offset + p.numel);
    if (x < y) impl_->where.at(p.hf_name)->read_f32_range(p.hf_name, x - p.offset, y - x, out + (x - a));
  }
}

void import_hf_checkpoint(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout, float* params) {
  HfWeights(dir, cfg, layout).read(0, layout.total, params);
}

}  // namespace olmoref
