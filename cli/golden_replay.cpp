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
#include "golden/resume_compare.h"
#include "train/step_list.h"

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
  // The resume audit's adapter under golden/replay/ (`golden resume-audit`); nullptr: none.
  const char* audit_script;
  // The environment variable that sets the adapter's micro-batch size, a second valid route whose trajectory is the
  // envelope of `--mode both` (nullptr: the adapter has one route).
  const char* route_env;
};

// The frameworks whose adapters exist. Each venv is the one the suite's checks of that framework already use.
constexpr Framework kFrameworks[] = {
    {"torch", "replay.py", "rules-fp32.toml", nullptr, "OLMOREF_VENV", "venv",
     "a plain PyTorch loop over transformers' Olmo3ForCausalLM with torch AdamW (olmoref's reference replay)", nullptr,
     "OLMOREF_TORCH_MICROBATCH"},
    {"hf-trainer", "hf_trainer_replay.py", "rules-hf-trainer.toml", "rules-hf-trainer-bf16.toml", "OLMOREF_VENV",
     "venv",
     "Hugging Face transformers' Trainer (with accelerate): its loop, accumulation, clipping and logged grad norm", "audit_hf_trainer.py",
     "OLMOREF_HF_MICROBATCH"},
    {"olmo-core", "olmo_core_replay.py", "rules-olmo-core.toml", "rules-olmo-core-bf16.toml", "OLMOREF_OLMO_CORE_VENV",
     "venv-olmo-core",
     "ai2-olmo-core's Trainer.fit with its TransformerTrainModule, AdamW/SkipStepAdamW and scheduler",
     "audit_olmo_core.py",
     "OLMOREF_OLMO_CORE_MICROBATCH"},
    {"torchtitan", "torchtitan_replay.py", "rules-torchtitan.toml", "rules-torchtitan-bf16.toml", "OLMOREF_VENV",
     "venv",
     "TorchTitan's Trainer through its transformers_modeling_backend, gloo on the CPU, weights by initial_load_in_hf", "audit_torchtitan.py",
     "OLMOREF_TORCHTITAN_MICROBATCH"},
    {"maxtext", "maxtext_replay.py", "rules-maxtext.toml", "rules-maxtext-bf16.toml", "OLMOREF_MAXTEXT_VENV",
     "venv-maxtext",
     "MaxText's pre-training trainer (JAX, CPU backend), weights through its to_maxtext converter into Orbax",
     "audit_maxtext.py",
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
    // One process for every bundle (each adapter takes --bundle/--out/--report once per bundle: bundle.py's
    // adapter_args): the framework is imported and set up once.
    std::vector<std::string> argv = common;
    for (const ReplayJob& job : jobs) argv = with_job(std::move(argv), job);
    return run_program(finish(std::move(argv)), env);
  };
  std::printf("olmoref golden replay: %s (%s)%s; %s\n", f.name, f.what,
              many ? (", " + std::to_string(jobs.size()) + " bundles in one process").c_str() : "",
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


// ---- golden resume-audit ----

struct AuditOptions {
  std::string bundle, framework, out, python, at_text, controls_text, world_size_text = "1";
  int64_t steps = 0;
  int threads = 1;
};

// What each control must show (golden/resume_compare.h's first difference), and at which step relative to K.
struct ControlExpectation {
  const char* name;
  std::vector<std::string> first_what;
  int64_t step_after_k;  // 0: at K (the loaded state), 1: at K + 1
};
const ControlExpectation kControls[] = {
    {"optimizer", {"optimizer state as loaded"}, 0},
    {"data", {"batch"}, 1},
    {"schedule", {"lr"}, 1},
    {"rng", {"loss", "grad_norm", "parameters after the step"}, 1},
};

// One JSON Lines trace of the records of `a` up to step k and of `b` after it: the stopped-and-resumed run.
void splice_trace(const std::string& a, const std::string& b, int64_t k, const std::string& out) {
  std::ofstream o(out);
  for (const auto& [path, before] : {std::pair{a, true}, std::pair{b, false}}) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const int64_t step = nlohmann::json::parse(line).at("step").get<int64_t>();
      if ((step <= k) == before) o << line << "\n";
    }
  }
}

StateDigests digests_of(const std::string& state_file, const std::string& label) {
  std::ifstream in(state_file);
  if (!in) return {};
  const nlohmann::json j = nlohmann::json::parse(in);
  StateDigests d;
  if (j.contains(label))
    for (const auto& [part, v] : j.at(label).items()) d[part] = v.get<std::string>();
  return d;
}

// A resume over another number of ranks than the stop: a different reduction order may change the step's own
// results (loss, grad norm, parameters after it), and nothing else may change: the state as loaded (a resharded
// checkpoint holds the same values), the batch of every step (the data order is the run's, not the ranks') and the lr.
struct ResharedVerdict {
  bool kept = true;
  std::string line;
};
ResharedVerdict judge_reshard(const ResumeFinding& r) {
  ResharedVerdict v;
  if (r.identical) return v;
  if (r.first_what == "parameters as loaded" || r.first_what == "optimizer state as loaded") {
    v.kept = false;
    v.line = "across the change of world size: DIFFERENT: the " + r.first_what + " (a resharded checkpoint must load "
             "the values it saved)\n";
    return v;
  }
  for (const char* metric : {"data_digest", "lr"}) {
    for (const ResumeStepRow& row : r.rows) {
      const auto it = row.same.find(metric);
      if (!row.present || (it != row.same.end() && !it->second)) {
        v.kept = false;
        v.line = "across the change of world size: DIFFERENT: the " +
                 std::string(std::string(metric) == "lr" ? "lr" : "batch") + " of step " + std::to_string(row.step) +
                 (row.present ? "" : " (missing)") +
                 (std::string(metric) == "lr" ? " (the schedule must not depend on the ranks)"
                                              : " (the data order must not depend on the ranks: a loader bug)") + "\n";
        return v;
      }
    }
  }
  v.line = "across the change of world size: kept: every batch, every lr and the loaded state are the same; the "
           "step's own results differ from step " + std::to_string(r.first_step) + " (" + r.first_what +
           "), as a different reduction order over the ranks makes them (not judged)\n";
  return v;
}

int golden_resume_audit(const AuditOptions& o) {
  const Framework& f = framework_named(o.framework);
  if (!f.audit_script)
    throw std::invalid_argument("--framework " + o.framework + ": no resume audit for it (audited: hf-trainer, olmo-core, "
                                "torchtitan, maxtext; olmoref's own resume: resume-check)");
  const fs::path here = fs::path(source_root()) / "golden" / "replay";
  const fs::path script = here / f.audit_script;
  if (!fs::is_regular_file(script))
    throw std::runtime_error(script.string() + " not found: golden resume-audit reads its adapters from the source "
                             "tree; set OLMOREF_SOURCE_ROOT to the olmoref checkout");
  const fs::path bundle(o.bundle);
  if (!fs::is_regular_file(bundle / "bundle.json"))
    throw std::invalid_argument(o.bundle + ": not a golden bundle (bundle.json is written by `olmoref golden export "
                                "--run RUN --out BUNDLE`)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(std::ifstream((bundle / "bundle.json").string()));
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument((bundle / "bundle.json").string() + ": not JSON (" + e.what() + ")");
  }
  const int64_t bundle_steps = meta.value("steps", int64_t{0});
  const int64_t S = o.steps > 0 ? std::min(o.steps, bundle_steps) : bundle_steps;
  const std::vector<int64_t> at = parse_step_list(o.at_text, "--at");
  for (int64_t k : at)
    if (k < 1 || k >= S)
      throw std::invalid_argument("--at " + o.at_text + ": step " + std::to_string(k) + " is outside 1.." +
                                  std::to_string(S - 1) + " (the run has " + std::to_string(S) +
                                  " steps; a stop must leave a step to resume)");
  std::vector<const ControlExpectation*> controls;
  if (!o.controls_text.empty()) {
    std::stringstream ss(o.controls_text == "all" ? "optimizer,data,schedule,rng" : o.controls_text);
    std::string name;
    while (std::getline(ss, name, ',')) {
      const ControlExpectation* c = nullptr;
      for (const ControlExpectation& e : kControls)
        if (name == e.name) c = &e;
      if (!c) throw std::invalid_argument("--controls " + o.controls_text + ": '" + name + "' is not a control "
                                          "(optimizer, data, schedule, rng or all)");
      controls.push_back(c);
    }
  }
  // --world-size A[:B]: the straight run and the stops over A ranks, each resume over B.
  int64_t ranks_before = 1, ranks_after = 1;
  {
    const std::string& t = o.world_size_text;
    const size_t colon = t.find(':');
    const std::vector<int64_t> a = parse_step_list(t.substr(0, colon), "--world-size");
    const std::vector<int64_t> b =
        colon == std::string::npos ? a : parse_step_list(t.substr(colon + 1), "--world-size");
    if (a.size() != 1 || b.size() != 1 || a[0] < 1 || b[0] < 1 || a[0] > 64 || b[0] > 64)
      throw std::invalid_argument("--world-size " + t + ": ranks A, or A:B (the stop over A ranks, the resume over B), "
                                  "each 1..64");
    ranks_before = a[0];
    ranks_after = b[0];
  }
  const bool reshard = ranks_before != ranks_after;
  if (reshard && !controls.empty())
    throw std::invalid_argument("--controls with --world-size " + o.world_size_text + ": the controls judge a resume "
                                "at the world size it stopped at; audit them without the change of world size");
  const fs::path out = o.out.empty() ? bundle / ("resume-audit-" + std::string(f.name)) : fs::path(o.out);
  fs::remove_all(out);
  fs::create_directories(out);
  const std::string py = python_of(f, o.python);
  // One adapter process runs a plan of runs, each with a fresh trainer.
  auto run_plan = [&](const std::string& name, const nlohmann::json& plan) {
    const std::string plan_path = (out / (name + ".plan.json")).string();
    std::ofstream(plan_path) << plan.dump(1) << "\n";
    return run_program({py, script.string(), "--bundle", bundle.string(), "--plan", plan_path, "--threads",
                        std::to_string(o.threads)});
  };
  auto path = [&](const std::string& name) { return (out / name).string(); };
  std::printf("olmoref golden resume-audit: %s (%s), %lld steps, stopped after step %s and resumed in a fresh process%s\n",
              f.name, f.what, static_cast<long long>(S), o.at_text.c_str(),
              reshard ? (" (stopped over " + std::to_string(ranks_before) + " ranks, resumed over " +
                         std::to_string(ranks_after) + ")").c_str()
                      : ranks_before > 1 ? (" (" + std::to_string(ranks_before) + " ranks)").c_str() : "");
  // 1. straight through, and each stop, in one process.
  nlohmann::json first = nlohmann::json::array();
  const nlohmann::json world_sizes = {ranks_before, ranks_after};
  first.push_back({{"kind", "straight"}, {"steps", S}, {"state_at", at}, {"out", path("straight.jsonl")},
                   {"state_out", path("straight.state.json")}, {"world_size", ranks_before},
                   {"world_sizes", world_sizes}});
  for (int64_t k : at)
    first.push_back({{"kind", "stop"}, {"at", k}, {"steps", S}, {"checkpoint", path("checkpoint-" + std::to_string(k))},
                     {"out", path("stopped-" + std::to_string(k) + ".jsonl")},
                     {"state_out", path("stopped-" + std::to_string(k) + ".state.json")},
                     {"world_size", ranks_before}, {"world_sizes", world_sizes}});
  auto could_not = [&](const std::string& what, int rc) {
    std::fprintf(stderr, "olmoref golden resume-audit: %s exited with status %d (its reason above): nothing was judged\n",
                 what.c_str(), rc);
    return 2;
  };
  if (const int rc = run_plan("straight-and-stops", first); rc != 0) return could_not("the straight run and the stops", rc);
  // 2. each resume in its own fresh process; 3. the controls (at the first stop) in one more.
  auto resume_run = [&](int64_t k, const std::string& tag, const char* control) {
    nlohmann::json r = {{"kind", "resume"}, {"at", k}, {"steps", S}, {"checkpoint", path("checkpoint-" + std::to_string(k))},
                        {"control", control ? nlohmann::json(control) : nlohmann::json(nullptr)},
                        {"out", path(tag + ".jsonl")}, {"state_out", path(tag + ".state.json")},
                        {"world_size", ranks_after}, {"world_sizes", world_sizes}};
    return r;
  };
  for (int64_t k : at) {
    const std::string tag = "resumed-" + std::to_string(k);
    if (const int rc = run_plan(tag, nlohmann::json::array({resume_run(k, tag, nullptr)})); rc != 0)
      return could_not("the resume from step " + std::to_string(k), rc);
  }
  int controls_rc = 0;
  if (!controls.empty()) {
    nlohmann::json plan = nlohmann::json::array();
    for (const ControlExpectation* c : controls)
      plan.push_back(resume_run(at.front(), std::string("control-") + c->name, c->name));
    controls_rc = run_plan("controls", plan);
  }
  // Judge: each resume against the straight run, exactly (golden/resume_compare.h).
  const std::string who = std::string(f.name) + "'s own trainer and checkpointing";
  auto judge = [&](int64_t k, const std::string& tag, std::string* report) {
    splice_trace(path("stopped-" + std::to_string(k) + ".jsonl"), path(tag + ".jsonl"), k, path(tag + ".spliced.jsonl"));
    ResumeAuditInput in;
    in.straight = load_trace_any(path("straight.jsonl"));
    in.resumed = load_trace_any(path(tag + ".spliced.jsonl"));
    in.stop_after = k;
    in.straight_at_stop = digests_of(path("straight.state.json"), "after-" + std::to_string(k));
    in.loaded = digests_of(path(tag + ".state.json"), "loaded");
    in.final_straight = digests_of(path("straight.state.json"), "final");
    in.final_resumed = digests_of(path(tag + ".state.json"), "final");
    const ResumeFinding finding = compare_resume(in);
    *report = format_resume_report(in, finding, who);
    return finding;
  };
  // A control against the real resume from the same checkpoint (both spliced by `judge` already): what the control
  // changed beyond what the framework's own resume changed.
  auto judge_against_resume = [&](int64_t k, const std::string& tag, std::string* report) {
    const std::string real = "resumed-" + std::to_string(k);
    ResumeAuditInput in;
    in.straight = load_trace_any(path(real + ".spliced.jsonl"));
    in.resumed = load_trace_any(path(tag + ".spliced.jsonl"));
    in.stop_after = k;
    in.straight_at_stop = digests_of(path(real + ".state.json"), "loaded");
    in.loaded = digests_of(path(tag + ".state.json"), "loaded");
    in.final_straight = digests_of(path(real + ".state.json"), "final");
    in.final_resumed = digests_of(path(tag + ".state.json"), "final");
    const ResumeFinding finding = compare_resume(in);
    *report = format_resume_report(in, finding, who + " (the control against the real resume)");
    return finding;
  };
  bool identical = true, controls_seen = true;
  std::string text;
  ResumeFinding real_at_first;  // the real resume from the stop the controls resume from
  bool kept = true;  // across a change of world size: the loaded state, every batch and every lr the same
  for (int64_t k : at) {
    std::string report;
    const ResumeFinding r = judge(k, "resumed-" + std::to_string(k), &report);
    if (k == at.front()) real_at_first = r;
    identical = identical && r.identical;
    text += "\n== resumed after step " + std::to_string(k) + "\n" + report;
    if (reshard) {
      const ResharedVerdict v = judge_reshard(r);
      kept = kept && v.kept;
      text += v.line;
    }
  }
  if (controls_rc != 0) {
    text += "\nthe controls could not run (exit " + std::to_string(controls_rc) + ", the adapter's reason above)\n";
    controls.clear();
  }
  for (const ControlExpectation* c : controls) {
    std::string report;
    const std::string tag = std::string("control-") + c->name;
    const std::string lead = c == controls.front() ? "\n" : "";
    // A control the framework has no restore for (its adapter says why): reported, neither seen nor blind.
    if (const nlohmann::json marker = nlohmann::json::parse(std::ifstream(path(tag + ".state.json")), nullptr, false);
        marker.is_object() && marker.contains("not_planted")) {
      text += lead + "control " + c->name + ": not planted: " + marker["not_planted"].get<std::string>() + "\n";
      continue;
    }
    const int64_t want_step = at.front() + c->step_after_k;
    auto as_expected = [&](const ResumeFinding& r) {
      return !r.identical && r.first_step == want_step &&
             std::find(c->first_what.begin(), c->first_what.end(), r.first_what) != c->first_what.end();
    };
    auto verdict_of = [](const ResumeFinding& r) {
      return r.identical ? std::string("IDENTICAL") : "first at step " + std::to_string(r.first_step) + ": " + r.first_what;
    };
    const ResumeFinding r = judge(at.front(), tag, &report);
    bool seen = as_expected(r);
    std::string note;
    // Where the framework's own resume already differs first at the same step in the same way, that difference would
    // pass for the control's: the control counts as seen only if it also differs from the real resume there.
    if (seen && !real_at_first.identical && real_at_first.first_step == r.first_step &&
        real_at_first.first_what == r.first_what) {
      std::string against;
      const ResumeFinding vs_real = judge_against_resume(at.front(), tag, &against);
      report += "\n-- the control against the real resume from the same checkpoint\n" + against;
      seen = as_expected(vs_real);
      note = std::string(seen ? " (the real resume differs there too; the control against it: "
                              : " (MASKED: the real resume differs there in the same way; the control against it: ") +
             verdict_of(vs_real) + ")";
    }
    controls_seen = controls_seen && seen;
    std::ofstream(path(tag + ".txt")) << report;
    text += lead + "control " + c->name + ": " + (seen ? "seen" : "NOT SEEN") + ": " + verdict_of(r) + note +
            (seen ? "" : " (expected: step " + std::to_string(want_step) + ", " + c->first_what.front() + ")") + " (" +
            path(tag + ".txt") + ")\n";
  }
  if (reshard) {
    auto ranks = [](int64_t n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); };
    text += std::string("\nolmoref golden resume-audit: ") + f.name + ": stopped over " + ranks(ranks_before) +
            ", resumed over " + ranks(ranks_after) + ": " +
            (identical ? "IDENTICAL: even the reduction order's results are the same"
             : kept    ? "the data order, the lr and the loaded state are kept; the step's results change, as a "
                         "different reduction order makes them"
                       : "DIFFERENT: the change of world size changed what the run trains on or with (a bug)") +
            " (" + path("audit.txt") + ")\n";
    std::fputs(text.c_str(), stdout);
    std::ofstream(path("audit.txt")) << text;
    return kept ? 0 : 1;
  }
  text += std::string("\nolmoref golden resume-audit: ") + f.name + ": " +
          (identical ? "IDENTICAL: its resume changed nothing" : "DIFFERENT: its resume changed the run") +
          (controls.empty() ? "" : controls_seen ? "; every control seen" : "; a control was NOT seen (the audit is blind to it)") +
          " (" + path("audit.txt") + ")\n";
  std::fputs(text.c_str(), stdout);
  std::ofstream(path("audit.txt")) << text;
  if (controls_rc != 0) return 2;
  return identical && controls_seen ? 0 : 1;
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

  auto* audit = golden.add_subcommand(
      "resume-audit",
      "Does a framework's own resume change its run? Its trainer runs the bundle straight through, and again stopped "
      "after step K through its own checkpoint save and resumed in a fresh process through its own load path; every "
      "step's loss, grad norm, lr (exact bits), batch and parameters (digests) are compared exactly: exit 0 identical, "
      "1 different (the first differing step and what differed first), 2 could not run");
  auto a = std::make_shared<AuditOptions>();
  audit->add_option("BUNDLE", a->bundle, "Golden bundle directory (`olmoref golden export`)")->required();
  audit->add_option("--framework", a->framework, "Whose trainer: hf-trainer, olmo-core, torchtitan or maxtext")
      ->required();
  audit->add_option("--at", a->at_text, "Stop after these steps (comma-separated), each resumed in its own process")
      ->required();
  audit->add_option("--steps", a->steps, "Run steps 1..N (default: every step of the bundle)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  audit->add_option("--controls", a->controls_text,
                    "Also resume with one part of the framework's restore skipped, each of which the audit must see "
                    "(at the first --at): optimizer, data, schedule, rng, or all");
  audit->add_option("--world-size", a->world_size_text,
                    "Ranks: A (every run), or A:B (the straight run and the stop over A gloo ranks, the resume over "
                    "B): across a change the batches, lrs and loaded state must be kept (olmo-core)");
  audit->add_option("--out", a->out, "Where the runs' records, checkpoints and the report go (default "
                                     "BUNDLE/resume-audit-FRAMEWORK; replaced)");
  audit->add_option("--threads", a->threads, "CPU threads of the framework (default 1)")->check(CLI::Range(1, 1024));
  audit->add_option("--python", a->python, "The Python to run the adapter with (default: the framework's environment)");
  audit->callback([a] { set_command_exit_code(golden_resume_audit(*a)); });
}

}  // namespace olmoref
