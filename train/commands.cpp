#include "train/commands.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ref/parallel.h"
#include "train/config.h"
#include "train/parity_dump.h"
#include "golden/hf_export.h"
#include "ref/init.h"
#include "ref/params.h"
#include "train/trainer.h"

namespace olmoref {

namespace {

int g_exit_code = 0;

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  void add(CLI::App* cmd) {
    cmd->add_option("--config", path, "Run configuration (TOML), e.g. configs/tiny.toml")->required();
    cmd->add_option("--set", overrides, "Override a config key: --set section.key=value (repeatable)");
  }
  TrainConfig load() const { return load_config(path, overrides); }
};

void print_config_summary(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  std::printf("model            %s\n", m.name.c_str());
  std::printf("shape            d_model %lld, %lld layers, %lld heads (%lld kv, head_dim %lld), ffn %lld, vocab %lld\n",
              (long long)m.d_model, (long long)m.n_layers, (long long)m.n_heads, (long long)m.n_kv_heads,
              (long long)m.head_dim, (long long)m.ffn_hidden, (long long)m.vocab_size);
  std::string windows;
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const int64_t w = m.window(l);
    windows += (l ? "," : "") + (w > 0 ? std::to_string(w) : std::string("full"));
    if (l >= 11 && l + 1 < m.n_layers) {
      windows += ",...";
      break;
    }
  }
  std::printf("attention        [%s]\n", windows.c_str());
  std::printf("parameters       %lld (%.3f B); non-embedding %lld\n", (long long)m.n_params(), m.n_params() / 1e9,
              (long long)m.n_params_non_embedding());
  std::printf("FLOPs/token      %.4g at seq_len %lld (OLMo-core formula)\n", m.flops_per_token(c.train.seq_len),
              (long long)c.train.seq_len);
  std::printf("batch            %lld instances x %lld tokens = %lld micro-batches of %lld\n",
              (long long)c.train.global_batch_instances, (long long)c.train.seq_len,
              (long long)c.micro_batches_per_step(), (long long)c.train.micro_batch_instances);
  std::printf("state (fp32)     params+grad+adam %.3f GiB\n", 4.0 * 4.0 * m.n_params() / (1024.0 * 1024 * 1024));
}

}  // namespace

int command_exit_code() { return g_exit_code; }

void register_commands(CLI::App& app) {
  // ---- train ----
  {
    auto* cmd = app.add_subcommand("train", "Train a model and write trace.jsonl + manifest.json");
    auto cfg = std::make_shared<ConfigArgs>();
    cfg->add(cmd);
    auto out = std::make_shared<std::string>();
    auto threads = std::make_shared<int>(0);
    auto steps = std::make_shared<int64_t>(-1);
    auto quiet = std::make_shared<bool>(false);
    cmd->add_option("--out", *out, "Run directory (created)")->required();
    cmd->add_option("--threads", *threads, "Worker threads (0 = all cores); results do not depend on it");
    cmd->add_option("--steps", *steps, "Steps to run (default: train.steps from the config)");
    cmd->add_flag("--quiet", *quiet, "No progress output");
    cmd->callback([=] {
      const TrainConfig c = cfg->load();
      run_training(c, *out, *threads, *steps, *quiet);
    });
  }
  // ---- parity-dump ----
  {
    auto* cmd = app.add_subcommand("parity-dump", "Write a parity bundle for golden/parity/hf_parity.py");
    auto cfg = std::make_shared<ConfigArgs>();
    cfg->add(cmd);
    auto out = std::make_shared<std::string>();
    auto steps = std::make_shared<int64_t>(10);
    auto threads = std::make_shared<int>(0);
    cmd->add_option("--out", *out, "Bundle directory (created)")->required();
    cmd->add_option("--steps", *steps, "AdamW steps to record");
    cmd->add_option("--threads", *threads, "Worker threads (0 = all cores)");
    cmd->callback([=] { write_parity_bundle(cfg->load(), *out, *steps, *threads); });
  }
  // ---- export-hf ----
  {
    auto* cmd = app.add_subcommand("export-hf", "Write step-0 weights as a Hugging Face Olmo3 checkpoint");
    auto cfg = std::make_shared<ConfigArgs>();
    cfg->add(cmd);
    auto out = std::make_shared<std::string>();
    cmd->add_option("--out", *out, "Directory for model.safetensors + config.json")->required();
    cmd->callback([=] {
      const TrainConfig c = cfg->load();
      const ParamLayout layout(c.model);
      std::vector<float> params(static_cast<size_t>(layout.total));
      init_params(c.model, layout, params.data());
      HfExportOptions opts;
      opts.max_position_embeddings = c.train.seq_len;
      export_hf_checkpoint(*out, c.model, layout, params.data(), opts);
      std::printf("wrote %s/model.safetensors and config.json (%lld parameters)\n", out->c_str(),
                  static_cast<long long>(layout.total));
    });
  }
  // ---- config ----
  {
    auto* cmd = app.add_subcommand("config", "Validate a config and report parameters and FLOPs/token");
    auto cfg = std::make_shared<ConfigArgs>();
    cfg->add(cmd);
    auto resolved = std::make_shared<bool>(false);
    cmd->add_flag("--resolved", *resolved, "Also print the fully resolved TOML");
    cmd->callback([=] {
      const TrainConfig c = cfg->load();
      print_config_summary(c);
      if (*resolved) std::printf("\n%s\n", c.to_toml().c_str());
    });
  }
}

}  // namespace olmoref
