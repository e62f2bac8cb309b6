#include "data/cli_leak.h"

#include <limits>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/leakcheck.h"
#include "data/planted_bugs.h"
#include "train/batch_source.h"
#include "train/config.h"

namespace olmoref::data {

namespace {

struct LeakArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t steps = -1;
  bool epoch = false;
  LeakCheckOptions opt;
  int64_t eos = -1;
  std::string report;
  bool quiet = false;
  bool no_audit = false, no_content = false, no_static = false;
  std::string debug_bug;
};

void run(LeakArgs& a) {
  const TrainConfig cfg = load_config(a.config, a.overrides);
  LoaderConfig lc = loader_config(cfg);
  if (!a.debug_bug.empty()) lc.debug_bug = parse_planted_bug(a.debug_bug);
  LeakCheckOptions o = a.opt;
  o.config_path = a.config;
  o.whole_epoch = a.epoch;
  o.steps = a.steps >= 0 ? a.steps : cfg.train.steps;
  if (a.eos >= 0) o.eos_id = static_cast<uint32_t>(a.eos);
  o.audit_checks = !a.no_audit;
  o.static_check = !a.no_static;
  o.content_check = !a.no_content;
  const LeakReport rep = run_leakcheck(lc, o);
  if (!a.report.empty()) {
    const std::string tmp = a.report + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << rep.json.dump(2) << "\n";
      if (!out) throw std::runtime_error(a.report + ": cannot write the report");
    }
    if (std::rename(tmp.c_str(), a.report.c_str()) != 0) throw std::runtime_error(a.report + ": cannot write the report");
  }
  if (!a.quiet) {
    std::fputs(rep.summary.c_str(), stdout);
    if (!a.report.empty()) std::printf("report: %s\n", a.report.c_str());
  }
  if (rep.exit_code() != 0) throw CLI::RuntimeError(rep.exit_code());
}

}  // namespace

void register_leak_commands(CLI::App& app) {
  auto a = std::make_shared<LeakArgs>();
  CLI::App* c = app.add_subcommand(
      "leakcheck",
      "Holdout leakage detector: exact/near overlap of the holdout with the training stream as the loader delivers "
      "it, and loader audits (partition, exactly-once, resume, layouts). Exit 0 clean, 1 found, 2 could not check");
  c->add_option("--config", a->config, "Run configuration (TOML), the same file `olmoref train` reads")->required();
  c->add_option("--set", a->overrides, "Override a config key: --set section.key=value (repeatable)");
  auto* steps = c->add_option("--steps", a->steps, "Steps of the stream to check (default: train.steps)")->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  c->add_flag("--epoch", a->epoch, "Check the whole first epoch")->excludes(steps);
  c->add_option("--ngram", a->opt.ngram, "n-gram length of the near-overlap check")->check(CLI::Range(1, 1024));
  c->add_flag("--bloom", a->opt.bloom, "Bloom filter (4 B/n-gram) with exact re-verification instead of the exact set (16 B)");
  c->add_option("--bloom-bits", a->opt.bloom_bits_per_ngram, "Bloom filter bits per n-gram")->check(CLI::Range(4.0, 1024.0));
  c->add_option("--threshold", a->opt.near_threshold,
                "A holdout document counts as contaminated when this fraction of its n-grams occurs in training")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--min-doc-tokens", a->opt.min_doc_tokens, "Exact document matches ignore shorter documents");
  c->add_option("--eos", a->eos, "EOS token id (default: data.eos_id); delimits holdout documents");
  c->add_option("--world-size", a->opt.world_size, "Data-parallel ranks of the scanned stream (ranks in the report)");
  c->add_option("--layouts", a->opt.layouts, "World sizes the layout check compares with W=1 (default: 2,4,8 where they divide)")
      ->delimiter(',');
  c->add_option("--resume-at", a->opt.resume_at, "Steps after which the resume check stops and resumes (default: mid-run, epoch ends)")
      ->delimiter(',');
  c->add_flag("--no-static", a->no_static,
              "Skip the static scan of every training file (then near overlap is not attributed to data vs loader)");
  c->add_flag("--strict", a->opt.strict, "Near-duplicates the training data itself shares with the holdout fail too");
  c->add_flag("--no-audit-checks", a->no_audit, "Only the overlap checks");
  c->add_flag("--no-content-check", a->no_content, "Do not re-read instances to compare the audit log's XXH3s");
  c->add_option("--audit", a->opt.audit_logs, "Audit log(s) of a run (every rank's file) to check as well")
      ->check(CLI::ExistingFile);
  c->add_option("--report", a->report, "Write the JSON report here");
  c->add_option("--work-dir", a->opt.work_dir, "Keep the generated audit logs here (default: a temporary directory)");
  c->add_option("--threads", a->opt.threads, "Scan threads (default: all cores)")->check(CLI::Range(0, 65536));
  c->add_flag("--quiet", a->quiet, "No summary on stdout");
  c->add_option("--debug-plant-bug", a->debug_bug, "TEST-ONLY: make the loader misbehave (data/planted_bugs.h)")
      ->group("");
  c->callback([a] {
    try {
      run(*a);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      std::cerr << "olmoref leakcheck: error: " << e.what() << "\n";
      throw CLI::RuntimeError(2);
    }
  });
}

}  // namespace olmoref::data
