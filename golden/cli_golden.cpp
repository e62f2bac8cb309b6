// golden/cli_golden.cpp — the golden-trace commands of the olmoref binary:
//   olmoref trace compare A B [--rules FILE]      exit 0 only if every rule holds (1: a rule failed, 2: an error)
//   olmoref trace plot A [B ...] --out FILE.svg   loss curves, and where two runs part
//   olmoref trace convert A --to megatron|steploss --out FILE
//   olmoref golden export --run DIR --out BUNDLE [--copy-data]
//   olmoref golden logits (--config FILE | --checkpoint DIR) --seq-len T --out DIR [--precision bf16]
// Uses header-only CLI11, like data/cli_data.cpp.
#include "golden/cli_golden.h"

#include <limits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "golden/bundle.h"
#include "golden/compare.h"
#include "golden/logits.h"
#include "golden/plot.h"
#include "golden/trace.h"
#include "train/commands.h"

namespace olmoref {

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  o << text;
  if (!o) throw std::runtime_error(path + ": cannot write");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Any trace format as the plot's records: olmoref traces keep every field, others carry the loss.
NamedTrace as_named_trace(const std::string& path) {
  const LoadedTrace t = load_trace_any(path);
  if (t.format == "olmoref") return {t.path, read_trace(t.path)};
  NamedTrace nt{t.path, {}};
  const auto it = t.metrics.find("loss");
  if (it == t.metrics.end()) throw std::runtime_error(t.path + ": no loss values to plot");
  for (const auto& [step, v] : it->second) {
    TraceRecord r;
    r.step = step;
    r.loss = static_cast<float>(v.value);
    nt.records.push_back(r);
  }
  return nt;
}

}  // namespace

void register_golden_commands(CLI::App& app) {
  // ---- trace ----
  {
    auto* cmd = app.add_subcommand("trace", "Work with traces: compare, plot, convert (docs/formats/trace.md)");
    cmd->require_subcommand(1);

    auto* cmp = cmd->add_subcommand(
        "compare",
        "Compare trace B against reference A under per-metric rules; exit 0 only if every rule holds. Reads olmoref "
        "trace.jsonl (or a run directory), any JSON Lines with \"step\", Megatron golden-values JSON, and plain "
        "\"step loss\" text (TorchTitan)");
    auto a = std::make_shared<std::string>(), b = std::make_shared<std::string>(), rules = std::make_shared<std::string>();
    auto report = std::make_shared<std::string>();
    cmp->add_option("A", *a, "Reference trace (the golden one)")->required();
    cmp->add_option("B", *b, "Trace to check")->required();
    cmp->add_option("--rules", *rules,
                    "Rules file (TOML or JSON, docs/formats/compare.md). Default: exact bits on loss, grad_norm, lr, "
                    "data_digest, param_digest for two olmoref traces; loss rtol 1e-5 otherwise");
    cmp->add_option("--report", *report, "Also write the report to this file");
    cmp->callback([=] {
      const LoadedTrace ta = load_trace_any(*a), tb = load_trace_any(*b);
      const CompareRules r = rules->empty() ? default_rules(ta, tb) : load_rules(*rules);
      const CompareResult res = compare_traces(ta, tb, r);
      const std::string text = format_compare_report(ta, tb, r, res);
      std::fputs(text.c_str(), stdout);
      if (!report->empty()) write_file(*report, text);
      set_command_exit_code(res.pass ? 0 : 1);
    });

    auto* plot = cmd->add_subcommand("plot",
                                     "Loss curves of one or more traces (any format compare reads) and, with two or "
                                     "more, the per-step difference against the first and the first differing step");
    auto files = std::make_shared<std::vector<std::string>>();
    auto out = std::make_shared<std::string>();
    auto title = std::make_shared<std::string>("olmoref loss");
    plot->add_option("TRACE", *files, "trace files or run directories")->required();
    plot->add_option("--out", *out, "Output .svg (or .png, converted with rsvg-convert when it is installed)")->required();
    plot->add_option("--title", *title, "Plot title");
    plot->callback([=] {
      std::vector<NamedTrace> traces;
      for (const auto& f : *files) traces.push_back(as_named_trace(f));
      const std::string svg = loss_plot_svg(traces, *title);
      if (ends_with(*out, ".png")) {
        if (out->find('\'') != std::string::npos)
          throw std::runtime_error("--out: a .png path may not contain a single quote");
        const std::string tmp = *out + ".tmp.svg";
        write_file(tmp, svg);
        const std::string cmdline = "rsvg-convert -f png -o '" + *out + "' '" + tmp + "' 2>/dev/null";
        const int rc = std::system(cmdline.c_str());
        std::filesystem::remove(tmp);
        if (rc != 0)
          throw std::runtime_error("PNG output needs rsvg-convert (Debian: apt-get install librsvg2-bin); or write "
                                   "--out FILE.svg, which any browser opens");
      } else {
        write_file(*out, svg);
      }
      std::printf("wrote %s\n", out->c_str());
    });

    auto* conv = cmd->add_subcommand("convert", "Write a trace in another framework's format");
    auto in = std::make_shared<std::string>(), to = std::make_shared<std::string>(), cout = std::make_shared<std::string>();
    auto interval = std::make_shared<int64_t>(1);
    conv->add_option("TRACE", *in, "Trace file or run directory")->required();
    conv->add_option("--to", *to, "megatron (golden-values JSON) or steploss (\"step loss\" lines, exact decimals)")
        ->required()
        ->check(CLI::IsMember({"megatron", "steploss"}));
    conv->add_option("--out", *cout, "Output file")->required();
    conv->add_option("--step-interval", *interval, "megatron: keep the first step and every N-th after it");
    conv->callback([=] {
      const LoadedTrace t = load_trace_any(*in);
      write_file(*cout, *to == "megatron" ? to_megatron_json(t, *interval) : to_steploss_text(t));
      std::printf("wrote %s (%s)\n", cout->c_str(), to->c_str());
    });
  }
  // ---- golden ----
  {
    auto* cmd = app.add_subcommand("golden", "Golden bundles for replaying a run in another framework");
    cmd->require_subcommand(1);
    auto* exp = cmd->add_subcommand(
        "export",
        "Write a golden bundle from a run: step-0 weights (Hugging Face Olmo 3), the per-step batches (instance ids "
        "and token ranges in the token files, checked against the trace), hyperparameters and the trace");
    auto o = std::make_shared<GoldenExportOptions>();
    exp->add_option("--run", o->run_dir, "Run directory written by `olmoref train`")->required();
    exp->add_option("--out", o->out_dir, "Bundle directory (created; must not exist or be empty)")->required();
    exp->add_option("--steps", o->steps, "Export steps 1..N only (default: every step of the trace)")->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
    exp->add_flag("--copy-data", o->copy_data, "Copy the token files into BUNDLE/data/ (default: reference them)");
    exp->add_option("--set", o->overrides,
                    "Override a key of the run's config, e.g. data.train_mix=PATH when the corpus moved (repeatable)");
    exp->callback([=] {
      const GoldenExportSummary s = export_golden_bundle(*o);
      std::printf("wrote golden bundle %s: %lld steps x %lld instances x %lld tokens, %lld parameters (hf/), "
                  "%lld token file(s) %s, batches checked against the trace%s; dataset %s\n",
                  o->out_dir.c_str(), static_cast<long long>(s.steps), static_cast<long long>(s.instances_per_step),
                  static_cast<long long>(s.seq_len), static_cast<long long>(s.n_params),
                  static_cast<long long>(s.n_files), o->copy_data ? "copied" : "referenced",
                  s.audit_checked ? " and the audit log" : "", s.fingerprint.c_str());
    });

    auto* lg = cmd->add_subcommand(
        "logits",
        "Write a logits bundle for golden/parity/hf_parity.py --logits: our logits for long real-text windows at the "
        "step-0 or a checkpoint's weights, in fp32 or bf16, with the weights as a Hugging Face checkpoint");
    auto lo = std::make_shared<LogitsBundleOptions>();
    lg->add_option("--config", lo->config_path, "Config whose step-0 weights to use");
    lg->add_option("--checkpoint", lo->checkpoint, "Checkpoint directory whose weights (and config) to use");
    lg->add_option("--set", lo->overrides, "Override a config key (repeatable)");
    lg->add_option("--precision", lo->precision, "fp32 or bf16 (default: the config's train.precision)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    lg->add_option("--seq-len", lo->seq_len, "Tokens per window")->required();
    lg->add_option("--instances", lo->instances, "Windows (default 1)");
    lg->add_option("--data", lo->data, "Where the tokens come from: holdout, train or auto (holdout if configured)")
        ->check(CLI::IsMember({"holdout", "train", "auto"}));
    lg->add_option("--threads", lo->threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 65536));
    lg->add_option("--out", lo->out_dir, "Bundle directory (created)")->required();
    lg->callback([=] {
      const LogitsBundleSummary s = write_logits_bundle(*lo);
      std::printf("wrote logits bundle %s: %lld x %lld tokens from %s, weights of step %lld, loss %.6f (%.1f s)\n",
                  lo->out_dir.c_str(), static_cast<long long>(lo->instances), static_cast<long long>(lo->seq_len),
                  s.tokens_from.c_str(), static_cast<long long>(s.step), s.loss, s.seconds);
    });
  }
}

}  // namespace olmoref
