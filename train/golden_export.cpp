#include "train/golden_export.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <stdexcept>
#include <chrono>
#include <set>
#include <tuple>

#include "data/audit.h"
#include "data/dataset.h"
#include "data/mix.h"
#include "golden/digest.h"
#include "interop/hf_export.h"
#include "interop/safetensors.h"
#include "golden/trace.h"
#include "model/init.h"
#include "core/optim.h"
#include "core/params.h"
#include "train/batch_source.h"
#include "train/config.h"
#include "train/manifest.h"
#include "train/step_list.h"
#include "train/trainer.h"
#include "train/weights.h"

namespace olmoref {

namespace {
template <class Json>
void rope_scaling_into(const ModelConfig& m, Json& model) {
  const RopeScaling& s = m.rope_scaling;
  if (!s.on()) return;
  model["rope_scaling"] = {{"kind", "yarn"},           {"factor", s.factor},
                           {"beta_fast", s.beta_fast}, {"beta_slow", s.beta_slow},
                           {"old_context_len", s.old_context_len}, {"full_attention_only", s.full_attention_only}};
}
template <class Json>
void moe_into(const ModelConfig& cfg, Json& model) {
  const MoEConfig& m = cfg.moe;
  if (!m.enabled()) return;
  model["moe"] = {{"n_experts", m.n_experts},
                  {"top_k", m.top_k},
                  {"hidden", m.hidden},
                  {"shared_hidden", m.shared_hidden},
                  {"lb_loss_weight", m.lb_loss_weight},
                  {"z_loss_weight", m.z_loss_weight},
                  {"scale_loss_by_num_layers", m.scale_loss_by_num_layers},
                  {"normalize_expert_weights", m.normalize_expert_weights},
                  {"lb_granularity", m.lb_granularity == MoELbGranularity::instance ? "instance" : "local_batch"}};
}
}  // namespace

void add_rope_scaling_json(const ModelConfig& m, nlohmann::json& model) { rope_scaling_into(m, model); }
void add_rope_scaling_json(const ModelConfig& m, nlohmann::ordered_json& model) { rope_scaling_into(m, model); }
void add_moe_json(const ModelConfig& m, nlohmann::json& model) { moe_into(m, model); }
void add_moe_json(const ModelConfig& m, nlohmann::ordered_json& model) { moe_into(m, model); }

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keys in the order written, for readers

namespace {

constexpr const char* kBundleFormat = "olmoref-golden-bundle/1";

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open (" + what + ")");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error(path + ": write failed (disk full?)");
}

std::string hex_of_double(double x) {
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return hex64(u);
}


json model_json(const ModelConfig& m) {
  json j = {{"name", m.name}, {"vocab_size", m.vocab_size}, {"d_model", m.d_model}, {"n_layers", m.n_layers},
          {"n_heads", m.n_heads}, {"n_kv_heads", m.n_kv_heads}, {"head_dim", m.head_dim},
          {"ffn_hidden", m.ffn_hidden}, {"rope_theta", m.rope_theta}, {"norm_eps", static_cast<double>(m.norm_eps)},
          {"swa_pattern", m.swa_pattern}, {"init_std", m.init_std}, {"init_seed", m.init_seed},
          {"n_params", m.n_params()}};
  add_rope_scaling_json(m, j);
  add_moe_json(m, j);
  return j;
}

struct InstanceRef {
  int64_t instance = 0, file = 0, token_start = 0, token_end = 0;
  std::string xxh3;
  bool operator<(const InstanceRef& o) const {
    return std::tie(instance, file, token_start) < std::tie(o.instance, o.file, o.token_start);
  }
  bool operator==(const InstanceRef& o) const {
    return instance == o.instance && file == o.file && token_start == o.token_start && token_end == o.token_end &&
           xxh3 == o.xxh3;
  }
};

const char* kReadme = R"(# olmoref golden bundle

Everything needed to replay an olmoref training run in another framework and compare the per-step loss.
Format `olmoref-golden-bundle/1` (docs/formats/golden-bundle.md in the olmoref repository).

| file | what |
|---|---|
| `bundle.json` | model shape, batch shape, loss definition, AdamW hyperparameters with the exact lr of every step, schedule, precision, the token files (path, size, dtype) and the dataset fingerprint, the resolved run config |
| `hf/` | the step-0 weights as a Hugging Face `Olmo3ForCausalLM` checkpoint (`model.safetensors`, fp32, and `config.json`) |
| `olmo_core/` | instead of `hf/` for a mixture-of-experts model (Hugging Face has none for it): the step-0 weights under OLMo-core's `state_dict` names (`model.safetensors`, fp32) |
| `batches.jsonl` | one line per step: the global batch in order, each instance as its id, the index of its token file, its token range `[token_start, token_end)` in that file and the XXH3-64 of its token ids; `token_sum`/`token_wsum` are numpy-checkable checksums of the whole batch |
| `trace.jsonl` | the golden trace: loss, grad norm, lr of every step with exact IEEE bits (`olmoref-trace/1`) |
| `run_manifest.json` | how the run was made (build, machine, threads) |
| `data/` | the token files, when exported with `--copy-data` (otherwise `bundle.json` references them by path) |

Training step s (1-based) uses batch s: loss = (sum of cross-entropy + 1e-5 * sum of logsumexp^2) over every
position but each instance's last, divided by the global target count (`loss.targets_per_step`), summed over
micro-batches of `micro_batch_instances` instances; then clip to `max_grad_norm` (coefficient
min(1, max_grad_norm / (norm + 1e-6))), set lr = `optim.lr_per_step[s-1]`, and take an AdamW step (decoupled decay,
none on `model.embed_tokens.weight`). `trace.jsonl` step s holds the loss computed before that update.

Replay with olmoref's `golden/replay/replay.py --bundle DIR --out replay.jsonl`, then
`olmoref trace compare DIR/trace.jsonl replay.jsonl --rules golden/replay/rules-fp32.toml`.
)";

std::string state_file_name(int64_t step) {
  char name[48];
  std::snprintf(name, sizeof name, "states/step-%08lld.safetensors", static_cast<long long>(step));
  return name;
}

// Trains the run again from the init on its own recomputed batches (one process, the CPU: every layout and executor
// of the run gives the same bits, which each record below checks) and writes the state after every step in
// `write`: parameters, Adam's moments and, for a judged step, the pre-clip gradient it computed. Each record must be
// the trace's, field for field, or nothing the bundle says about olmoref's state could be trusted.
void write_states(const TrainConfig& cfg, std::vector<StepBatch> batches, const std::vector<TraceRecord>& trace,
                  const std::vector<int64_t>& judged, const std::set<int64_t>& write, const std::string& out,
                  int threads, const std::string& run, GoldenExportSummary& summary) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t last = *write.rbegin();
  batches.resize(static_cast<size_t>(last));
  std::vector<StepBatch> copy = batches;
  Trainer trainer(cfg, threads, std::make_unique<FixedBatchSource>(std::move(copy), "golden export"));
  const ParamLayout& L = trainer.model().layout();
  const bool moe = cfg.model.moe.enabled();
  const std::set<int64_t> judged_set(judged.begin(), judged.end());
  std::vector<float> grad;
  fs::create_directories(out + "/states");
  for (int64_t s = 1; s <= last; ++s) {
    const bool judge = judged_set.count(s) > 0;
    if (judge) {
      grad.resize(static_cast<size_t>(L.total));
      trainer.compute_gradient(batches[static_cast<size_t>(s - 1)], grad.data());
    }
    TraceRecord r = trainer.train_step().record;
    const TraceRecord& want = trace[static_cast<size_t>(s - 1)];
    r.records_begin = want.records_begin;
    if (r.to_json() != want.to_json())
      throw std::runtime_error(run + "/trace.jsonl: step " + std::to_string(s) + ": training the run again for its "
                               "states gave\n  " + r.to_json() + "\nwhere the trace has\n  " + want.to_json() +
                               "\nso the states would not be the run's (a build with other numerics, or a run "
                               "that was not olmoref's exact mode); export without them: --states none");
    if (!write.count(s)) continue;
    const float* w = trainer.host_params();
    const std::vector<float> m = trainer.adam_m(), v = trainer.adam_v();
    std::vector<SafeTensorView> views;
    std::vector<std::string> names;
    names.reserve(4 * L.params.size());
    auto add = [&](const std::string& prefix, const float* base) {
      for (const ParamInfo& p : L.params) {
        names.push_back(prefix + (moe ? p.name : p.hf_name));
        views.push_back({names.back(), "F32", p.shape, base + p.offset, static_cast<size_t>(p.numel) * sizeof(float), {}});
      }
    };
    add("param.", w);
    add("exp_avg.", m.data());
    add("exp_avg_sq.", v.data());
    if (judge) add("grad.", grad.data());
    const std::string path = out + "/" + state_file_name(s);
    write_safetensors(path, views,
                      {{"olmoref_state_step", std::to_string(s)},
                       {"olmoref_adam_step", std::to_string(s + trainer.adam_step_offset())},
                       {"olmoref_param_digest", r.param_digest},
                       {"olmoref_loss_hex", f32_hex(r.loss)}});
    summary.state_files += 1;
    summary.state_bytes += static_cast<int64_t>(fs::file_size(path));
  }
  summary.retrain_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<int64_t> judged_state_steps(const std::string& value, int64_t steps, int64_t state_bytes, bool fp32,
                                        bool skip_step, std::string* note) {
  std::vector<int64_t> all;
  for (int64_t s = 1; s <= steps; ++s) all.push_back(s);
  auto refuse_skip = [&] {
    if (skip_step)
      throw std::invalid_argument("--states " + value + ": the run uses SkipStepAdamW, whose state (its loss and "
                                  "grad-norm windows) a replay cannot be handed; use --states none");
  };
  if (value == "none") return {};
  if (value == "all") {
    refuse_skip();
    return all;
  }
  if (value == "auto") {
    if (skip_step || !fp32) {
      if (note) *note = skip_step ? "none: SkipStepAdamW's windows cannot be handed to a replay"
                                  : "none: bf16 replays are judged over the free trajectory (pass --states all to write them)";
      return {};
    }
    // Judging step k takes the states after k-1 and k: every step needs `steps` files, a sample of n steps up to 2n.
    if (steps * state_bytes <= kAutoStatesBytes) return all;
    if (2 * state_bytes > kAutoStatesBytes) {
      if (note)
        *note = "none: one step's states take " + std::to_string(2 * state_bytes >> 20) + " MiB (over the " +
                std::to_string(kAutoStatesBytes >> 20) + " MiB auto writes); pass --states with the steps to judge";
      return {};
    }
    const int64_t n = std::max<int64_t>(1, kAutoStatesBytes / (2 * state_bytes));
    std::vector<int64_t> pick;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = n == 1 ? steps : 1 + i * (steps - 1) / (n - 1);
      if (pick.empty() || pick.back() != s) pick.push_back(s);
    }
    if (note)
      *note = std::to_string(pick.size()) + " of " + std::to_string(steps) + " steps, evenly spaced: every step's "
              "states would take " + std::to_string(steps * state_bytes >> 20) + " MiB (more than " +
              std::to_string(kAutoStatesBytes >> 20) + " MiB; --states all or a list of steps for others)";
    return pick;
  }
  refuse_skip();
  std::vector<int64_t> list = parse_step_list(value, "--states", "give auto, all, none or steps like 1,5,10");
  for (int64_t s : list)
    if (s < 1 || s > steps)
      throw std::invalid_argument("--states " + value + ": step " + std::to_string(s) + " is outside the bundle's "
                                  "steps 1.." + std::to_string(steps));
  std::sort(list.begin(), list.end());
  list.erase(std::unique(list.begin(), list.end()), list.end());
  return list;
}

GoldenExportSummary export_golden_bundle(const GoldenExportOptions& opts) {
  const std::string run = opts.run_dir, out = opts.out_dir;
  if (!fs::is_directory(run)) throw std::runtime_error(run + ": not a run directory (expected what `olmoref train --out` wrote)");
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)))
    throw std::runtime_error(out + ": exists and is not empty; remove it or pick another --out");

  // ---- the run: config, trace ----
  const json manifest = json::parse(read_text(run + "/manifest.json", "the run manifest"));
  if (!manifest.contains("config_toml")) throw std::runtime_error(run + "/manifest.json: no config_toml");
  const TrainConfig cfg =
      parse_config_text(manifest.at("config_toml").get<std::string>(), run + "/manifest.json (config_toml)", opts.overrides);
  // The bundle describes the optimizer's groups as the Olmo 3 default (embeddings without weight decay), which is
  // what every replay builds. AdamW or SkipStepAdamW: OLMo-core's adapter replays both, the others refuse the second.
  if (cfg.data.document_masking)
    throw std::runtime_error(run + "/manifest.json: golden export: data.document_masking is on, and a bundle does not "
                             "carry document boundaries yet: every framework's replay would attend across documents. "
                             "Export a run without it");
  if (cfg.optim.group_overrides_set)
    throw std::runtime_error(run + "/manifest.json: golden export: optim.group_overrides is set: the replays use the "
                             "Olmo 3 default groups (embeddings.weight without weight decay); remove the key to use them");
  // Dense: a Hugging Face Olmo3ForCausalLM checkpoint, which every framework loads. A mixture of experts has no
  // Hugging Face model (interop/hf_export.cpp): its weights go under OLMo-core's names, for OLMo-core's adapter.
  const bool moe = cfg.model.moe.enabled();
  // A bundle starts from the init's weights and a fresh optimizer; a run from another run's checkpoint starts from
  // neither.
  if (!cfg.init.checkpoint.empty())
    throw std::runtime_error(run + "/manifest.json: golden export: the run started from init.checkpoint = " +
                             cfg.init.checkpoint + " (weights and optimizer state of another run), but a bundle "
                             "starts from the init; export a run that starts from the init");
  if (!moe) require_hf_form(cfg, "golden export (its step-0 weights are a Hugging Face Olmo 3 checkpoint)");
  const std::vector<TraceRecord> trace = read_trace(run + "/trace.jsonl");
  int64_t S = static_cast<int64_t>(trace.size());
  if (opts.steps >= 0) {
    if (opts.steps > S)
      throw std::runtime_error(run + "/trace.jsonl has " + std::to_string(S) + " steps; cannot export " +
                               std::to_string(opts.steps));
    S = opts.steps;
  }
  if (S < 1) throw std::runtime_error(run + "/trace.jsonl: no steps to export");
  for (int64_t s = 0; s < S; ++s)
    if (trace[static_cast<size_t>(s)].step != s + 1)
      throw std::runtime_error(run + "/trace.jsonl: record " + std::to_string(s + 1) + " is step " +
                               std::to_string(trace[static_cast<size_t>(s)].step) + "; expected steps 1, 2, ... in order");
  const int64_t G = cfg.train.global_batch_instances, T = cfg.train.seq_len;
  GoldenExportSummary summary;
  // The states a fixed-state replay needs: for each judged step k, olmoref's state after k-1 (its start; the init's
  // weights and zero moments for k = 1, already in hf/) and after k (what the framework's update is held against).
  const int64_t state_bytes = 16 * ParamLayout(cfg.model).total;  // parameters, two moments, a gradient: fp32
  summary.judged_steps = judged_state_steps(opts.states, S, state_bytes, cfg.train.precision == "fp32",
                                            cfg.optim.skip_step(), &summary.states_note);
  std::set<int64_t> state_steps;
  for (int64_t k : summary.judged_steps) {
    state_steps.insert(k);
    if (k > 1) state_steps.insert(k - 1);
  }
  std::vector<StepBatch> kept_batches;

  // ---- the batches, recomputed with the run's loader and checked against the trace ----
  const data::FslDataset ds(train_mix(cfg.data), dataset_options(cfg));
  auto source = make_batch_source(cfg);
  if (source->fingerprint() != ds.fingerprint())
    throw std::runtime_error("internal: loader and dataset fingerprints differ");
  std::vector<std::vector<InstanceRef>> refs(static_cast<size_t>(S));
  std::string batches_jsonl;
  for (int64_t s = 1; s <= S; ++s) {
    const StepBatch b = source->next();
    const TraceRecord& r = trace[static_cast<size_t>(s - 1)];
    const std::string dd = hex64(data_digest(b.tokens.data(), static_cast<int64_t>(b.tokens.size())));
    if (dd != r.data_digest)
      throw std::runtime_error("step " + std::to_string(s) + ": the recomputed batch has data digest " + dd +
                               " but the run's trace says " + r.data_digest +
                               "; the data files or their paths changed since the run (fix with --set data.train_mix=...)");
    json inst = json::array();
    uint64_t sum = 0, wsum = 0;
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      sum += b.tokens[i];
      wsum += static_cast<uint64_t>(i + 1) * b.tokens[i];
    }
    for (int64_t k = 0; k < G; ++k) {
      const int64_t id = b.instance_ids[static_cast<size_t>(k)];
      const auto loc = ds.locate(id);
      InstanceRef ir{id, loc.file, loc.token_start, loc.token_start + T,
                     data::hex64(data::xxh3_tokens(std::span<const uint32_t>(b.tokens.data() + k * T, static_cast<size_t>(T))))};
      inst.push_back({{"instance", ir.instance}, {"file", ir.file}, {"token_start", ir.token_start},
                      {"token_end", ir.token_end}, {"xxh3", ir.xxh3}});
      refs[static_cast<size_t>(s - 1)].push_back(ir);
    }
    const json line = {{"step", s}, {"epoch", b.epoch}, {"data_digest", dd}, {"token_sum", sum},
                       {"token_wsum", wsum}, {"instances", inst}};
    batches_jsonl += line.dump() + "\n";
    if (!state_steps.empty() && s <= *state_steps.rbegin()) kept_batches.push_back(b);
  }

  // ---- the run's audit log, when it wrote one, must list the same instances ----
  if (fs::exists(run + "/audit.jsonl")) {
    std::map<int64_t, std::vector<InstanceRef>> audit;
    std::ifstream in(run + "/audit.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const data::AuditRecord a = data::parse_audit_record(line);
      if (a.step < 1 || a.step > S) continue;
      audit[a.step].push_back({a.instance, a.file_index, a.token_start, a.token_end, data::hex64(a.xxh3)});
    }
    for (int64_t s = 1; s <= S; ++s) {
      auto mine = refs[static_cast<size_t>(s - 1)];
      auto theirs = audit[s];
      std::sort(mine.begin(), mine.end());
      std::sort(theirs.begin(), theirs.end());
      if (!(mine == theirs))
        throw std::runtime_error(run + "/audit.jsonl: step " + std::to_string(s) + " lists " +
                                 std::to_string(theirs.size()) + " instances that differ from the recomputed batch (" +
                                 std::to_string(mine.size()) + " instances)");
    }
    summary.audit_checked = true;
  }

  // ---- the learning rates: the trace's exact values, which the schedule must reproduce ----
  json lrs = json::array(), lrs_hex = json::array();
  for (int64_t s = 1; s <= S; ++s) {
    const double lr = trace[static_cast<size_t>(s - 1)].lr;
    // Tokens-unit schedules read the tokens seen including this step's batch (the trace's cumulative count).
    const SchedulePosition pos =
        schedule_position(cfg.schedule, s, cfg.train.steps, trace[static_cast<size_t>(s - 1)].tokens,
                          cfg.train.global_batch_instances * cfg.train.seq_len);
    if (schedule_get_lr(cfg.schedule, cfg.optim.lr, pos.current, pos.t_max) != lr)
      throw std::runtime_error("step " + std::to_string(s) + ": the trace's lr differs from the config's schedule");
    lrs.push_back(lr);
    lrs_hex.push_back(hex_of_double(lr));
  }

  // ---- write ----
  fs::create_directories(out);
  const ParamLayout layout(cfg.model);
  {
    // The step-0 weights are a pure function of (init_seed, parameter, index): computed piece by piece as the file is
    // written, never held whole.
    const FlatReader init = [&](int64_t a, int64_t b, float* out) { init_params_range(cfg.model, layout, a, b, out); };
    HfExportOptions hf;
    hf.max_position_embeddings = T;
    if (cfg.data.eos_id >= 0 && cfg.data.eos_id < cfg.model.vocab_size) hf.eos_token_id = cfg.data.eos_id;
    hf.metadata = {{"olmoref_step", "0"}, {"olmoref_bundle", kBundleFormat}};
    if (moe) {
      fs::create_directories(out + "/olmo_core");
      std::vector<SafeTensorView> views;
      for (const ParamInfo& p : layout.params) {
        SafeTensorView v{p.name, "F32", p.shape, nullptr, static_cast<size_t>(p.numel) * sizeof(float), {}};
        const int64_t base = p.offset;
        v.fill = [&init, base](uint64_t at, uint64_t n, void* dst) {
          const int64_t a = base + static_cast<int64_t>(at / sizeof(float));
          init(a, a + static_cast<int64_t>(n / sizeof(float)), static_cast<float*>(dst));
        };
        views.push_back(std::move(v));
      }
      write_safetensors(out + "/olmo_core/model.safetensors", views, hf.metadata);
    } else {
      export_hf_checkpoint(out + "/hf", cfg.model, layout, init, hf);
    }
  }
  write_text(out + "/batches.jsonl", batches_jsonl);
  {
    // The first S records of the run's trace, byte for byte.
    std::ifstream in(run + "/trace.jsonl");
    std::string line, text;
    for (int64_t n = 0; n < S && std::getline(in, line);) {
      if (line.empty()) continue;
      text += line + "\n";
      ++n;
    }
    write_text(out + "/trace.jsonl", text);
  }
  fs::copy_file(run + "/manifest.json", out + "/run_manifest.json", fs::copy_options::overwrite_existing);
  if (!state_steps.empty())
    write_states(cfg, std::move(kept_batches), trace, summary.judged_steps, state_steps, out, opts.threads, run,
                 summary);

  json files = json::array();
  for (size_t i = 0; i < ds.n_files(); ++i) {
    const auto& f = ds.file(i);
    json e = {{"index", i}, {"path", fs::absolute(f.path()).lexically_normal().string()}, {"bytes", f.size_bytes()},
              {"tokens", f.n_tokens()}, {"instances", ds.file_instances(i)},
              {"first_instance", ds.file_first_instance(i)}, {"bundle_path", nullptr}};
    if (opts.copy_data) {
      char name[32];
      std::snprintf(name, sizeof name, "%05zu-", i);
      const std::string rel = std::string("data/") + name + fs::path(f.path()).filename().string();
      fs::create_directories(out + "/data");
      fs::copy_file(f.path(), out + "/" + rel, fs::copy_options::overwrite_existing);
      e["bundle_path"] = rel;
    }
    files.push_back(e);
  }

  json b;
  b["format"] = kBundleFormat;
  b["source_run"] = fs::absolute(run).lexically_normal().string();
  b["precision"] = cfg.train.precision;
  b["model"] = model_json(cfg.model);
  // Exactly one of the two holds the step-0 weights; the other is null.
  b["hf_dir"] = moe ? json(nullptr) : json("hf");
  b["olmo_core_dir"] = moe ? json("olmo_core") : json(nullptr);
  b["steps"] = S;
  b["run_steps"] = cfg.train.steps;
  b["seq_len"] = T;
  b["global_batch_instances"] = G;
  b["micro_batch_instances"] = cfg.train.micro_batch_instances;
  b["loss"] = {{"z_loss", cfg.train.z_loss},
               {"targets_per_step", cfg.targets_per_step()},
               {"definition",
                "(sum over targets of cross-entropy + z_loss * logsumexp^2) / targets_per_step; targets are the "
                "instance tokens shifted left by one (the last position of each instance has none)"}};
  b["optim"] = {{"kind", cfg.optim.kind},
                {"betas", {cfg.optim.beta1, cfg.optim.beta2}},
                {"eps", cfg.optim.eps},
                {"weight_decay", cfg.optim.weight_decay},
                // In the names of the weights' own form (Hugging Face's, or OLMo-core's for a mixture of experts).
                {"no_decay", {moe ? "embeddings.weight" : "model.embed_tokens.weight"}},
                {"max_grad_norm", cfg.optim.max_grad_norm},
                {"clip", "grads *= min(1, max_grad_norm / (total_norm + 1e-6)) before the update"},
                {"update", cfg.optim.skip_step()
                               ? "OLMo-core's SkipStepAdamW: AdamW's update scaled by the step factor (0 when the step's "
                                 "loss or grad norm is an outlier of the last rolling_interval_length steps)"
                               : "decoupled decay p *= 1 - lr*wd first, then Adam with bias correction (PyTorch AdamW)"},
                {"lr_per_step", lrs},
                {"lr_per_step_hex", lrs_hex}};
  if (cfg.optim.skip_step()) {  // OLMo-core's SkipStepAdamW, with its option names
    b["optim"]["rolling_interval_length"] = cfg.optim.rolling_interval_length;
    b["optim"]["sigma_factor"] = cfg.optim.sigma_factor;
    b["optim"]["step_increment_bugfix"] = cfg.optim.step_increment_bugfix;
  }
  b["schedule"] = {{"kind", cfg.schedule.kind}, {"peak_lr", cfg.optim.lr}, {"warmup", cfg.schedule.warmup},
                   {"alpha_f", cfg.schedule.alpha_f}, {"t_max", cfg.schedule.t_max > 0 ? cfg.schedule.t_max : cfg.train.steps}};
  b["data"] = {{"fingerprint", ds.fingerprint()},
               {"fingerprint_text", ds.fingerprint_text()},
               {"dtype", data::dtype_name(ds.dtype())},
               {"seed", cfg.data.seed},
               {"eos_id", cfg.data.eos_id},
               {"files", files},
               {"batches", "batches.jsonl"},
               {"audit_checked", summary.audit_checked}};
  b["trace"] = "trace.jsonl";
  if (!state_steps.empty()) {
    json files_by_step = json::object();
    for (int64_t k : state_steps) files_by_step[std::to_string(k)] = state_file_name(k);
    b["states"] = {{"judged_steps", summary.judged_steps},
                   {"files", files_by_step},
                   {"names", moe ? "olmo_core" : "hf"},
                   {"adam_step_offset", 0},  // a run from init.checkpoint (the only source of an offset) is refused above
                   {"contents",
                    "the state after step k: param.NAME (fp32 parameters), exp_avg.NAME and exp_avg_sq.NAME (Adam's "
                    "first and second moments, PyTorch AdamW's state, bias correction at step k), and for a judged "
                    "step grad.NAME (its gradient before clipping); step 0 is hf/ with zero moments"}};
  }
  b["config_toml"] = cfg.to_toml();
  b["build"] = build_facts();
  write_text(out + "/bundle.json", b.dump(2) + "\n");
  write_text(out + "/README.md", kReadme);

  summary.steps = S;
  summary.instances_per_step = G;
  summary.seq_len = T;
  summary.n_files = static_cast<int64_t>(ds.n_files());
  summary.n_params = layout.total;
  summary.fingerprint = ds.fingerprint();
  summary.weights_dir = moe ? "olmo_core" : "hf";
  return summary;
}

}  // namespace olmoref
