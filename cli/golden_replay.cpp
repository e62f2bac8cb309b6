// cli/golden_replay.cpp — `olmoref golden replay BUNDLE --framework F`: another framework's own trainer replays a golden
// bundle, and its trace is compared with the bundle's under that framework's rules file (golden/replay/, one per framework).
//
// Each framework is a short Python adapter in golden/replay/ run with the Python environment that holds that
// framework (the table below). The adapter's contract: `PY SCRIPT --bundle DIR --out REPLAY.jsonl --report
// REPORT.json [--steps N] --threads N [--fixed-state]` writes one JSON line per step ({"step", "loss", "ce", "z", "grad_norm",
// "lr"}, what the framework's trainer recorded) and a report of what the framework expressed natively and what was
// added to it, and exits 0 (replayed) or 2 (a malformed bundle, or the framework cannot be imported). The trainers'
// adapters take --bundle/--out/--report once per bundle and replay them one after another in one process, writing
// each trace only when that bundle replayed: a framework's start (its import, often the larger part of a short
// replay) is paid once for a bundle and its negative controls.
//
// Modes. `fixed` (the default when every bundle holds olmoref's states, `golden export --states`): each judged step k
// is computed by the framework's trainer from olmoref's state after step k-1, and the one-step quantities (loss, grad
// norm, per-tensor gradient, update) are gated under golden/replay/rules-fixed.toml. `free` (the default otherwise):
// the framework trains from the step-0 weights alone and its trajectory is gated under the framework's rules file.
// `both`: fixed is the verdict; the free trajectory is run as well and reported beside it (never gated), with the
// framework's own spread between two of its valid routes (the adapter's micro-batch variable) as its envelope.
#include "cli/golden_replay.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "golden/compare.h"

#ifndef OLMOREF_SOURCE_DIR
#error "cli/meson.build defines OLMOREF_SOURCE_DIR: where golden/replay/ is found when OLMOREF_SOURCE_ROOT is unset"
#endif

namespace olmoref {

namespace fs = std::filesystem;

namespace {

struct Framework {
  const char* name;
  const char* script;     // under golden/replay/
  const char* rules;      // under golden/replay/
  // Rules for a bf16 bundle, which the adapter replays in the framework's own bf16 mixed precision; nullptr: the
  // adapter replays every bundle in fp32, under `rules` (a bf16 bundle then differs by bf16-sized amounts).
  const char* rules_bf16;
  const char* venv_env;   // the environment variable naming its Python environment
  const char* venv_home;  // the default, under ~/.cache/olmoref/ (tools/setup_python.sh makes it)
  const char* what;       // for --help
  // The environment variable that sets the adapter's micro-batch size, a second valid route whose trajectory is the
  // envelope of `--mode both` (nullptr: the adapter has one route).
  const char* route_env;
  // The adapter takes --bundle/--out/--report once per bundle and replays them all in one process (bundle.py's
  // adapter_args); false: one process per bundle.
  bool many = true;
};

// The frameworks whose adapters exist. Each venv is the one the suite's checks of that framework already use.
constexpr Framework kFrameworks[] = {
    {"torch", "replay.py", "rules-fp32.toml", nullptr, "OLMOREF_VENV", "venv",
     "a plain PyTorch loop over transformers' Olmo3ForCausalLM with torch AdamW (olmoref's reference replay)",
     "OLMOREF_TORCH_MICROBATCH", false},
    {"hf-trainer", "hf_trainer_replay.py", "rules-hf-trainer.toml", "rules-hf-trainer-bf16.toml", "OLMOREF_VENV",
     "venv",
     "Hugging Face transformers' Trainer (with accelerate): its loop, accumulation, clipping and logged grad norm",
     "OLMOREF_HF_MICROBATCH"},
    {"olmo-core", "olmo_core_replay.py", "rules-olmo-core.toml", "rules-olmo-core-bf16.toml", "OLMOREF_OLMO_CORE_VENV",
     "venv-olmo-core",
     "ai2-olmo-core's Trainer.fit with its TransformerTrainModule, AdamW/SkipStepAdamW and scheduler",
     "OLMOREF_OLMO_CORE_MICROBATCH"},
    {"torchtitan", "torchtitan_replay.py", "rules-torchtitan.toml", "rules-torchtitan-bf16.toml", "OLMOREF_VENV",
     "venv",
     "TorchTitan's Trainer through its transformers_modeling_backend, gloo on the CPU, weights by initial_load_in_hf",
     "OLMOREF_TORCHTITAN_MICROBATCH"},
    {"maxtext", "maxtext_replay.py", "rules-maxtext.toml", "rules-maxtext-bf16.toml", "OLMOREF_MAXTEXT_VENV",
     "venv-maxtext",
     "MaxText's pre-training trainer (JAX, CPU backend), weights through its to_maxtext converter into Orbax",
     "OLMOREF_MAXTEXT_MICROBATCH"},
};

const Framework& framework_named(const std::string& name) {
  for (const Framework& f : kFrameworks)
    if (name == f.name) return f;
  std::string known;
  for (const Framework& f : kFrameworks) known += std::string(known.empty() ? "" : ", ") + f.name;
  throw std::invalid_argument("--framework " + name + ": no adapter for it; the frameworks are " + known);
}

std::string source_root() {
  const char* env = std::getenv("OLMOREF_SOURCE_ROOT");
  return env && *env ? env : OLMOREF_SOURCE_DIR;
}

std::string python_of(const Framework& f, const std::string& explicit_python) {
  if (!explicit_python.empty()) return explicit_python;
  std::string venv;
  if (const char* env = std::getenv(f.venv_env); env && *env) {
    venv = env;
  } else {
    const char* home = std::getenv("HOME");
    venv = std::string(home ? home : "") + "/.cache/olmoref/" + f.venv_home;
  }
  const std::string py = venv + "/bin/python";
  if (access(py.c_str(), X_OK) != 0)
    throw std::runtime_error("--framework " + std::string(f.name) + " runs in the Python environment " + venv + " (" +
                             f.venv_env + "), which has no bin/python: run `bash tools/setup_python.sh`, set " +
                             f.venv_env + ", or pass --python");
  return py;
}

// Runs argv[0] with argv (and `env` added to the environment), its output on ours; returns its exit status (128 +
// signal when killed).
int run_program(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed starting " + argv[0]);
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execv(args[0], args.data());
    std::fprintf(stderr, "olmoref golden replay: could not start %s\n", args[0]);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct ReplayOptions {
  std::vector<std::string> bundles;
  std::string framework, out, python, mode = "auto";
  int64_t steps = 0;
  int threads = 1;
};

// One bundle of a replay: where it is, the rules that judge it, and where its trace, report and comparison go.
struct ReplayJob {
  fs::path bundle, rules, free_rules, out;
  std::vector<int64_t> judged;  // the bundle's states.judged_steps (empty: no states)
  int64_t global_batch = 0, micro_batch = 0;
  std::string replay(const std::string& sub = "") const { return (out / sub / "replay.jsonl").string(); }
  std::string report(const std::string& sub = "") const { return (out / sub / "report.json").string(); }
};

ReplayJob plan_job(const Framework& f, const fs::path& here, const std::string& bundle_dir, const std::string& out,
                   bool many) {
  const fs::path bundle(bundle_dir);
  if (!fs::is_regular_file(bundle / "bundle.json") || !fs::is_regular_file(bundle / "trace.jsonl"))
    throw std::invalid_argument(bundle_dir + ": not a golden bundle (bundle.json and trace.jsonl are written by "
                                "`olmoref golden export --run RUN --out BUNDLE`)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(std::ifstream((bundle / "bundle.json").string()));
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument((bundle / "bundle.json").string() + ": not JSON (" + e.what() + ")");
  }
  ReplayJob job;
  job.bundle = bundle;
  // A bf16 run is judged by the framework's bf16 rules where its adapter replays in bf16.
  const std::string precision = meta.value("precision", "fp32");
  job.free_rules = here / (precision == "bf16" && f.rules_bf16 ? f.rules_bf16 : f.rules);
  job.rules = job.free_rules;
  if (meta.contains("states") && meta["states"].is_object())
    job.judged = meta["states"].value("judged_steps", std::vector<int64_t>{});
  job.global_batch = meta.value("global_batch_instances", int64_t{0});
  job.micro_batch = meta.value("micro_batch_instances", int64_t{0});
  // One bundle: --out is its folder. Several: --out holds one folder per bundle, named as the bundle's own.
  fs::path whole = fs::absolute(bundle).lexically_normal();
  if (whole.filename().empty()) whole = whole.parent_path();  // "DIR/" names DIR
  const fs::path name = whole.filename();
  job.out = out.empty() ? bundle / ("replay-" + std::string(f.name)) : many ? fs::path(out) / name : fs::path(out);
  return job;
}

// A trace cut to the steps that were judged: those of `keep` (sorted) up to `last` (0: all).
void keep_steps(LoadedTrace& t, const std::vector<int64_t>& keep, int64_t last) {
  for (auto& [metric, series] : t.metrics)
    for (auto it = series.begin(); it != series.end();) {
      const bool judged = keep.empty() || std::binary_search(keep.begin(), keep.end(), it->first);
      it = judged && (last <= 0 || it->first <= last) ? std::next(it) : series.erase(it);
    }
}

std::string failing_rules(const CompareResult& r) {
  std::string out;
  for (const MetricResult& m : r.metrics)
    if (!m.pass) out += (out.empty() ? "" : ", ") + m.rule.name + " (first at step " + std::to_string(m.first_failing_step) + ")";
  return out;
}

// The free trajectory of `--mode both`, reported beside the verdict: olmoref's trace against the framework's free
// replay under its own rules, and that replay against its second route (the envelope: how far the framework's own
// valid routes drift apart over the same steps). Returns the text; never a verdict.
std::string free_report(const ReplayJob& job, int64_t steps, bool have_route, const std::string& route_what) {
  std::ostringstream o;
  o << "\n-- free trajectory (reported, not gated): the framework trains from the step-0 weights alone\n";
  if (!fs::is_regular_file(job.replay("free"))) {
    o << "   the free replay wrote no trace (its output is above); nothing to report\n";
    return o.str();
  }
  LoadedTrace golden = load_trace_any((job.bundle / "trace.jsonl").string()), free = load_trace_any(job.replay("free"));
  keep_steps(golden, {}, steps);
  keep_steps(free, {}, steps);
  const CompareRules rules = load_rules(job.free_rules.string());
  const CompareResult gate = compare_traces(golden, free, rules);
  // Every step of each metric, reported: the framework's rules may judge a metric over a few steps only.
  CompareRules every;
  for (const char* metric : {"loss", "ce", "z", "grad_norm", "lr"}) {
    MetricRule r;
    r.name = r.metric = metric;
    r.check = MetricRule::Check::report;
    r.required = false;
    every.rules.push_back(r);
  }
  const CompareResult vs = compare_traces(golden, free, every);
  std::optional<CompareResult> spread;
  LoadedTrace route;
  if (have_route && fs::is_regular_file(job.replay("free-route"))) {
    route = load_trace_any(job.replay("free-route"));
    keep_steps(route, {}, steps);
    spread = compare_traces(free, route, every);
  }
  char line[256];
  std::snprintf(line, sizeof line, "   %-10s %22s %28s  %s\n", "metric", "olmoref vs framework", "framework's own spread",
                "");
  o << line;
  std::set<std::string> shown;
  for (const MetricResult& m : vs.metrics) {
    if (!m.present || !m.numeric || !shown.insert(m.rule.metric).second) continue;
    std::string env = "-", where = "";
    if (spread)
      for (const MetricResult& e : spread->metrics)
        if (e.rule.metric == m.rule.metric && e.present && e.numeric) {
          char b[64];
          if (e.max_rel_step < 0) std::snprintf(b, sizeof b, "0 (identical)");
          else std::snprintf(b, sizeof b, "%.3g (step %lld)", e.max_rel, static_cast<long long>(e.max_rel_step));
          env = b;
          // One other route is one sample of a chaotic spread: only an order of magnitude means anything.
          where = m.max_rel <= e.max_rel ? "inside it"
                  : m.max_rel <= 10 * e.max_rel ? "the same order"
                                                 : "over 10x it: look closer";
          break;
        }
    char b[64];
    if (m.max_rel_step < 0) std::snprintf(b, sizeof b, "0 (identical)");
    else std::snprintf(b, sizeof b, "%.3g (step %lld)", m.max_rel, static_cast<long long>(m.max_rel_step));
    std::snprintf(line, sizeof line, "   %-10s %22s %28s  %s\n", m.rule.metric.c_str(), b, env.c_str(), where.c_str());
    o << line;
  }
  o << "   (max relative difference over the steps; "
    << (spread ? "the spread is the framework against itself with " + route_what
               : std::string(have_route ? "the second route wrote no trace" : "the adapter has one route: no spread"))
    << "; under " << job.free_rules.filename().string() << " the free trajectory "
    << (gate.pass ? std::string("also holds")
                : "breaks " + failing_rules(gate) + ", which beside a fixed-state verdict that holds is noise the free "
                  "trajectory amplified, not a recipe difference")
    << ")\n";
  return o.str();
}

int golden_replay(const ReplayOptions& o) {
  const Framework& f = framework_named(o.framework);
  const fs::path here = fs::path(source_root()) / "golden" / "replay";
  const bool many = o.bundles.size() > 1;
  std::vector<ReplayJob> jobs;
  for (const std::string& b : o.bundles) {
    jobs.push_back(plan_job(f, here, b, o.out, many));
    for (size_t i = 0; i + 1 < jobs.size(); ++i)
      if (fs::weakly_canonical(jobs[i].out) == fs::weakly_canonical(jobs.back().out))
        throw std::invalid_argument(jobs[i].bundle.string() + " and " + b + " would both write " +
                                    jobs.back().out.string() + ": give the bundles different folder names");
  }
  // The mode: fixed needs olmoref's states in every bundle.
  std::string mode = o.mode;
  const ReplayJob* stateless = nullptr;
  for (const ReplayJob& job : jobs)
    if (job.judged.empty() && !stateless) stateless = &job;
  if (mode == "auto") mode = stateless ? "free" : "fixed";
  if (mode != "free" && stateless)
    throw std::invalid_argument("--mode " + mode + ": " + (stateless->bundle / "bundle.json").string() +
                                " lists no states (bundle.json \"states\"), which a fixed-state replay starts each step "
                                "from; export with `olmoref golden export --states all` (or a list of steps), or "
                                "replay the free trajectory: --mode free");
  const bool fixed = mode != "free";
  if (fixed)
    for (ReplayJob& job : jobs) job.rules = here / "rules-fixed.toml";
  const fs::path script = here / f.script;
  for (const ReplayJob& job : jobs)
    for (const fs::path& p : {script, job.rules, job.free_rules})
      if (!fs::is_regular_file(p))
        throw std::runtime_error(p.string() + " not found: golden replay reads its adapters from the source tree; set "
                                 "OLMOREF_SOURCE_ROOT to the olmoref checkout");
  const bool both = mode == "both";
  for (const ReplayJob& job : jobs) {
    // A trace or verdict left by an earlier replay must not be taken for this one's.
    for (const std::string sub : {"", "free", "free-route"}) {
      fs::create_directories(job.out / sub);
      fs::remove(job.replay(sub));
    }
    fs::remove(job.out / "compare.txt");
  }
  // Runs the adapter over every job: results in job.out/sub; fixed adds --fixed-state. Returns its exit status.
  auto run_adapter = [&](const std::string& sub, bool fixed_state,
                         const std::vector<std::pair<std::string, std::string>>& env) {
    const std::vector<std::string> common = {python_of(f, o.python), script.string(), "--threads",
                                             std::to_string(o.threads)};
    auto with_job = [&](std::vector<std::string> argv, const ReplayJob& job) {
      argv.insert(argv.end(), {"--bundle", job.bundle.string(), "--out", job.replay(sub), "--report", job.report(sub)});
      return argv;
    };
    auto finish = [&](std::vector<std::string> argv) {
      if (o.steps > 0) argv.insert(argv.end(), {"--steps", std::to_string(o.steps)});
      if (fixed_state) argv.push_back("--fixed-state");
      return argv;
    };
    int rc = 0;
    if (f.many) {  // one process for every bundle: the framework is imported and set up once
      std::vector<std::string> argv = common;
      for (const ReplayJob& job : jobs) argv = with_job(std::move(argv), job);
      rc = run_program(finish(std::move(argv)), env);
    } else {
      for (const ReplayJob& job : jobs) rc = std::max(rc, run_program(finish(with_job(common, job)), env));
    }
    return rc;
  };
  std::printf("olmoref golden replay: %s (%s)%s; %s\n", f.name, f.what,
              many ? (", " + std::to_string(jobs.size()) + " bundles" + (f.many ? " in one process" : "")).c_str() : "",
              fixed ? "judged one step at a time from olmoref's state after the step before (--mode fixed)"
                    : "the free trajectory from the step-0 weights (--mode free)");
  int adapter_rc = run_adapter("", fixed, {});
  // --mode both: the free trajectory and, where the adapter has a second route, the framework against itself.
  std::string route_what;
  if (both) {
    run_adapter("free", false, {});
    if (f.route_env) {
      // One micro-batch size for every job: a second valid summation order over the same batches.
      const ReplayJob& j0 = jobs.front();
      const int64_t alt = j0.micro_batch == 1 ? j0.global_batch : 1;
      route_what = std::string(f.route_env) + "=" + std::to_string(alt) + " (micro-batches of " + std::to_string(alt) +
                   " instances instead of " + std::to_string(j0.micro_batch) + ")";
      run_adapter("free-route", false, {{f.route_env, std::to_string(alt)}});
    }
  }
  bool all_replayed = true, all_hold = true;
  for (const ReplayJob& job : jobs) {
    if (many) std::printf("\n== %s\n", job.bundle.c_str());
    if (!fs::is_regular_file(job.replay())) {
      std::fprintf(stderr,
                   "olmoref golden replay: the %s adapter (%s) exited with status %d and wrote no trace for %s; "
                   "nothing was compared\n",
                   f.name, script.c_str(), adapter_rc, job.bundle.c_str());
      all_replayed = false;
      continue;
    }
    LoadedTrace golden = load_trace_any((job.bundle / "trace.jsonl").string()), theirs = load_trace_any(job.replay());
    // --steps N replays steps 1..N, so both traces are judged over those alone: a later golden step is not a step
    // the replay lost. At fixed state, the steps judged are the bundle's judged steps.
    std::vector<int64_t> judged = fixed ? job.judged : std::vector<int64_t>{};
    std::sort(judged.begin(), judged.end());
    keep_steps(golden, judged, o.steps);
    keep_steps(theirs, judged, o.steps);
    const CompareRules r = load_rules(job.rules.string());
    const CompareResult res = compare_traces(golden, theirs, r);
    std::string text = format_compare_report(golden, theirs, r, res);
    if (both) text += free_report(job, o.steps, f.route_env != nullptr, route_what);
    std::fputs(text.c_str(), stdout);
    std::ofstream((job.out / "compare.txt").string()) << text;
    std::printf("olmoref golden replay: %s: %s (trace %s, report %s, comparison %s)\n", f.name,
                res.pass ? "the replay holds" : "the replay differs", job.replay().c_str(), job.report().c_str(),
                (job.out / "compare.txt").c_str());
    all_hold = all_hold && res.pass;
  }
  if (!all_replayed && adapter_rc == 0) adapter_rc = 2;
  if (adapter_rc != 0 && all_replayed)
    std::fprintf(stderr, "olmoref golden replay: the %s adapter exited with status %d\n", f.name, adapter_rc);
  return adapter_rc != 0 ? 2 : all_hold ? 0 : 1;
}

}  // namespace

void register_golden_replay(CLI::App& golden) {
  auto* cmd = golden.add_subcommand(
      "replay",
      "Replay a golden bundle with another framework's own trainer and compare its trace with the bundle's under that "
      "framework's rules (its rules file in golden/replay/); exit 0 when it holds (every bundle's), 1 when one "
      "differs, 2 when one could not be replayed");
  auto o = std::make_shared<ReplayOptions>();
  std::string names;
  for (const Framework& f : kFrameworks) names += std::string(names.empty() ? "" : "; ") + f.name + ": " + f.what;
  cmd->add_option("BUNDLE", o->bundles,
                  "Golden bundle directories (`olmoref golden export`); several are replayed one after another by one "
                  "start of the framework, each judged on its own")
      ->required();
  cmd->add_option("--framework", o->framework, "Whose trainer replays it: " + names)->required();
  cmd->add_option("--out", o->out,
                  "Where the replay's trace, report and comparison go (default BUNDLE/replay-FRAMEWORK); with several "
                  "bundles, a folder per bundle under it, named as the bundle");
  cmd->add_option("--steps", o->steps,
                  "Replay steps 1..N only and judge those (default: every step of the bundle)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--threads", o->threads, "CPU threads of the framework (default 1)")->check(CLI::Range(1, 1024));
  cmd->add_option("--mode", o->mode,
                  "fixed: each step from olmoref's state after the step before, one-step quantities gated under "
                  "golden/replay/rules-fixed.toml (needs the bundle's states/); free: the trajectory from the step-0 "
                  "weights, gated under the framework's rules; both: fixed gated, free reported beside it with the "
                  "framework's own spread; auto (default): fixed when every bundle has states, else free")
      ->check(CLI::IsMember({"auto", "fixed", "free", "both"}));
  cmd->add_option("--python", o->python, "The Python to run the adapter with (default: the framework's environment)");
  cmd->callback([o] { set_command_exit_code(golden_replay(*o)); });
}

}  // namespace olmoref
