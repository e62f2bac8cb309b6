// tests/data/test_planted.cpp — the planted-bug suite: every loader bug class of data/planted_bugs.h,
// switched on in the real Loader, must be caught by the check named here with the right first
// offending step (and micro-batch, rank, instance where the class has them); the clean loader must
// pass every check. The expected positions are computed here from OLMo-core's order directly, not
// from the detector.
#include <doctest.h>

#include <cstdio>
#include <functional>
#include <set>

#include "data/leakcheck.h"
#include "data/shuffle.h"
#include "leak_fixture.h"

using namespace olmoref::data;
using namespace olmoref::leaktest;

namespace {

struct Fixture {
  Corpus corpus;
  LoaderConfig base = loader_config(corpus);
  int64_t N = base.dataset->size();                       // training instances
  int64_t G = base.global_batch_instances, mb = base.microbatch_instances;
  int64_t bpe = N / G;
  int64_t H = 0;                                           // holdout instances
  int64_t steps = 2 * bpe + bpe / 2;
  Fixture() {
    DatasetOptions o;
    o.sequence_length = base.dataset->sequence_length();
    o.vocab_size = kVocab;
    o.dtype = Dtype::u16;
    H = FslDataset(Mix::from_paths(corpus.holdout), o).size();
  }

  LeakReport run(PlantedBug bug, bool bloom = true) const {
    LoaderConfig c = base;
    c.debug_bug = bug;
    LeakCheckOptions o;
    o.steps = steps;
    o.layouts = {2, 4};
    o.resume_at = {10, bpe, bpe + bpe / 2};
    o.threads = 2;
    o.bloom = bloom;
    o.chunk_tokens = 4096;  // several chunks, so the double-buffered scan is exercised
    const LeakReport r = run_leakcheck(c, o);
    MESSAGE(std::string(planted_bug_name(bug)) << ":\n" << r.summary);
    return r;
  }
};

// The first position (in stream order) whose served instance satisfies `pred`, for a loader that
// serves OLMo-core's order over n instances of ids offset + order id (the mix-level bugs).
struct Pos {
  int64_t step = -1, microbatch = -1, instance = -1;
};
Pos first_position(int64_t n, int64_t G, int64_t mb, int64_t offset, int64_t steps,
                   const std::function<bool(int64_t)>& pred) {
  const int64_t b_per_e = n / G;
  for (int64_t s = 1; s <= steps; ++s) {
    const int64_t e = (s - 1) / b_per_e + 1, b = (s - 1) % b_per_e;
    const GlobalOrder order(kOlmoCoreDefaultSeed, e, n, G);
    const auto row = order.batch(b);
    for (int64_t i = 0; i < G; ++i) {
      const int64_t id = offset + row[static_cast<size_t>(i)];
      if (pred(id)) return {s, i / mb, id};
    }
  }
  return {};
}

const nlohmann::json& first_of(const LeakReport& r, const std::string& check) {
  const nlohmann::json& c = r.check(check);
  REQUIRE(c.contains("first"));
  return c["first"];
}

void require_status(const LeakReport& r, const std::string& check, const std::string& status) {
  INFO("check " << check << ": " << r.check(check).dump());
  CHECK(r.check(check)["status"] == status);
}

void require_overlap_clean(const LeakReport& r) {
  for (const char* c : {"shared_files", "exact_instances", "exact_documents", "verbatim_spans", "ngram_fraction", "near_duplicates"})
    require_status(r, c, "pass");
  CHECK_FALSE(r.contaminated);
}

void require_audit_clean(const LeakReport& r) {
  for (const char* c : {"audit_partition", "audit_exactly_once", "audit_resume", "audit_layout"})
    require_status(r, c, "pass");
  CHECK_FALSE(r.audit_failed);
}

// A mix-level leak: the instance and span checks fail, both first at `want` (the instance and its micro-batch there
// too), and every contaminated document is the loader's doing.
void require_leak_first_at(const LeakReport& r, const Pos& want) {
  CHECK(r.contaminated);
  for (const char* c : {"exact_instances", "verbatim_spans"}) require_status(r, c, "fail");
  const nlohmann::json& first = first_of(r, "exact_instances");
  CHECK(first["step"] == want.step);
  CHECK(first["microbatch"] == want.microbatch);
  CHECK(first["instance"] == want.instance);
  CHECK(first_of(r, "verbatim_spans")["step"] == want.step);
  for (const auto& d : r.json["contaminated_documents"]) CHECK(d["cause"] == "loader");
}

// A stream-level bug of the ranks, seen first at W = 2 (micro-batch m runs on rank m mod W, so rank 1 owns
// micro-batch 1 at both W = 2 and W = 4): the first offence is at step 1, in rank 1's micro-batch 1.
void require_first_on_rank1(const nlohmann::json& first) {
  CHECK(first["step"] == 1);
  CHECK(first["microbatch"] == 1);
  CHECK(first["rank"] == 1);
  CHECK(first["world_size"] == 2);
}

}  // namespace

TEST_CASE("fixture: the epoch does not divide into whole batches (tail padding has a tail)") {
  Fixture f;
  REQUIRE(f.N % f.G != 0);
  REQUIRE(f.bpe >= 12);
  REQUIRE(f.H >= 20);
}

TEST_CASE("clean loader: no false positive on any check (exact set and Bloom filter)") {
  Fixture f;
  for (const bool bloom : {false, true}) {
    const LeakReport r = f.run(PlantedBug::none, bloom);
    require_overlap_clean(r);
    require_audit_clean(r);
    CHECK(r.exit_code() == 0);
    CHECK(r.json["status"] == "clean");
    CHECK(r.json["stream"]["steps"] == f.steps);
    CHECK(r.json["stream"]["instances"] == f.steps * f.G);
    CHECK(r.json["contaminated_documents"].empty());
    CHECK(r.check("audit_layout")["layouts"] == nlohmann::json::array({2, 4}));
    CHECK(r.check("audit_resume")["resume_points"].size() == 3);
    CHECK(r.check("near_duplicates")["spans_found"] == 0);
    CHECK(r.json["counts"]["contaminated"] == 0);
  }
}

// ---- mix-level bugs: holdout content in the stream -> the overlap checks

TEST_CASE("planted: the loader adds the holdout file to the training mix -> every level, cause loader") {
  Fixture f;
  const Pos want = first_position(f.N + f.H, f.G, f.mb, 0, f.steps, [&](int64_t id) { return id >= f.N; });
  REQUIRE(want.step > 0);
  for (const bool bloom : {false, true}) {
    const LeakReport r = f.run(PlantedBug::holdout_file_in_train_mix, bloom);
    require_leak_first_at(r, want);
    CHECK(r.exit_code() == 1);
    for (const char* c : {"shared_files", "exact_documents", "ngram_fraction", "near_duplicates"})
      require_status(r, c, "fail");
    const nlohmann::json& first = first_of(r, "exact_instances");
    CHECK(first["rank"] == 0);
    CHECK(first["file"] == f.corpus.holdout[0]);
    // The whole file is trained on except its tail past the last whole instance: every document that ends before
    // the tail is contaminated, none that lies in it.
    const int64_t delivered_end = f.H * f.base.dataset->sequence_length();
    int64_t before_tail = 0;
    {
      TokenFile hf(f.corpus.holdout[0], Dtype::u16);
      std::vector<uint32_t> t(static_cast<size_t>(hf.n_tokens()));
      hf.read(0, t, 0);
      for (int64_t i = 0; i < static_cast<int64_t>(t.size()); ++i)
        if (t[static_cast<size_t>(i)] == kEos && i < delivered_end) ++before_tail;
    }
    CHECK(r.json["counts"]["contaminated"].get<int64_t>() >= before_tail);
    for (const auto& d : r.json["contaminated_documents"]) CHECK(d["token_start"].get<int64_t>() < delivered_end);
    // The configured data itself is clean: every delivered document is the loader's doing, none can be accepted.
    CHECK(r.json["counts"]["by_cause"] == nlohmann::json{{"loader", r.json["counts"]["contaminated"]}});
    CHECK_FALSE(r.json["contaminated_documents"].empty());
  }
}

TEST_CASE("planted: holdout carve-out overlapping the training start -> exact_instances / verbatim_spans") {
  Fixture f;
  const int64_t offset = f.H / 5, n = f.H + f.N - offset;
  const Pos want = first_position(n, f.G, f.mb, offset, f.steps, [&](int64_t id) { return id < f.H; });
  REQUIRE(want.step > 0);
  const LeakReport r = f.run(PlantedBug::holdout_carveout_overlap);
  require_leak_first_at(r, want);
  // 80% of the holdout instances are inside the training range, the first fifth never is.
  const int64_t contaminated = r.check("exact_instances")["contaminated"];
  CHECK(contaminated <= f.H - offset);
  CHECK(contaminated >= (f.H - offset) * 3 / 4);
}

TEST_CASE("planted: oversampling before the split -> exact_instances / verbatim_spans") {
  Fixture f;
  const int64_t n1 = f.N + f.H, n = 2 * n1 - f.H;
  const Pos want = first_position(n, f.G, f.mb, 0, f.steps, [&](int64_t id) { return id >= f.N && id < n1; });
  REQUIRE(want.step > 0);
  const LeakReport r = f.run(PlantedBug::oversample_before_split);
  require_leak_first_at(r, want);
}

// ---- stream-level bugs: the overlap checks stay clean, an audit check fails

TEST_CASE("planted: per-rank shuffle seeds -> audit_partition / audit_layout at step 1, rank 1") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::per_rank_shuffle_seed);
  require_overlap_clean(r);
  require_status(r, "audit_partition", "fail");
  require_status(r, "audit_layout", "fail");
  require_status(r, "audit_resume", "pass");
  // At W = 2 (and 4), rank 1 owns micro-batch 1 and shuffles with seed + 1: the first position where its
  // row differs from OLMo-core's row is the first offence.
  const GlobalOrder clean(kOlmoCoreDefaultSeed, 1, f.N, f.G), rank1(kOlmoCoreDefaultSeed + 1, 1, f.N, f.G);
  int64_t k = 0;
  while (k < f.mb && clean.batch(0)[static_cast<size_t>(f.mb + k)] == rank1.batch(0)[static_cast<size_t>(f.mb + k)]) ++k;
  REQUIRE(k < f.mb);
  for (const char* c : {"audit_partition", "audit_layout"}) {
    const nlohmann::json& first = first_of(r, c);
    require_first_on_rank1(first);
    CHECK(first["instance"] == rank1.batch(0)[static_cast<size_t>(f.mb + k)]);
  }
}

TEST_CASE("planted: one shuffle stream per rank (duplicates in the global batch) -> audit_partition at step 1") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::same_stream_per_rank);
  require_overlap_clean(r);
  require_status(r, "audit_partition", "fail");
  require_status(r, "audit_layout", "fail");
  const nlohmann::json& first = first_of(r, "audit_partition");
  require_first_on_rank1(first);
  CHECK(first["instance"] == GlobalOrder(kOlmoCoreDefaultSeed, 1, f.N, f.G).batch(0)[0]);
  CHECK(r.check("audit_partition")["first"]["reason"].get<std::string>().find("twice") != std::string::npos);
}

TEST_CASE("planted: ranks misaligned on the epoch -> audit_partition at the first step of epoch 2") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::epoch_misaligned_ranks);
  require_overlap_clean(r);
  require_status(r, "audit_partition", "fail");
  require_status(r, "audit_layout", "fail");
  const nlohmann::json& first = first_of(r, "audit_partition");
  CHECK(first["step"] == f.bpe + 1);
  CHECK(first["epoch"] == 2);
  CHECK(first["rank"] == 1);
  CHECK(first_of(r, "audit_layout")["step"] == f.bpe + 1);
}

TEST_CASE("planted: tail padding duplicates instances -> audit_exactly_once at the padded batch") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::tail_padding_duplicates);
  require_overlap_clean(r);
  require_status(r, "audit_exactly_once", "fail");
  require_status(r, "audit_partition", "fail");  // a batch beyond the epoch's whole batches
  // The padded batch is step bpe + 1 (still epoch 1): the tail's N % G instances, then the epoch's
  // first instances again; the first duplicate sits right after the tail.
  const int64_t rem = f.N % f.G;
  const std::vector<uint32_t> perm = numpy_permutation(kOlmoCoreDefaultSeed + 1, f.N);
  const nlohmann::json& first = first_of(r, "audit_exactly_once");
  CHECK(first["step"] == f.bpe + 1);
  CHECK(first["epoch"] == 1);
  CHECK(first["microbatch"] == rem / f.mb);
  CHECK(first["index_in_microbatch"] == rem % f.mb);
  CHECK(first["instance"] == perm[0]);
  CHECK(r.check("audit_exactly_once")["duplicates"].get<int64_t>() >= f.G - rem);
}

TEST_CASE("planted: an off-by-one peek consumes the first batch -> audit_exactly_once (skip) at step 1") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::off_by_one_peek);
  require_overlap_clean(r);
  require_status(r, "audit_exactly_once", "fail");
  const nlohmann::json& first = first_of(r, "audit_exactly_once");
  CHECK(first["step"] == 1);
  CHECK(r.check("audit_exactly_once")["missing_steps"] == 1);
  CHECK(r.check("audit_exactly_once")["skipped_instances"].get<int64_t>() >= f.G);
}

TEST_CASE("planted: a resume replays the first epoch's order -> audit_resume at the first step of epoch 2") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::resume_replays_first_epoch);
  require_overlap_clean(r);
  for (const char* c : {"audit_partition", "audit_exactly_once", "audit_layout"}) require_status(r, c, "pass");
  require_status(r, "audit_resume", "fail");
  const nlohmann::json& first = first_of(r, "audit_resume");
  // Every resume makes epoch 2 replay epoch 1's order: after 10 steps (still epoch 1, harmless until
  // the epoch ends), at the boundary, and mid-epoch 2. The first step that differs is epoch 2's first.
  CHECK(first["step"] == f.bpe + 1);
  CHECK(first["microbatch"] == 0);
  CHECK(first["instance"] == GlobalOrder(kOlmoCoreDefaultSeed, 1, f.N, f.G).batch(0)[0]);
  for (const auto& p : r.check("audit_resume")["resume_points"]) CHECK(p["status"] == "fail");
}

TEST_CASE("planted: fast-forward ignores gradient accumulation -> audit_resume at the step after the resume") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::fast_forward_ignores_accumulation);
  require_overlap_clean(r);
  require_status(r, "audit_resume", "fail");
  const nlohmann::json& first = first_of(r, "audit_resume");
  CHECK(first["step"] == 11);
  // After 10 steps it fast-forwards 10 * mb / G = 2 batches: step 11 gets row 2 again.
  CHECK(first["instance"] == GlobalOrder(kOlmoCoreDefaultSeed, 1, f.N, f.G).batch(10 * f.mb / f.G)[0]);
}

TEST_CASE("planted: fast-forward applied twice -> audit_resume at the step after the resume") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::fast_forward_twice);
  require_overlap_clean(r);
  require_status(r, "audit_resume", "fail");
  const nlohmann::json& first = first_of(r, "audit_resume");
  CHECK(first["step"] == 11);
  CHECK(first["instance"] == GlobalOrder(kOlmoCoreDefaultSeed, 1, f.N, f.G).batch(20)[0]);
}

TEST_CASE("planted: a resume at an epoch boundary skips an epoch -> audit_resume at the first step of epoch 2") {
  Fixture f;
  const LeakReport r = f.run(PlantedBug::resume_at_epoch_boundary_skips_epoch);
  require_overlap_clean(r);
  require_status(r, "audit_resume", "fail");
  const nlohmann::json& first = first_of(r, "audit_resume");
  CHECK(first["step"] == f.bpe + 1);
  CHECK(first["epoch"] == 3);  // what the resumed loader delivered
  CHECK(first["instance"] == GlobalOrder(kOlmoCoreDefaultSeed, 3, f.N, f.G).batch(0)[0]);
}

TEST_CASE("every planted bug class is detected; the clean loader is not") {
  Fixture f;
  std::set<std::string> missed;
  int n = 0;
  for (const PlantedBug b : all_planted_bugs()) {
    ++n;
    const LeakReport r = f.run(b);
    if (r.exit_code() != 1) missed.insert(planted_bug_name(b));
  }
  CHECK(n >= 8);
  CHECK(missed.empty());
  CHECK(f.run(PlantedBug::none).exit_code() == 0);
}
