#include "data/leakcheck.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "data/leakcheck_stages.h"

namespace olmoref::data {

namespace fs = std::filesystem;

std::set<std::pair<std::string, int64_t>> read_leak_accept_file(const std::string& path) {
  std::set<std::pair<std::string, int64_t>> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the accept file (--accept)");
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t start = 0;
    while (start < line.size() && std::isspace(static_cast<unsigned char>(line[start]))) ++start;
    line.erase(0, start);
    if (line.empty()) continue;
    const size_t sp = line.find_last_of(" \t");
    char* end = nullptr;
    const long long token = sp == std::string::npos ? -1 : std::strtoll(line.c_str() + sp + 1, &end, 10);
    if (sp == std::string::npos || token < 0 || end == line.c_str() + sp + 1 || *end != '\0')
      throw std::runtime_error(path + ":" + std::to_string(no) + ": expected 'HOLDOUT_FILE TOKEN_START' (the `file` and "
                               "`token_start` of a contaminated_documents entry), got '" + line + "'");
    std::string file = line.substr(0, sp);
    while (!file.empty() && std::isspace(static_cast<unsigned char>(file.back()))) file.pop_back();
    out.emplace(file, token);
  }
  return out;
}

namespace leak {

// What every later stage takes as fixed: what cannot be checked is refused here, before anything is read or scanned.
void prepare_run(const LoaderConfig& loader_config, LeakRun& run) {
  const LeakCheckOptions& o = run.o;
  if (!loader_config.dataset) throw std::invalid_argument("leakcheck: the loader configuration has no dataset");
  if (loader_config.holdout.kind == HoldoutKind::none) {
    throw std::invalid_argument("leakcheck: the run has no holdout (set data.holdout_mix or data.holdout_files)");
  }
  run.base = loader_config;
  run.base.audit = nullptr;
  run.base.prefetch = true;
  const FslDataset& configured = run.configured();
  run.G = run.base.global_batch_instances;
  run.mb = run.base.microbatch_instances;
  run.M = (run.G + run.mb - 1) / run.mb;
  run.L = configured.sequence_length();
  run.bpe = configured.size() / run.G;
  run.ext = o.external;
  const ExternalStream* ext = run.ext;
  if (ext && (ext->piece_tokens < 1 || ext->pieces_per_step < 1 || !ext->read))
    throw std::invalid_argument("leakcheck: the external stream has no pieces");
  if (ext && !o.audit_logs.empty())
    throw std::invalid_argument("leakcheck: --audit reads olmoref's audit logs; another framework's run is checked from its own files");
  if (o.world_size < 1 || run.M < o.world_size)
    throw std::invalid_argument("leakcheck: --world-size " + std::to_string(o.world_size) + " is more than the " +
                                std::to_string(run.M) + " micro-batches of a step (every rank computes at least one)");
  run.W = ext ? 1 : o.world_size;

  // The loader under test, once, for the dataset it serves. The holdout is opened as
  // Loader::holdout_dataset() does (the training sequence length, vocabulary and dtype), except that
  // a holdout file shorter than one instance is kept: its documents are held out all the same.
  if (!ext) run.probe = std::make_unique<Loader>(run.base);
  DatasetOptions holdout_opts;
  holdout_opts.sequence_length = run.L;
  holdout_opts.vocab_size = configured.vocab_size();
  holdout_opts.dtype = configured.dtype();
  holdout_opts.eos_id = configured.eos_id();
  holdout_opts.allow_short_files = true;
  run.holdout_ds = std::make_shared<const FslDataset>(run.base.holdout.mix, holdout_opts);
  run.eos = o.eos_id ? o.eos_id : configured.eos_id();

  // External logs decide how far the stream must go.
  if (!o.audit_logs.empty()) run.external = read_audit_logs(o.audit_logs);
  int64_t steps = o.whole_epoch ? run.bpe : o.steps;
  if (ext) {
    if (steps > ext->steps)
      throw std::invalid_argument("leakcheck: " + std::to_string(steps) + " steps asked for, but the " + ext->framework +
                                  " files hold " + std::to_string(ext->steps) + " steps of " +
                                  std::to_string(ext->pieces_per_step) + " samples");
    if (steps <= 0) steps = ext->steps;
  }
  for (const AuditRecord& r : run.external) steps = std::max(steps, r.step);
  if (steps <= 0) throw std::invalid_argument("leakcheck: give the steps to check (or the whole epoch)");
  run.steps = steps;

  if (o.work_dir.empty()) {
    std::string templ = (fs::temp_directory_path() / "olmoref-leakcheck-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("leakcheck: cannot create a temporary directory");
    run.work.path = templ;
    run.work.remove = true;
  } else {
    run.work.path = o.work_dir;
    fs::create_directories(run.work.path);
  }
}

// Every holdout document is found in a delivered instance through its seed n-grams: the index of those n-grams is
// built once, and every instance of the stream probes it.
void build_holdout_index(const LeakRun& run, HoldoutIndex& out) {
  const LeakCheckOptions& o = run.o;
  const LeakLevels& lv = o.levels;
  if (lv.seed_ngram < 4 || lv.ngram < lv.seed_ngram)
    throw std::invalid_argument("leakcheck: need 4 <= seed n-gram (" + std::to_string(lv.seed_ngram) + ") <= n-gram (" +
                                std::to_string(lv.ngram) + ")");
  if (lv.verbatim_tokens < lv.seed_ngram)
    throw std::invalid_argument("leakcheck: the verbatim span level (" + std::to_string(lv.verbatim_tokens) +
                                " tokens) is shorter than the seed n-gram (" + std::to_string(lv.seed_ngram) + ")");
  const auto t_index = std::chrono::steady_clock::now();
  out.hold = load_holdout(run.holdout_ds, run.eos, o.min_doc_tokens);
  Holdout& hold = *out.hold;
  out.text.tokens = hold.tokens;
  for (const HoldoutDoc& d : hold.docs) out.text.begin.push_back(d.begin);
  out.text.begin.push_back(static_cast<int64_t>(hold.tokens.size()));
  for (const HoldoutDoc& d : hold.docs) {
    if (d.len >= lv.ngram) {
      hold.ngram_positions += d.len - lv.ngram + 1;
    }
  }
  out.index = std::make_unique<const SeedIndex>(out.text, lv.seed_ngram,
                                                o.bloom ? NgramSet::Kind::bloom : NgramSet::Kind::exact,
                                                o.bloom_bits_per_ngram);
  out.seconds = seconds_since(t_index);
}

// The stream as the loader delivers it (W rank loaders, each scanning its micro-batches), and the reference: the
// configured data as a correct loader delivers it over the same steps (the same stream, unless a test planted a
// loader bug), which decides the cause of what the stream holds.
void stream_training_instances(const LeakRun& run, const HoldoutIndex& holdout, ThreadPool& pool, Streams& out) {
  const LeakCheckOptions& o = run.o;
  const ExternalStream* ext = run.ext;
  const int seed_ngram = o.levels.seed_ngram;
  const ScanContext ctx{*holdout.hold, holdout.text, *holdout.index, o.levels.ngram, ext ? ext->piece_tokens : run.L,
                        run.L,         run.eos,      o.min_doc_tokens};
  const std::string stream_prefix = run.work.path + "/stream.w" + std::to_string(run.W);
  out.scanned = ext ? scan_external(*ext, run.steps, ctx, pool, o.chunk_tokens)
                    : scan_stream(run.base, run.W, run.steps, stream_prefix, ctx, pool, o.chunk_tokens);
  // Another framework's stream is reconstructed from its own index files: what its loader delivers is what those
  // files and the data say, so the data is the cause of what it holds.
  out.separate_reference = !ext && o.attribute && run.base.debug_bug != PlantedBug::none;
  if (out.separate_reference) {
    LoaderConfig clean = run.base;
    clean.debug_bug = PlantedBug::none;
    out.reference_owned = scan_stream(clean, 1, run.steps, run.work.path + "/reference.w1", ctx, pool, o.chunk_tokens);
  }
  if (ext) bridge_boundaries(out.scanned, {&run.configured()}, holdout.text, seed_ngram, ext->piece_tokens);
  else bridge_boundaries(out.scanned, {&run.probe->dataset(), &run.configured()}, holdout.text, seed_ngram, run.L);
  const std::vector<const FslDataset*> datasets{ext ? &run.configured() : &run.probe->dataset(), &run.configured()};
  if (out.separate_reference) bridge_boundaries(out.reference_owned, datasets, holdout.text, seed_ngram, run.L);
}

namespace {

// How far a document's delivered tokens reach on each level.
struct Reached {
  bool level[4] = {false, false, false, false};
  int64_t covered = 0, ngram_hit = 0, longest = 0;
  bool any() const { return level[0] || level[1] || level[2] || level[3]; }
};

// Which of a document's delivered tokens a judgement counts: the attribution judges the part the reference
// also delivered (its cause is the data) apart from the part it did not (the loader put it there).
enum class Part { all, data, loader };

// One holdout document and what the scans found of it.
struct DocumentHits {
  const HoldoutDoc& d;
  const DocMatches* m;          // its verbatim spans (nullptr: none)
  const FirstCount* exact_fc;   // its deliveries whole (nullptr: none)
  bool ref_exact;               // the reference delivered it whole
  int64_t text_len;             // tokens without its EOS
  int64_t positions;            // its n-gram positions
};

// The levels the document reaches over `part` of its delivered tokens. cover and ref_cover: one byte per holdout
// token (MatchSink bits) of the scanned stream and the reference.
Reached judge(const DocumentHits& h, Part part, const std::vector<uint8_t>& cover, const std::vector<uint8_t>& ref_cover,
              const LeakCheckOptions& o) {
  const LeakLevels& lv = o.levels;
  const int64_t b = h.d.begin, e = h.d.begin + h.d.len;
  Reached r;
  int64_t run = 0;
  for (int64_t p = b; p < e; ++p) {
    const uint8_t c = cover.empty() ? 0 : cover[static_cast<size_t>(p)];
    const uint8_t rc = ref_cover.empty() ? 0 : ref_cover[static_cast<size_t>(p)];
    auto in_part = [&](uint8_t bit) {
      if (!(c & bit)) return false;
      return part == Part::all || (part == Part::data ? (rc & bit) != 0 : (rc & bit) == 0);
    };
    if (in_part(MatchSink::kCovered)) {
      ++r.covered;
      run = (c & MatchSink::kBreak) ? 1 : run + 1;  // a run continues only where the stream did (or a cut)
      r.longest = std::max(r.longest, run);
    } else {
      run = 0;
    }
    if (p + lv.ngram <= e && in_part(MatchSink::kNgramStart)) ++r.ngram_hit;
  }
  if (part == Part::all && h.m) r.longest = std::max(r.longest, h.m->longest);
  const bool exact = part == Part::all    ? h.exact_fc != nullptr
                     : part == Part::data ? h.exact_fc && h.ref_exact
                                          : h.exact_fc && !h.ref_exact;
  r.level[0] = exact;
  // A document shorter than the span level counts as verbatim when its whole text was delivered.
  r.level[1] = h.text_len >= o.min_doc_tokens && r.longest >= std::min<int64_t>(lv.verbatim_tokens, h.text_len);
  // The fraction levels judge documents of at least 2k tokens: in a shorter one a single common phrase of k
  // tokens would be most of it. A shorter document counts when all its text was delivered (above).
  const bool long_enough = h.d.len >= 2 * lv.seed_ngram;
  r.level[2] = long_enough && h.positions > 0 && rate(r.ngram_hit, h.positions) >= lv.ngram_fraction;
  r.level[3] = long_enough && rate(r.covered, h.d.len) >= lv.near_duplicate;
  return r;
}

}  // namespace

// Every holdout document with something delivered, judged on every level, with its cause (data, loader, both) and
// whether the user accepted it; what reaches no level is kept as a partial overlap (the 1000 largest).
DocumentFindings classify_documents(const LeakRun& run, const HoldoutIndex& holdout, const Streams& streams,
                                    const AcceptList& accept_list) {
  const LeakCheckOptions& o = run.o;
  const LeakLevels& lv = o.levels;
  const Holdout& hold = *holdout.hold;
  const std::optional<uint32_t>& eos = run.eos;
  const PartHits& hits = streams.scanned.hits;
  const StreamScan& reference = streams.reference();
  const std::vector<uint8_t>& cover = hits.matches.cover;  // empty: nothing matched
  const std::vector<uint8_t>& ref_cover = reference.hits.matches.cover;

  DocumentFindings f;
  for (int i = 0; i < 4; ++i) f.levels[i].check = CheckResult(kLevelChecks[i]);
  std::vector<std::pair<double, nlohmann::json>> partial_sorted;
  std::set<int64_t> candidate_docs;
  for (const auto& [d, m] : hits.matches.docs) candidate_docs.insert(d);
  for (const auto& [d, fc] : hits.docs) candidate_docs.insert(d);
  for (size_t di = 0; di < hold.docs.size(); ++di)
    if (hold.docs[di].len >= lv.ngram || (eos && hold.docs[di].len >= o.min_doc_tokens)) ++f.judged;
  for (const int64_t di : candidate_docs) {
    const HoldoutDoc& d = hold.docs[static_cast<size_t>(di)];
    const int64_t e = d.begin + d.len;
    const auto mit = hits.matches.docs.find(di);
    const auto xit = hits.docs.find(di);
    // The document's text without its EOS: what "delivered whole" means when it was spliced in without one.
    const int64_t text_len = eos && d.len > 0 && hold.tokens[static_cast<size_t>(e - 1)] == *eos ? d.len - 1 : d.len;
    const DocumentHits h{d,
                         mit == hits.matches.docs.end() ? nullptr : &mit->second,
                         xit == hits.docs.end() ? nullptr : &xit->second,
                         reference.hits.docs.find(di) != reference.hits.docs.end(),
                         text_len,
                         std::max<int64_t>(0, d.len - lv.ngram + 1)};
    const DocMatches* m = h.m;
    const FirstCount* exact_fc = h.exact_fc;

    const Reached all = judge(h, Part::all, cover, ref_cover, o);
    const double ngram_frac = rate(all.ngram_hit, h.positions), near_score = rate(all.covered, d.len);
    nlohmann::json j{{"document", di},
                     {"file", run.holdout_ds->file(static_cast<size_t>(d.file)).path()},
                     {"token_start", d.file_start},
                     {"tokens", d.len},
                     {"longest_run", all.longest},
                     {"longest_span", m ? m->longest : 0},
                     {"ngram_fraction", ngram_frac},
                     {"near_duplicate_score", near_score},
                     {"exact", exact_fc != nullptr}};
    FirstCount first;
    if (m) first.add(m->first);
    if (exact_fc) first.add(*exact_fc);
    if (first.count > 0) {
      j["first"] = first.first;
      if (!first.first.file.empty() && first.first.token_start >= 0)
        j["source"] = {{"file", first.first.file},
                       {"token_offset", first.first.token_start + std::max<int64_t>(0, first.first.token_offset)}};
    }
    j["deliveries"] = m ? m->pieces : (exact_fc ? exact_fc->count : 0);
    j["spans_delivered"] = m ? m->first.count : 0;
    j["exact_deliveries"] = exact_fc ? exact_fc->count : 0;
    if (m) {
      j["longest_span_at"] = m->longest_at;
      j["longest_span_document_offset"] = m->longest_doc_offset;
    }
    if (!all.any()) {
      partial_sorted.emplace_back(std::max(ngram_frac, near_score), std::move(j));
      continue;
    }
    std::string cause = "unknown";
    if (o.attribute && !streams.separate_reference) {
      cause = "data";  // the scanned loader is the correct one: whatever it delivers, the configured data holds
    } else if (o.attribute) {
      const Reached in_data = judge(h, Part::data, cover, ref_cover, o);
      const Reached in_loader = judge(h, Part::loader, cover, ref_cover, o);
      const bool data = in_data.any(), loader = in_loader.any();
      // Neither part reaches a level alone: the cause is the part that delivered anything at all, or both.
      const bool data_some = in_data.covered > 0 || in_data.level[0], loader_some = in_loader.covered > 0 || in_loader.level[0];
      cause = data && loader ? "both" : loader ? "loader" : data ? "data"
              : data_some && loader_some ? "both" : loader_some ? "loader" : "data";
      j["data_part"] = {{"longest_run", in_data.longest}, {"ngram_fraction", rate(in_data.ngram_hit, h.positions)},
                        {"near_duplicate_score", rate(in_data.covered, d.len)}};
      j["loader_part"] = {{"longest_run", in_loader.longest}, {"ngram_fraction", rate(in_loader.ngram_hit, h.positions)},
                          {"near_duplicate_score", rate(in_loader.covered, d.len)}};
    }
    const std::pair<std::string, int64_t> key{run.holdout_ds->file(static_cast<size_t>(d.file)).path(), d.file_start};
    const bool listed = accept_list.count(key) > 0;
    const bool accepted = cause == "data" && (o.allow_data_overlap || listed);
    if (listed) f.accept_used.insert(key);
    const bool counted = !accepted && (o.since <= 0 || first.first.step > o.since);
    nlohmann::json levels = nlohmann::json::array();
    for (int i = 0; i < 4; ++i) {
      if (!all.level[i]) continue;
      levels.push_back(kLevelNames[i]);
      LevelCheck& lc = f.levels[i];
      ++lc.documents;
      ++lc.by_cause[cause];
      if (accepted) ++lc.accepted;
      if (counted) {
        StreamPosition at = first.first;
        lc.check.fail(at, "holdout document " + std::to_string(di) + " (" + key.first + " token " +
                              std::to_string(key.second) + ", cause " + cause + "): " +
                              (i == 0 ? "delivered whole"
                               : i == 1 ? "a " + std::to_string(all.longest) + "-token verbatim run delivered"
                               : i == 2 ? fmt("%.3f", ngram_frac) + " of its " + std::to_string(lv.ngram) + "-grams delivered"
                                        : fmt("%.3f", near_score) + " of its tokens delivered in spans of >= " +
                                              std::to_string(lv.seed_ngram) + " tokens"));
      }
    }
    j["levels"] = levels;
    j["cause"] = cause;
    j["accepted"] = accepted;
    if (o.since > 0) j["after_since"] = first.first.step > o.since;
    ++f.contaminated_count;
    ++f.cause_counts[cause];
    if (accepted) ++f.accepted_count;
    if (counted) ++f.since_count;
    f.first_steps.push_back(first.first.step);
    f.contaminated.push_back(std::move(j));
  }
  for (int i = 0; i < 4; ++i) {
    LevelCheck& lc = f.levels[i];
    lc.check.checked = f.judged;
    if (lc.check.status == "pass" && lc.accepted > 0) lc.check.status = "warn";
    lc.check.details["contaminated"] = lc.documents;
    lc.check.details["accepted"] = lc.accepted;
    lc.check.details["rate"] = rate(lc.documents, f.judged);
    lc.check.details["by_cause"] = lc.by_cause;
  }
  f.levels[0].check.details["min_doc_tokens"] = o.min_doc_tokens;
  if (!eos) f.levels[0].check.skip("the EOS id is unknown (set data.eos_id or --eos), so documents cannot be delimited");
  f.levels[1].check.details["level_tokens"] = lv.verbatim_tokens;
  f.levels[2].check.details["n"] = lv.ngram;
  f.levels[2].check.details["level"] = lv.ngram_fraction;
  f.levels[3].check.details["seed_ngram"] = lv.seed_ngram;
  f.levels[3].check.details["level"] = lv.near_duplicate;
  std::stable_sort(partial_sorted.begin(), partial_sorted.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < partial_sorted.size() && i < 1000; ++i) f.partial.push_back(std::move(partial_sorted[i].second));
  return f;
}

namespace {

// Same file on both sides: the same file (canonical path), or the same bytes under another name (data/mix.h
// shared_files, the check `olmoref train` refuses such a config with).
nlohmann::json shared_file_list(const FslDataset& train, const FslDataset& holdout, CheckResult& res) {
  nlohmann::json list = nlohmann::json::array();
  res.checked += static_cast<int64_t>(train.n_files());
  for (const SharedFile& f : shared_files(train.mix(), holdout.mix())) {
    const std::string tp = train.file(f.a).path(), hp = holdout.file(f.b).path();
    const std::string how = f.same_path ? "same path" : "same size and XXH3";
    StreamPosition p;  // static: no stream position
    res.fail(p, "training file " + tp + " is holdout file " + hp + " (" + how + ")");
    list.push_back({{"train_file", tp}, {"train_index", f.a}, {"holdout_file", hp}, {"holdout_index", f.b},
                    {"match", how}});
  }
  return list;
}

}  // namespace

// A holdout file that is also a training file leaks whole, whatever the stream: found from the configuration alone.
nlohmann::json check_shared_files(const LeakRun& run) {
  CheckResult files("shared_files");
  if (run.ext) {
    files.skip("another framework's token files (" + run.ext->source + "): not compared file by file");
  } else {
    files.details["files"] = shared_file_list(run.probe->dataset(), *run.holdout_ds, files);
    files.details["training_files"] = run.probe->dataset().n_files();
  }
  files.details["holdout_files"] = run.holdout_ds->n_files();
  return files.to_json();
}

// A training instance whose tokens are a holdout instance's; counted per holdout instance, not per occurrence.
nlohmann::json check_exact_instances(const LeakRun& run, const Streams& streams) {
  const LeakCheckOptions& o = run.o;
  const PartHits& hits = streams.scanned.hits;
  const StreamScan& reference = streams.reference();
  CheckResult exact_inst("exact_instances");
  exact_inst.checked = streams.scanned.instances;
  int64_t inst_occ = 0, inst_accepted = 0;
  for (const auto& [hid, fc] : hits.instances) {
    inst_occ += fc.count;
    const bool data = !o.attribute || reference.hits.instances.count(hid) > 0;
    if (data && o.attribute && o.allow_data_overlap) {
      ++inst_accepted;
      continue;
    }
    if (o.since > 0 && fc.first.step <= o.since) continue;
    exact_inst.fail(fc.first, "holdout instance " + std::to_string(hid) + " delivered for training" +
                                  (o.attribute ? std::string(data ? " (cause data)" : " (cause loader)") : ""));
  }
  exact_inst.failures = static_cast<int64_t>(hits.instances.size()) - inst_accepted;  // holdout instances, not occurrences
  if (exact_inst.status == "pass" && inst_accepted > 0) exact_inst.status = "warn";
  exact_inst.details["holdout_instances"] = run.holdout_ds->size();
  exact_inst.details["contaminated"] = static_cast<int64_t>(hits.instances.size());
  exact_inst.details["accepted"] = inst_accepted;
  exact_inst.details["rate"] = rate(static_cast<int64_t>(hits.instances.size()), run.holdout_ds->size());
  exact_inst.details["occurrences"] = inst_occ;
  exact_inst.details["training_instances_scanned"] = streams.scanned.instances;
  exact_inst.details["hash_matches_rejected"] = hits.hash_mismatch;  // equal XXH3, different tokens (instances and documents)
  return exact_inst.to_json();
}

}  // namespace leak

// The stages in order (data/leakcheck_stages.h): each hands the next what it found.
LeakReport run_leakcheck(const LoaderConfig& loader_config, const LeakCheckOptions& o) {
  using namespace leak;
  const auto t_start = std::chrono::steady_clock::now();
  LeakRun run(o);
  prepare_run(loader_config, run);
  HoldoutIndex holdout;
  build_holdout_index(run, holdout);
  const AcceptList accept_list = read_leak_accept_file(o.accept_file);

  ThreadPool pool(o.threads);
  Streams streams;
  stream_training_instances(run, holdout, pool, streams);
  const DocumentFindings docs = classify_documents(run, holdout, streams, accept_list);

  nlohmann::json checks = nlohmann::json::object();
  checks["shared_files"] = check_shared_files(run);
  checks["exact_instances"] = check_exact_instances(run, streams);
  for (int i = 0; i < 4; ++i) checks[kLevelChecks[i]] = docs.levels[i].check.to_json();
  const MatchSink& ms = streams.scanned.hits.matches;
  checks["near_duplicates"]["windows_scanned"] = ms.windows;
  checks["near_duplicates"]["candidates"] = ms.index_hits;
  checks["near_duplicates"]["rejected_candidates"] = ms.rejected;
  checks["near_duplicates"]["spans_found"] = ms.mems;
  audit_loader(run, *holdout.hold, streams.reference(), checks);

  LeakReport rep;
  write_report({run, holdout, streams, docs, accept_list, checks, pool.size(), seconds_since(t_start)}, rep);
  return rep;
}

}  // namespace olmoref::data
