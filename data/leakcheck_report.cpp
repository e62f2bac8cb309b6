// The leak check's report (data/leakcheck_stages.h write_report): the JSON of docs/formats/leakcheck.md and the few
// lines for people, from what the stages found.
#include <algorithm>
#include <cstdio>

#include "data/leakcheck_stages.h"

namespace olmoref::data::leak {

namespace {

std::string position_text(const nlohmann::json& first) {
  if (first.is_null()) return "";
  std::string s;
  if (first.contains("step") && first["step"].get<int64_t>() >= 0) s += "step " + std::to_string(first["step"].get<int64_t>());
  if (first.contains("microbatch") && first["microbatch"].get<int64_t>() >= 0)
    s += ", micro-batch " + std::to_string(first["microbatch"].get<int64_t>());
  if (first.contains("rank") && first["rank"].get<int64_t>() >= 0) s += ", rank " + std::to_string(first["rank"].get<int64_t>());
  if (first.contains("instance") && first["instance"].get<int64_t>() >= 0)
    s += ", instance " + std::to_string(first["instance"].get<int64_t>());
  if (first.contains("world_size")) s += " (W=" + std::to_string(first["world_size"].get<int>()) + ")";
  if (s.empty() && first.contains("file")) {  // a static finding: a place in a training file
    s = first["file"].get<std::string>();
    if (first.contains("token_start"))
      s += " token " + std::to_string(first["token_start"].get<int64_t>() + first.value("token_offset", int64_t{0}));
  }
  return s;
}

// The lines for people, read from the finished report: the summary never says what the report does not.
std::string summary_text(const nlohmann::json& j) {
  const std::string verdict = j["status"].get<std::string>();
  const nlohmann::json& stream = j["stream"];
  const nlohmann::json& holdout = j["holdout"];
  const nlohmann::json& levels = j["levels"];
  const nlohmann::json& counts = j["counts"];
  const nlohmann::json& checks = j["checks"];
  const nlohmann::json& contaminated = j["contaminated_documents"];
  const nlohmann::json& evals = j["affected"]["evaluations"];
  const nlohmann::json& unused = j["accept"]["unused"];
  const int64_t since = j["affected"]["since"].is_null() ? 0 : j["affected"]["since"].get<int64_t>();
  const int64_t contaminated_count = counts["contaminated"].get<int64_t>();
  const int64_t accepted_count = counts["accepted"].get<int64_t>();
  const auto num = [](const nlohmann::json& v) { return std::to_string(v.get<int64_t>()); };
  std::string s = "olmoref leakcheck: " + std::string(verdict == "clean" ? "CLEAN" : verdict == "contaminated" ? "CONTAMINATED"
                                                                      : verdict == "audit-failure"        ? "AUDIT FAILURE"
                                                                                                          : "CONTAMINATED + AUDIT FAILURE") +
                  (accepted_count > 0 ? " (" + std::to_string(accepted_count) + " known data overlap(s) accepted)" : "") + "\n";
  s += "stream: " + num(stream["steps"]) + " steps (" + num(stream["instances"]) + " instances, " + num(stream["tokens"]) +
       " tokens) on " + num(stream["world_size"]) + " rank(s); scanned at " +
       fmt("%.3g", stream["tokens_per_second"].get<double>()) + " tokens/s\n";
  s += "holdout: " + num(holdout["documents"]) +
       (holdout["documents_are_instances"].get<bool>() ? " instance-documents, " : " documents, ") +
       num(holdout["instances"]) + " instances, " + num(holdout["tokens"]) + " tokens (" +
       (holdout["index"] == "bloom" ? "Bloom" : "exact") + " " + num(levels["seed_ngram"]) + "-gram index " +
       fmt("%.1f", holdout["index_bytes"].get<double>() / (1 << 20)) + " MiB)\n";
  s += "levels: verbatim span >= " + num(levels["verbatim_tokens"]) + " tokens, " +
       fmt("%.2f", levels["ngram_fraction"].get<double>()) + " of " + num(levels["ngram"]) + "-grams, near-duplicate " +
       fmt("%.2f", levels["near_duplicate"].get<double>()) + " (spans >= " + num(levels["seed_ngram"]) + ")\n";
  if (contaminated_count > 0) {
    std::string causes;
    for (const auto& [c, n] : counts["by_cause"].items()) causes += (causes.empty() ? "" : ", ") + num(n) + " " + c;
    s += "contaminated holdout documents: " + std::to_string(contaminated_count) + " (cause: " + causes + ")";
    if (accepted_count > 0) s += ", " + std::to_string(accepted_count) + " accepted as known data overlap";
    if (since > 0) s += ", " + num(counts["counted"]) + " first delivered after step " + std::to_string(since) + " and not accepted";
    s += "; first delivered at step " + num(j["affected"]["first_step"]) + "\n";
    int shown = 0;
    for (const nlohmann::json& d : contaminated) {
      if (++shown > 10) {
        s += "    ... " + std::to_string(contaminated_count - 10) + " more in the report\n";
        break;
      }
      std::string lvls;
      for (const auto& l : d["levels"]) lvls += (lvls.empty() ? "" : ",") + l.get<std::string>();
      s += "    " + d["file"].get<std::string>() + " token " + std::to_string(d["token_start"].get<int64_t>()) + " (" +
           std::to_string(d["tokens"].get<int64_t>()) + " tokens): " + lvls + ", cause " + d["cause"].get<std::string>() +
           (d["accepted"].get<bool>() ? " (accepted)" : "") + ", longest run " + std::to_string(d["longest_run"].get<int64_t>()) +
           ", first at " + (d.contains("first") ? position_text(d["first"]) : std::string("?")) + "\n";
    }
    if (!evals.empty())
      s += "affected evaluations: every one from step " + std::to_string(evals.front()["step"].get<int64_t>()) + " (" +
           std::to_string(evals.size()) + " of the run's evaluations" + (since > 0 ? " after step " + std::to_string(since) : "") + ")\n";
  }
  if (!unused.empty()) s += "accept file: " + std::to_string(unused.size()) + " listed document(s) not contaminated (stale entries?)\n";
  for (const char* name : {"shared_files", "exact_instances", "exact_documents", "verbatim_spans", "ngram_fraction", "near_duplicates",
                           "audit_partition", "audit_exactly_once", "audit_resume", "audit_layout", "external_audit"}) {
    if (!checks.contains(name)) continue;
    const std::string key = name;
    const nlohmann::json& c = checks[key];
    char line[96];
    std::snprintf(line, sizeof line, "  %-20s %-8s", name, c["status"].get<std::string>().c_str());
    std::string extra;
    if (c.contains("contaminated")) {
      const std::string unit = key == "exact_instances" ? " holdout instances" : " holdout documents";
      extra += std::to_string(c["contaminated"].get<int64_t>()) + unit + " (" + fmt("%.2f%%", 100.0 * c["rate"].get<double>()) + ")";
      if (c.value("accepted", int64_t{0}) > 0) extra += ", " + std::to_string(c["accepted"].get<int64_t>()) + " accepted";
    } else if (c["status"] == "fail") {
      extra += std::to_string(c["failures"].get<int64_t>()) + " failure(s)";
    } else if (c["status"] == "skipped") {
      extra += c.value("reason", "");
    }
    if (c.contains("first")) {
      const std::string pos = position_text(c["first"]);
      if (!pos.empty()) extra += (extra.empty() ? "" : "; ") + std::string("first at ") + pos;
      if (c["first"].contains("reason")) extra += ": " + c["first"]["reason"].get<std::string>();
    }
    s += line + extra + "\n";
  }
  return s;
}

}  // namespace

void write_report(const ReportInputs& in, LeakReport& rep) {
  // The names the stages gave their findings, so the report reads as the checks were written.
  const LeakRun& run = in.run;
  const LeakCheckOptions& o = run.o;
  const LeakLevels& lv = o.levels;
  const ExternalStream* ext = run.ext;
  const LoaderConfig& base = run.base;
  const FslDataset& configured = run.configured();
  const std::unique_ptr<Loader>& probe = run.probe;
  const std::shared_ptr<const FslDataset>& holdout_ds = run.holdout_ds;
  const std::optional<uint32_t>& eos = run.eos;
  const int64_t steps = run.steps, bpe = run.bpe, L = run.L, G = run.G, mb = run.mb;
  const int W = run.W;
  const Holdout* hold = in.holdout.hold.get();
  const SeedIndex& index = *in.holdout.index;
  const double index_seconds = in.holdout.seconds, total_seconds = in.seconds;
  const StreamScan& scanned = in.streams.scanned;
  const StreamScan& reference = in.streams.reference();
  const bool separate_reference = in.streams.separate_reference;
  const DocumentFindings& docs = in.docs;
  const LevelCheck* level_results = docs.levels;
  const int64_t judged = docs.judged, contaminated_count = docs.contaminated_count;
  const int64_t accepted_count = docs.accepted_count, since_count = docs.since_count;
  const std::map<std::string, int64_t>& cause_counts = docs.cause_counts;
  const nlohmann::json& contaminated = docs.contaminated;
  const nlohmann::json& partial = docs.partial;
  const AcceptList& accept_list = in.accept_list;
  const nlohmann::json& checks = in.checks;
  std::vector<int64_t> contaminated_first_steps = docs.first_steps;
  nlohmann::json unused = nlohmann::json::array();
  for (const auto& k : accept_list)
    if (!docs.accept_used.count(k)) unused.push_back({{"file", k.first}, {"token_start", k.second}});

  for (const char* name : {"shared_files", "exact_instances", "exact_documents", "verbatim_spans", "ngram_fraction", "near_duplicates"})
    if (checks[name]["status"] == "fail") rep.contaminated = true;
  for (const char* name : {"audit_partition", "audit_exactly_once", "audit_resume", "audit_layout", "external_audit"})
    if (checks.contains(name) && checks[name]["status"] == "fail") rep.audit_failed = true;
  const std::string verdict = rep.contaminated && rep.audit_failed ? "contaminated+audit-failure"
                              : rep.contaminated                   ? "contaminated"
                              : rep.audit_failed                   ? "audit-failure"
                                                                   : "clean";
  // Evaluations affected: an evaluation after step E saw a model trained on every document delivered by then.
  std::sort(contaminated_first_steps.begin(), contaminated_first_steps.end());
  nlohmann::json affected{{"since", o.since > 0 ? nlohmann::json(o.since) : nlohmann::json(nullptr)},
                          {"first_step", contaminated_first_steps.empty() ? nlohmann::json(nullptr)
                                                                          : nlohmann::json(contaminated_first_steps.front())},
                          {"eval_interval", o.eval_interval}};
  nlohmann::json evals = nlohmann::json::array();
  if (o.eval_interval > 0 && !contaminated_first_steps.empty()) {
    for (int64_t e = o.eval_interval; e <= steps && evals.size() < 1000; e += o.eval_interval) {
      if (e <= o.since) continue;
      const int64_t n = std::upper_bound(contaminated_first_steps.begin(), contaminated_first_steps.end(), e) -
                        contaminated_first_steps.begin();
      if (n > 0) evals.push_back({{"step", e}, {"documents", n}});
    }
  }
  affected["evaluations"] = evals;

  nlohmann::json& j = rep.json;
  j["format"] = "olmoref-leakcheck/2";
  j["status"] = verdict;
  j["config"] = o.config_path;
  j["run"] = {{"train_mix", ext ? ext->source : configured.mix().source},
              {"dataset_fingerprint", ext ? nlohmann::json(nullptr) : nlohmann::json(probe->dataset().fingerprint())},
              {"holdout", base.holdout.describe()},
              {"seed", base.seed},
              {"sequence_length", L},
              {"global_batch_instances", G},
              {"microbatch_instances", mb},
              {"batches_per_epoch", bpe},
              {"eos_id", eos ? nlohmann::json(*eos) : nlohmann::json(nullptr)}};
  if (base.debug_bug != PlantedBug::none) j["run"]["planted_bug"] = planted_bug_name(base.debug_bug);
  j["levels"] = {{"verbatim_tokens", lv.verbatim_tokens}, {"ngram", lv.ngram}, {"ngram_fraction", lv.ngram_fraction},
                 {"seed_ngram", lv.seed_ngram}, {"near_duplicate", lv.near_duplicate},
                 {"min_doc_tokens", o.min_doc_tokens}};
  j["stream"] = {{"steps", steps},
                 {"epochs", bpe > 0 ? (steps + bpe - 1) / bpe : 0},
                 {"world_size", W},
                 {"instances", scanned.instances},
                 {"tokens", scanned.tokens},
                 {"scan_seconds", scanned.seconds},
                 {"tokens_per_second", scanned.seconds > 0 ? static_cast<double>(scanned.tokens) / scanned.seconds : 0.0},
                 {"threads", in.threads}};
  if (ext) {
    j["run"]["framework"] = ext->framework;
    j["run"]["global_batch_instances"] = ext->pieces_per_step;
    j["run"]["microbatch_instances"] = ext->pieces_per_microbatch > 0 ? nlohmann::json(ext->pieces_per_microbatch) : nlohmann::json(nullptr);
    j["run"]["sample_tokens"] = ext->piece_tokens;
    j["run"]["batches_per_epoch"] = nullptr;
    j["run"][ext->framework] = ext->info;
    j["stream"]["epochs"] = nullptr;
    j["stream"]["steps_available"] = ext->steps;
  }
  j["attribution"] = {{"enabled", o.attribute},
                      {"reference", !o.attribute ? "none (--no-attribution)"
                                    : ext ? "the framework's own index files: the stream its loader delivers"
                                    : separate_reference ? "a separate scan of the configured data through a correct loader"
                                                         : "the scanned stream (its loader is the correct one)"},
                      {"seconds", separate_reference ? reference.seconds : 0.0}};
  j["holdout"] = {{"files", holdout_ds->n_files()},
                  {"tokens", static_cast<int64_t>(hold->tokens.size())},
                  {"instances", holdout_ds->size()},
                  {"documents", static_cast<int64_t>(hold->docs.size())},
                  {"documents_judged", judged},
                  {"documents_are_instances", hold->docs_are_instances},
                  {"ngrams", hold->ngram_positions},
                  {"seed_ngrams", index.seeds()},
                  {"index", o.bloom ? "bloom" : "exact"},
                  {"index_bytes", index.bytes()},
                  {"index_seconds", index_seconds}};
  j["counts"] = {{"contaminated", contaminated_count},
                 {"accepted", accepted_count},
                 {"counted", since_count},
                 {"by_level", {{"exact", level_results[0].documents}, {"verbatim", level_results[1].documents},
                               {"ngram_fraction", level_results[2].documents}, {"near_duplicate", level_results[3].documents}}},
                 {"by_cause", cause_counts}};
  j["accept"] = {{"allow_data_overlap", o.allow_data_overlap},
                 {"file", o.accept_file.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.accept_file)},
                 {"listed", static_cast<int64_t>(accept_list.size())},
                 {"unused", unused}};
  j["affected"] = affected;
  j["checks"] = checks;
  j["contaminated_documents"] = contaminated;
  j["partial_overlaps"] = partial;
  j["seconds"] = total_seconds;
  j["work_dir"] = run.work.remove ? nlohmann::json(nullptr) : nlohmann::json(run.work.path);

  rep.summary = summary_text(j);
}

}  // namespace olmoref::data::leak
