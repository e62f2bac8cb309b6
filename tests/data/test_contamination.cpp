// tests/data/test_contamination.cpp — the leakage detector's benchmark: a generator plants holdout text in the
// training files at known places, by class (verbatim copies shorter and longer than seq_len, spliced without EOS,
// partial spans of several lengths, copies with a token changed / inserted / deleted every k tokens, duplicates
// across files, the holdout file in the mix) and plants what must NOT count (holdout text in dropped file tails, in
// the cropped last batch of the epoch, in instances delivered only after --steps; lookalike text sharing short
// phrases; the untouched holdout documents). `olmoref leakcheck` (run_leakcheck) must then report precision and
// recall per class that docs/formats/leakcheck.md quotes: recall 1.0 on verbatim text >= the span level and on edits
// every >= 10 tokens, no document of a negative class reported, every planted document's first delivery and source
// exactly where the generator put it. The table is printed (and written as JSON to $OLMOREF_LEAK_BENCH_OUT if set).
#include <doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "data/leakcheck.h"
#include "data/shuffle.h"
#include "leak_fixture.h"

using namespace olmoref::data;
using namespace olmoref::leaktest;

namespace {

constexpr int64_t kSeq = 256, kG = 8, kMb = 2, kSteps = 125;
// Instances per training file: not a multiple of the global batch in total, so the epoch has a cropped tail.
constexpr int64_t kFileInstances[] = {301, 300, 300, 306};  // 1207 instances: 7 cropped

struct HoldoutDocRef {
  int64_t start = 0, len = 0;  // in the holdout file; len includes the EOS
};

struct Planted {
  std::string cls;
  int64_t text_tokens = 0;     // tokens of the planted text
  bool positive = false;       // ground truth: this document's text reaches the stream beyond a level
  int64_t doc = -1;            // holdout document
  int64_t file = -1;           // training file, token offset of the planted text
  int64_t offset = -1;
  int64_t expect_step = -1;    // the step that delivers its first token (positives placed in delivered instances)
};

struct Bench {
  TempDir dir{"bench"};
  std::mt19937_64 rng{20261201};
  std::vector<uint32_t> holdout;
  std::vector<HoldoutDocRef> hdocs;
  std::vector<std::vector<uint32_t>> train;  // per file, a multiple of kSeq tokens, then optional tail
  std::vector<int64_t> first_instance;       // global id of each file's first instance
  std::vector<int64_t> position;             // per global instance: position in epoch 1's order (-1: cropped)
  std::vector<bool> used;                    // instance already carries planted text
  std::vector<Planted> planted;
  std::vector<size_t> free_docs;             // holdout documents not yet used, shuffled
  std::vector<std::string> train_paths;
  std::string holdout_path;

  uint32_t random_token() { return static_cast<uint32_t>(rng() % kEos); }

  Bench() {
    // Holdout: 420 random documents of 100..400 tokens (EOS included).
    for (int d = 0; d < 420; ++d) {
      const int64_t len = 100 + static_cast<int64_t>(rng() % 301);
      hdocs.push_back({static_cast<int64_t>(holdout.size()), len});
      for (int64_t i = 0; i + 1 < len; ++i) holdout.push_back(random_token());
      holdout.push_back(kEos);
    }
    for (size_t d = 0; d < hdocs.size(); ++d) free_docs.push_back(d);
    std::shuffle(free_docs.begin(), free_docs.end(), rng);
    int64_t n = 0;
    for (const int64_t m : kFileInstances) {
      first_instance.push_back(n);
      n += m;
      std::vector<uint32_t> t;
      while (static_cast<int64_t>(t.size()) < m * kSeq) {
        const int64_t len = 20 + static_cast<int64_t>(rng() % 200);
        for (int64_t i = 0; i < len; ++i) t.push_back(random_token());
        t.push_back(kEos);
      }
      t.resize(static_cast<size_t>(m * kSeq));
      train.push_back(std::move(t));
    }
    position.assign(static_cast<size_t>(n), -1);
    used.assign(static_cast<size_t>(n), false);
    const GlobalOrder order(kOlmoCoreDefaultSeed, 1, n, kG);
    const auto idx = order.indices();
    for (size_t p = 0; p < idx.size(); ++p) position[idx[p]] = static_cast<int64_t>(p);
  }

  int64_t n_instances() const { return static_cast<int64_t>(position.size()); }
  bool delivered(int64_t id) const { return position[static_cast<size_t>(id)] >= 0 && position[static_cast<size_t>(id)] < kSteps * kG; }
  int64_t step_of(int64_t id) const { return position[static_cast<size_t>(id)] / kG + 1; }
  std::pair<int64_t, int64_t> file_of(int64_t id) const {
    int64_t f = 0;
    while (f + 1 < static_cast<int64_t>(first_instance.size()) && first_instance[static_cast<size_t>(f + 1)] <= id) ++f;
    return {f, (id - first_instance[static_cast<size_t>(f)]) * kSeq};
  }

  size_t take_doc(int64_t min_len, int64_t max_len) {
    for (size_t i = 0; i < free_docs.size(); ++i) {
      const HoldoutDocRef& h = hdocs[free_docs[i]];
      if (h.len >= min_len && h.len <= max_len) {
        const size_t d = free_docs[i];
        free_docs.erase(free_docs.begin() + static_cast<std::ptrdiff_t>(i));
        return d;
      }
    }
    FAIL("the generator ran out of holdout documents of " << min_len << ".." << max_len << " tokens");
    return 0;
  }
  std::vector<uint32_t> doc_text(size_t d, bool with_eos) const {
    const HoldoutDocRef& h = hdocs[d];
    return {holdout.begin() + h.start, holdout.begin() + h.start + h.len - (with_eos ? 0 : 1)};
  }

  // Two consecutive instances of one file, neither used yet, both delivered (want == 1), or both in the given
  // undelivered group (want == 2: cropped, want == 3: delivered only after kSteps).
  int64_t take_pair(int want) {
    for (int tries = 0; tries < 100000; ++tries) {
      const int64_t id = static_cast<int64_t>(rng() % static_cast<uint64_t>(n_instances() - 1));
      if (file_of(id).first != file_of(id + 1).first || used[static_cast<size_t>(id)] || used[static_cast<size_t>(id + 1)]) continue;
      auto group = [&](int64_t i) { return position[static_cast<size_t>(i)] < 0 ? 2 : delivered(i) ? 1 : 3; };
      if (group(id) != want || group(id + 1) != want) continue;
      used[static_cast<size_t>(id)] = used[static_cast<size_t>(id + 1)] = true;
      return id;
    }
    FAIL("no free instance pair of group " << want);
    return -1;
  }
  int64_t take_single(int want) {
    for (int tries = 0; tries < 100000; ++tries) {
      const int64_t id = static_cast<int64_t>(rng() % static_cast<uint64_t>(n_instances()));
      if (used[static_cast<size_t>(id)]) continue;
      const int g = position[static_cast<size_t>(id)] < 0 ? 2 : delivered(id) ? 1 : 3;
      if (g != want) continue;
      used[static_cast<size_t>(id)] = true;
      return id;
    }
    FAIL("no free instance of group " << want);
    return -1;
  }

  // Writes `text` at a random offset inside instances id, id + 1 (or id alone when single) and records it.
  void plant(const std::string& cls, bool positive, size_t doc, const std::vector<uint32_t>& text, int want = 1,
             bool single = false, bool eos_before = false) {
    const int64_t id = single ? take_single(want) : take_pair(want);
    const int64_t room = (single ? 1 : 2) * kSeq - static_cast<int64_t>(text.size()) - (eos_before ? 1 : 0);
    REQUIRE(room >= 0);
    const int64_t off = (eos_before ? 1 : 0) + static_cast<int64_t>(rng() % static_cast<uint64_t>(room + 1));
    const auto [f, start] = file_of(id);
    std::vector<uint32_t>& t = train[static_cast<size_t>(f)];
    if (eos_before) t[static_cast<size_t>(start + off - 1)] = kEos;
    std::copy(text.begin(), text.end(), t.begin() + start + off);
    // Random tokens right around the text (never the document's own neighbours by accident).
    if (start + off + static_cast<int64_t>(text.size()) < static_cast<int64_t>(t.size()) && text.back() != kEos)
      t[static_cast<size_t>(start + off + static_cast<int64_t>(text.size()))] = random_token();
    Planted p{cls, static_cast<int64_t>(text.size()), positive, static_cast<int64_t>(doc), f, start + off, -1};
    if (want == 1) {
      // The first delivery: the earlier step of the instances holding at least a seed's worth (8 tokens) of it.
      const int64_t len = static_cast<int64_t>(text.size());
      const int64_t in_first = single ? len : std::max<int64_t>(0, std::min(len, kSeq - off));
      int64_t best = std::numeric_limits<int64_t>::max();
      if (in_first >= 8) best = std::min(best, step_of(id));
      if (!single && len - in_first >= 8) best = std::min(best, step_of(id + 1));
      p.expect_step = best;
    }
    planted.push_back(p);
  }

  void write() {
    for (size_t f = 0; f < train.size(); ++f)
      train_paths.push_back(write_u16(dir.file("train-" + std::to_string(f) + ".u16"), train[f]));
    holdout_path = write_u16(dir.file("holdout.u16"), holdout);
  }

  LoaderConfig loader(bool holdout_in_mix = false) const {
    DatasetOptions o;
    o.sequence_length = kSeq;
    o.vocab_size = kVocab;
    o.dtype = Dtype::u16;
    o.eos_id = kEos;
    LoaderConfig lc;
    std::vector<std::string> files = train_paths;
    if (holdout_in_mix) files.push_back(holdout_path);
    lc.dataset = std::make_shared<FslDataset>(Mix::from_paths(files), o);
    lc.seed = kOlmoCoreDefaultSeed;
    lc.global_batch_instances = kG;
    lc.microbatch_instances = kMb;
    lc.holdout = HoldoutSpec::separate(Mix::from_paths({holdout_path}));
    return lc;
  }
};

std::vector<uint32_t> edited(const std::vector<uint32_t>& t, char how, int k, std::mt19937_64& rng) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < t.size(); ++i) {
    const bool hit = (i + 1) % static_cast<size_t>(k) == 0;
    if (how == 's' && hit) out.push_back(static_cast<uint32_t>((t[i] + 1 + rng() % (kEos - 1)) % kEos));
    else if (how == 'd' && hit) continue;
    else out.push_back(t[i]);
    if (how == 'i' && hit) out.push_back(static_cast<uint32_t>(rng() % kEos));
  }
  return out;
}

struct ClassStats {
  bool positive = false;
  int planted = 0, found = 0, first_ok = 0, source_ok = 0, run_ok = 0, run_expected = 0;
  std::map<std::string, int> levels;
};

}  // namespace

TEST_CASE("contamination benchmark: precision and recall per planted class, at the default levels") {
  Bench b;
  const int per = 10;
  for (int i = 0; i < per; ++i) {
    const size_t d = b.take_doc(100, 200);
    b.plant("verbatim, shorter than seq_len", true, d, b.doc_text(d, true), 1, true, true);
  }
  for (int i = 0; i < per; ++i) {
    const size_t d = b.take_doc(300, 400);
    b.plant("verbatim, longer than seq_len", true, d, b.doc_text(d, true));
  }
  for (int i = 0; i < per; ++i) {
    const size_t d = b.take_doc(100, 250);
    b.plant("spliced without EOS", true, d, b.doc_text(d, false));
  }
  for (const int n : {16, 24, 31, 32, 40, 60, 120}) {
    for (int i = 0; i < per; ++i) {
      const size_t d = b.take_doc(300, 400);
      const std::vector<uint32_t> t = b.doc_text(d, false);
      const size_t at = static_cast<size_t>(b.rng() % (t.size() - static_cast<size_t>(n)));
      b.plant("span of " + std::to_string(n) + " tokens", n >= 32, d, {t.begin() + static_cast<std::ptrdiff_t>(at),
                                                                      t.begin() + static_cast<std::ptrdiff_t>(at) + n});
    }
  }
  for (const char how : {'s', 'i', 'd'}) {
    for (const int k : {5, 8, 10, 20}) {
      for (int i = 0; i < per; ++i) {
        const size_t d = b.take_doc(100, 300);
        const char* name = how == 's' ? "changed" : how == 'i' ? "inserted" : "deleted";
        b.plant(std::string("a token ") + name + " every " + std::to_string(k), true, d, edited(b.doc_text(d, false), how, k, b.rng));
      }
    }
  }
  for (int i = 0; i < 5; ++i) {  // the same document in two training files
    const size_t d = b.take_doc(100, 250);
    b.plant("duplicated across files", true, d, b.doc_text(d, true));
    b.plant("duplicated across files (2nd copy)", true, d, b.doc_text(d, true));
  }
  // Negatives: text the stream never delivers, and lookalikes.
  for (int i = 0; i < 5; ++i) {
    const size_t d = b.take_doc(100, 250);
    b.plant("in the cropped last batch", false, d, b.doc_text(d, true), 2, true);
  }
  for (int i = 0; i < per; ++i) {
    const size_t d = b.take_doc(100, 250);
    b.plant("delivered only after --steps", false, d, b.doc_text(d, true), 3, true);
  }
  for (int i = 0; i < per; ++i) {  // 7-token phrases of one document, each between random tokens
    const size_t d = b.take_doc(200, 400);
    const std::vector<uint32_t> t = b.doc_text(d, false);
    std::vector<uint32_t> look;
    for (size_t j = 0; j + 7 <= t.size() && look.size() + 14 < 2 * kSeq; j += 14) {
      look.insert(look.end(), t.begin() + static_cast<std::ptrdiff_t>(j), t.begin() + static_cast<std::ptrdiff_t>(j) + 7);
      for (int r = 0; r < 3; ++r) look.push_back(b.random_token());
    }
    b.plant("lookalike: its 7-token phrases", false, d, look);
  }
  for (int i = 0; i < per; ++i) {  // one shared 20-token phrase
    const size_t d = b.take_doc(100, 250);
    const std::vector<uint32_t> t = b.doc_text(d, false);
    b.plant("lookalike: one 20-token phrase", false, d, {t.begin() + 10, t.begin() + 30});
  }
  // Dropped tails: each file ends in a tail shorter than an instance holding a short holdout document.
  for (size_t f = 0; f < b.train.size(); ++f) {
    const size_t d = b.take_doc(100, 200);
    const std::vector<uint32_t> t = b.doc_text(d, true);
    b.planted.push_back({"in a dropped file tail", static_cast<int64_t>(t.size()), false, static_cast<int64_t>(d), static_cast<int64_t>(f),
                         static_cast<int64_t>(b.train[f].size()) + 1, -1});
    b.train[f].push_back(kEos);
    b.train[f].insert(b.train[f].end(), t.begin(), t.end());
    REQUIRE(static_cast<int64_t>(t.size()) + 1 < kSeq);
  }
  std::set<size_t> untouched(b.free_docs.begin(), b.free_docs.end());
  b.write();

  LeakCheckOptions o;
  o.steps = kSteps;
  o.threads = 2;
  o.audit_checks = false;
  o.chunk_tokens = 1 << 15;
  const LeakReport r = run_leakcheck(b.loader(), o);
  std::map<int64_t, const nlohmann::json*> reported;
  for (const auto& d : r.json["contaminated_documents"]) reported[d["document"].get<int64_t>()] = &d;

  std::map<int64_t, int64_t> expect_first;  // per document: the earliest delivery over all its copies
  for (const Planted& p : b.planted)
    if (p.positive) expect_first[p.doc] = expect_first.count(p.doc) ? std::min(expect_first[p.doc], p.expect_step) : p.expect_step;
  std::map<std::string, ClassStats> stats;
  std::vector<std::string> order;
  for (const Planted& p : b.planted) {
    const std::string cls = p.cls.find("(2nd copy)") != std::string::npos ? "duplicated across files" : p.cls;
    if (!stats.count(cls)) order.push_back(cls);
    ClassStats& s = stats[cls];
    s.positive = p.positive;
    if (p.cls.find("(2nd copy)") != std::string::npos) continue;  // counted once, with its first copy
    ++s.planted;
    const auto it = reported.find(p.doc);
    if (it == reported.end()) continue;
    ++s.found;
    const nlohmann::json& d = *it->second;
    for (const auto& l : d["levels"]) ++s.levels[l.get<std::string>()];
    CHECK(d["cause"] == "data");
    if (!p.positive) continue;
    if (d["first"]["step"] == expect_first[p.doc]) ++s.first_ok;
    // Verbatim text: the delivered run is exactly the planted text, across instance cuts too.
    if (cls.rfind("span of", 0) == 0 || cls.rfind("verbatim", 0) == 0 || cls.rfind("spliced", 0) == 0) {
      ++s.run_expected;
      if (d["longest_run"] == p.text_tokens) ++s.run_ok;
    }
    if (cls == "duplicated across files") {
      CHECK(d["deliveries"].get<int64_t>() >= 2);
      ++s.source_ok;  // either copy may be the first delivered
    } else if (d["source"]["file"] == b.train_paths[static_cast<size_t>(p.file)]) {
      const int64_t off = d["source"]["token_offset"].get<int64_t>();
      if (off >= p.offset && off < p.offset + 2 * kSeq) ++s.source_ok;
    }
  }
  int untouched_reported = 0;
  for (const size_t d : untouched) untouched_reported += reported.count(static_cast<int64_t>(d)) ? 1 : 0;
  // Per level: of the documents reported at that level, how many were planted positives (precision).
  std::set<int64_t> positive_docs;
  for (const Planted& p : b.planted)
    if (p.positive) positive_docs.insert(p.doc);
  std::map<std::string, std::pair<int, int>> per_level;  // level -> (true, false) positives
  for (const auto& [doc, d] : reported)
    for (const auto& l : (*d)["levels"]) {
      auto& [t, f] = per_level[l.get<std::string>()];
      (positive_docs.count(doc) ? t : f) += 1;
    }
  std::string level_line = "per level, reported (precision):";
  for (const auto& [l, tf] : per_level) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s %d (%.2f)", l.c_str(), tf.first + tf.second,
                  tf.first + tf.second ? static_cast<double>(tf.first) / (tf.first + tf.second) : 1.0);
    level_line += buf;
    CHECK(tf.second == 0);
  }

  std::string table = "| class | truth | planted | reported | recall / false-positive rate | levels reached |\n|---|---|---|---|---|---|\n";
  nlohmann::json out = nlohmann::json::array();
  int tp = 0, fp = 0, fn = 0;
  for (const std::string& cls : order) {
    const ClassStats& s = stats[cls];
    std::string lv;
    for (const auto& [k, v] : s.levels) lv += (lv.empty() ? "" : ", ") + k + " " + std::to_string(v);
    char line[256];
    std::snprintf(line, sizeof line, "| %s | %s | %d | %d | %.2f | %s |\n", cls.c_str(), s.positive ? "positive" : "negative",
                  s.planted, s.found, s.planted ? static_cast<double>(s.found) / s.planted : 0.0, lv.empty() ? "-" : lv.c_str());
    table += line;
    out.push_back({{"class", cls}, {"positive", s.positive}, {"planted", s.planted}, {"reported", s.found}, {"levels", s.levels}});
    if (s.positive) {
      tp += s.found;
      fn += s.planted - s.found;
    } else {
      fp += s.found;
    }
  }
  char line[160];
  std::snprintf(line, sizeof line, "| untouched holdout documents | negative | %zu | %d | %.2f | - |\n", untouched.size(),
                untouched_reported, untouched.empty() ? 0.0 : static_cast<double>(untouched_reported) / static_cast<double>(untouched.size()));
  table += line;
  fp += untouched_reported;
  MESSAGE("contamination benchmark (default levels: " << r.json["levels"].dump() << ")\n" << table << "true positives " << tp
          << ", false negatives " << fn << ", false positives " << fp << "\n" << level_line << "\n" << r.summary);
  if (const char* path = std::getenv("OLMOREF_LEAK_BENCH_OUT")) {
    std::ofstream f(path);
    f << nlohmann::json{{"levels", r.json["levels"]}, {"classes", out}, {"untouched", untouched.size()},
                        {"untouched_reported", untouched_reported}, {"table", table}, {"per_level", level_line}}.dump(1) << "\n";
  }

  // The bars: every positive of the required classes found, at the right first step and source; no negative.
  for (const std::string& cls : order) {
    const ClassStats& s = stats[cls];
    INFO(cls);
    const bool edit = cls.rfind("a token ", 0) == 0;
    const int k = edit ? std::atoi(cls.substr(cls.rfind(' ') + 1).c_str()) : 0;
    if (!s.positive) {
      CHECK(s.found == 0);
    } else if (!edit) {
      CHECK(s.found == s.planted);
      CHECK(s.first_ok == s.planted);
      CHECK(s.source_ok == s.planted);
      CHECK(s.run_ok == s.run_expected);
    } else if (k >= 10) {
      CHECK(s.found == s.planted);
      CHECK(s.source_ok == s.planted);
    }
  }
  CHECK(untouched_reported == 0);
  CHECK(r.json["status"] == "contaminated");
  CHECK(r.exit_code() == 1);
  CHECK(r.json["counts"]["by_cause"] == nlohmann::json{{"data", r.json["counts"]["contaminated"]}});

  SUBCASE("accepted as known data overlap: the same list, status clean") {
    LeakCheckOptions a = o;
    a.allow_data_overlap = true;
    const LeakReport ra = run_leakcheck(b.loader(), a);
    CHECK(ra.json["status"] == "clean");
    CHECK(ra.exit_code() == 0);
    CHECK(ra.json["counts"]["accepted"] == r.json["counts"]["contaminated"]);
    CHECK(ra.json["contaminated_documents"].size() == r.json["contaminated_documents"].size());
  }
  SUBCASE("one scan thread or three, small chunks or large: the same report") {
    for (const int threads : {1, 3}) {
      LeakCheckOptions a = o;
      a.threads = threads;
      a.chunk_tokens = threads == 1 ? int64_t{1} << 22 : 3000;
      const LeakReport rt = run_leakcheck(b.loader(), a);
      CHECK(rt.json["contaminated_documents"] == r.json["contaminated_documents"]);
      CHECK(rt.json["partial_overlaps"] == r.json["partial_overlaps"]);
      CHECK(rt.json["counts"] == r.json["counts"]);
    }
  }
  SUBCASE("the exact set as the prefilter: the same report") {
    LeakCheckOptions a = o;
    a.bloom = !o.bloom;
    const LeakReport rb = run_leakcheck(b.loader(), a);
    CHECK(rb.json["holdout"]["index"] != r.json["holdout"]["index"]);
    CHECK(rb.json["contaminated_documents"] == r.json["contaminated_documents"]);
    CHECK(rb.json["partial_overlaps"] == r.json["partial_overlaps"]);
  }
  SUBCASE("the holdout file in the training mix: every document of its delivered instances, cause data") {
    LeakCheckOptions a = o;
    a.whole_epoch = true;
    const LoaderConfig lc = b.loader(true);
    const LeakReport rm = run_leakcheck(lc, a);
    CHECK(rm.check("shared_files")["status"] == "fail");
    // Which holdout documents lie wholly inside instances the epoch delivers (the mix's last file is the holdout).
    const int64_t n = lc.dataset->size(), hold_first = lc.dataset->file_first_instance(lc.dataset->n_files() - 1);
    const GlobalOrder order(kOlmoCoreDefaultSeed, 1, n, kG);
    std::set<int64_t> delivered_hold;
    for (const uint32_t id : order.indices())
      if (id >= hold_first) delivered_hold.insert(id - hold_first);
    int64_t expected = 0, found = 0;
    std::set<int64_t> rep;
    for (const auto& d : rm.json["contaminated_documents"]) {
      rep.insert(d["document"].get<int64_t>());
      CHECK(d["cause"] == "data");
    }
    for (size_t d = 0; d < b.hdocs.size(); ++d) {
      const int64_t i0 = b.hdocs[d].start / kSeq, i1 = (b.hdocs[d].start + b.hdocs[d].len - 1) / kSeq;
      bool all = true;
      for (int64_t i = i0; i <= i1; ++i) all = all && delivered_hold.count(i);
      if (!all) continue;
      ++expected;
      found += rep.count(static_cast<int64_t>(d)) ? 1 : 0;
    }
    MESSAGE("holdout file in the mix: " << found << " of " << expected << " documents inside delivered instances reported");
    CHECK(expected > 300);
    CHECK(found == expected);
  }
}
