// cli/golden_commands.cpp — the golden-trace commands of the olmoref binary:
//   olmoref trace compare A B [--rules FILE | --megatron [--approximate] [--megatron-rules current|legacy]] [--loss ce]
//                                                 exit 0 only if every rule holds (1: a rule failed, 2: an error)
//   olmoref trace plot A [B ...] --out FILE.svg   loss curves, and where two runs part
//   olmoref trace convert A --to megatron|steploss --out FILE [--loss ce] [--metrics ...] [--step-interval N]
//                                                 [--megatron-rules current|legacy]
//   olmoref golden export --run DIR --out BUNDLE [--copy-data]
//   olmoref golden logits (--config FILE | --checkpoint DIR) --seq-len T --out DIR [--precision bf16]
// Uses header-only CLI11, like cli/data_commands.cpp.
#include "cli/golden_commands.h"
#include "cli/golden_replay.h"

#include <limits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "train/golden_export.h"
#include "golden/compare.h"
#include "train/golden_logits.h"
#include "golden/plot.h"
#include "golden/trace.h"
#include "train/records.h"
#include "cli/commands.h"

namespace olmoref {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A run's own records are never an output: a path given by mistake (`trace convert RUN --out RUN/trace.jsonl`) would
// replace what a resume, leakcheck and golden export read, with nothing to restore it from.
void refuse_run_record(const std::string& path) {
  const std::filesystem::path p = std::filesystem::absolute(path).lexically_normal();
  const std::string name = p.filename().string();
  const bool record = is_run_record_name(name) || name == "manifest.json";
  const std::filesystem::path dir = p.parent_path();
  std::error_code ec;
  if (record && (std::filesystem::exists(dir / "checkpoints", ec) || std::filesystem::exists(dir / "trace.jsonl", ec) ||
                 std::filesystem::exists(dir / "manifest.json", ec)))
    throw std::invalid_argument(path + ": " + name + " is a record of the run in " + dir.string() +
                                ", which this would overwrite: write the output to another path");
}

void write_file(const std::string& path, const std::string& text) {
  refuse_run_record(path);
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  o << text;
  if (!o) throw std::runtime_error(path + ": cannot write");
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

std::vector<std::string> split_metrics(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& g : given) {
    size_t start = 0;
    while (start <= g.size()) {
      const size_t comma = g.find(',', start);
      std::string m = g.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      while (!m.empty() && m.front() == ' ') m.erase(m.begin());
      while (!m.empty() && m.back() == ' ') m.pop_back();
      if (!m.empty()) out.push_back(m);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (out.empty()) throw std::invalid_argument("--metrics: no metric named");
  return out;
}

// --loss ce: an olmoref trace's loss becomes its cross-entropy, the loss Megatron and TorchTitan log.
void apply_loss_choice(LoadedTrace& t, const std::string& loss) {
  if (loss == "ce" && t.format == "olmoref") use_ce_as_loss(t);
}

// The z-loss is part of olmoref's loss but of no other framework's: say so when it would silently differ.
void warn_if_z_loss(const LoadedTrace& t, const std::string& loss, const char* target) {
  if (loss == "ce" || t.format != "olmoref") return;
  const auto z = t.metrics.find("z");
  if (z == t.metrics.end()) return;
  for (const auto& [step, v] : z->second)
    if (v.value != 0) {
      std::fprintf(stderr,
                   "note: %s's loss includes the z-loss (%.3g at step %lld); %s's loss does not: pass --loss ce to "
                   "use the cross-entropy alone\n",
                   t.path.c_str(), v.value, static_cast<long long>(step), target);
      return;
    }
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
    auto loss = std::make_shared<std::string>("total");
    auto megatron = std::make_shared<bool>(false), approximate = std::make_shared<bool>(false);
    auto mg = std::make_shared<MegatronGoldenOptions>();
    auto mg_metrics = std::make_shared<std::vector<std::string>>();
    auto mg_rules = std::make_shared<std::string>();
    cmp->add_option("A", *a, "Reference trace (the golden one)")->required();
    cmp->add_option("B", *b, "Trace to check")->required();
    auto* rules_opt = cmp->add_option(
        "--rules", *rules,
        "Rules file (TOML or JSON, docs/formats/compare.md). Default: exact bits on loss, grad_norm, lr, num_zeros, "
        "data_digest, param_digest for two olmoref traces; loss rtol 1e-5 otherwise (plus half the last printed "
        "digit for a console log)");
    cmp->add_option("--report", *report, "Also write the report to this file");
    cmp->add_option("--loss", *loss,
                    "total (olmoref's loss: cross-entropy + z-loss) or ce (the cross-entropy alone, the loss Megatron "
                    "and TorchTitan log): what an olmoref trace's `loss` means in this comparison")
        ->check(CLI::IsMember({"total", "ce"}));
    cmp->add_flag("--megatron", *megatron,
                  "Megatron-LM's functional-test comparison: A and B as golden values (traces of other formats are "
                  "first sampled and rounded as Megatron's extractor does), each metric under Megatron's checks "
                  "(lm loss [exact, rtol 0.05], num-zeros [exact, rtol 0.20])")
        ->excludes(rules_opt);
    cmp->add_flag("--approximate", *approximate,
                  "With --megatron: skip the exact checks, as Megatron does for --allow-nondeterministic-algo runs");
    cmp->add_option("--metrics", *mg_metrics,
                    "With --megatron: Megatron metric names, comma-separated (default \"lm loss,num-zeros\")");
    cmp->add_option("--step-interval", mg->step_interval,
                    "With --megatron, for traces that are not golden values yet: the sampling interval (default 5)");
    cmp->add_option("--megatron-rules", *mg_rules,
                    "With --megatron: current (Megatron-LM since its PR #6771: failing steps allowed per golden value, "
                    "num-zeros rtol 0.20; the default) or legacy (olmoref's former rules: allowance from the header's "
                    "range, rtol 0.05 everywhere); docs/formats/compare.md");
    cmp->callback([=] {
      LoadedTrace ta = load_trace_any(*a), tb = load_trace_any(*b);
      apply_loss_choice(ta, *loss);
      apply_loss_choice(tb, *loss);
      std::string text;
      bool pass = false;
      if (*megatron) {
        MegatronGoldenOptions o = *mg;
        if (!mg_metrics->empty()) o.metrics = split_metrics(*mg_metrics);
        if (!mg_rules->empty()) o.rules = parse_megatron_rules(*mg_rules);
        const std::vector<MegatronCheck> checks = megatron_default_checks(o.metrics, o.rules);
        const LoadedTrace ga = ta.format == "megatron" ? ta : megatron_golden_values(ta, o);
        const LoadedTrace gb = tb.format == "megatron" ? tb : megatron_golden_values(tb, o);
        const MegatronPipelineResult res = megatron_pipeline(ga, gb, checks, *approximate, o.rules);
        text = format_megatron_report(ga, gb, res);
        pass = res.pass;
      } else {
        if (*approximate || !mg_metrics->empty() || !mg_rules->empty())
          throw std::invalid_argument("--approximate, --metrics and --megatron-rules belong to --megatron");
        const CompareRules r = rules->empty() ? default_rules(ta, tb) : load_rules(*rules);
        const CompareResult res = compare_traces(ta, tb, r);
        text = format_compare_report(ta, tb, r, res);
        pass = res.pass;
      }
      std::fputs(text.c_str(), stdout);
      if (!report->empty()) write_file(*report, text);
      set_command_exit_code(pass ? 0 : 1);
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
    auto closs = std::make_shared<std::string>("total");
    auto co = std::make_shared<MegatronGoldenOptions>();
    auto cmetrics = std::make_shared<std::vector<std::string>>();
    auto crules = std::make_shared<std::string>();
    conv->add_option("TRACE", *in, "Trace file or run directory")->required();
    conv->add_option("--to", *to,
                     "megatron (golden values as Megatron-LM's functional tests extract them: lm loss and num-zeros, "
                     "5 decimals, steps 1, 5, 10, ...) or steploss (\"step loss\" lines, exact decimals, as "
                     "TorchTitan's tests/assets/losses)")
        ->required()
        ->check(CLI::IsMember({"megatron", "steploss"}));
    conv->add_option("--out", *cout, "Output file")->required();
    conv->add_option("--loss", *closs,
                     "total (cross-entropy + z-loss, olmoref's loss) or ce (the cross-entropy alone: the loss "
                     "Megatron and TorchTitan compute, without z-loss)")
        ->check(CLI::IsMember({"total", "ce"}));
    conv->add_option("--metrics", *cmetrics,
                     "megatron: metric names, comma-separated (default \"lm loss,num-zeros\"; also grad-norm, "
                     "learning-rate)");
    conv->add_option("--step-interval", co->step_interval, "megatron: Megatron's step_interval (default 5)");
    conv->add_option("--start-step", co->start_step, "megatron: the first step kept (default 1)");
    conv->add_option("--train-iters", co->train_iters, "megatron: the last step sampled (default: the trace's last)");
    conv->add_option("--megatron-rules", *crules,
                     "megatron: current (Megatron-LM's extractor since its PR #6771: only the steps the run logged; "
                     "the default) or legacy (every sampled step up to --train-iters, \"nan\" where none was logged)");
    conv->callback([=] {
      refuse_run_record(*cout);  // before any note about the input
      LoadedTrace t = load_trace_any(*in);
      apply_loss_choice(t, *closs);
      warn_if_z_loss(t, *closs, *to == "megatron" ? "Megatron" : "TorchTitan");
      MegatronGoldenOptions o = *co;
      if (!cmetrics->empty()) o.metrics = split_metrics(*cmetrics);
      if (!crules->empty()) {
        if (*to != "megatron") throw std::invalid_argument("--megatron-rules belongs to --to megatron");
        o.rules = parse_megatron_rules(*crules);
      }
      write_file(*cout, *to == "megatron" ? to_megatron_json(t, o) : to_steploss_text(t));
      std::printf("wrote %s (%s%s)\n", cout->c_str(), to->c_str(), *closs == "ce" ? ", loss = cross-entropy" : "");
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
    exp->add_option("--states", o->states,
                    "olmoref's state after the steps a fixed-state replay judges (BUNDLE/states/, recomputed by training "
                    "the run again, every record checked against the trace): auto (default: every step of an fp32 "
                    "AdamW run up to 1 GiB of states, evenly spaced steps beyond), all, none, or steps like 1,5,10");
    exp->add_option("--threads", o->threads, "Threads for retraining the states (0 = all cores)")
        ->check(CLI::Range(0, 65536));
    exp->callback([=] {
      const GoldenExportSummary s = export_golden_bundle(*o);
      if (!s.judged_steps.empty())
        std::printf("states: %zu judged step(s) (%lld files, %.1f MiB) from retraining %lld step(s) in %.1f s, every "
                    "record equal to the trace's%s%s\n",
                    s.judged_steps.size(), static_cast<long long>(s.state_files), s.state_bytes / 1048576.0,
                    static_cast<long long>(s.judged_steps.back()), s.retrain_seconds,
                    s.states_note.empty() ? "" : "; ", s.states_note.c_str());
      else if (!s.states_note.empty())
        std::printf("states: %s\n", s.states_note.c_str());
      std::printf("wrote golden bundle %s: %lld steps x %lld instances x %lld tokens, %lld parameters (%s/), "
                  "%lld token file(s) %s, batches checked against the trace%s; dataset %s\n",
                  o->out_dir.c_str(), static_cast<long long>(s.steps), static_cast<long long>(s.instances_per_step),
                  static_cast<long long>(s.seq_len), static_cast<long long>(s.n_params),
                  s.weights_dir.c_str(), static_cast<long long>(s.n_files), o->copy_data ? "copied" : "referenced",
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
    register_golden_replay(*cmd);
  }
}

}  // namespace olmoref
