// tests/data/test_ngram.cpp — the pieces under the leakage detector: the rolling n-gram hash, the
// exact n-gram set and the Bloom filter (false-positive rate), the audit-log checks on hand-made
// streams, and the report's shape (docs/formats/leakcheck.md).
#include <doctest.h>

#include <random>
#include <set>
#include <unordered_set>

#include "data/audit_check.h"
#include "data/leakcheck.h"
#include "data/ngram.h"
#include "leak_fixture.h"

using namespace olmoref::data;
using namespace olmoref::leaktest;

TEST_CASE("rolling n-gram hash equals the direct hash of every window, for every chain split") {
  std::mt19937 rng(1);
  for (const int n : {1, 2, 5, 13, 50}) {
    const NgramHasher h(n);
    for (const size_t size : {size_t(0), size_t(1), size_t(n - 1 > 0 ? n - 1 : 0), size_t(n), size_t(n + 1),
                              size_t(n + 3), size_t(64), size_t(257), size_t(1000)}) {
      std::vector<uint32_t> t(size);
      for (auto& x : t) x = rng() % 70000;
      std::vector<uint64_t> out(size + 1), scratch;
      const size_t count = h.hash_all(t, out.data(), scratch);
      CHECK(count == (size >= static_cast<size_t>(n) ? size - n + 1 : 0));
      for (size_t i = 0; i < count; ++i) {
        INFO("n " << n << " size " << size << " window " << i);
        REQUIRE(out[i] == h.hash(t.data() + i));
      }
    }
  }
}

TEST_CASE("the n-gram hash depends on every token and on their order") {
  const NgramHasher h(13);
  std::vector<uint32_t> a(13);
  for (uint32_t i = 0; i < 13; ++i) a[i] = i * 7 + 3;
  std::set<uint64_t> seen{h.hash(a.data())};
  for (size_t i = 0; i < 13; ++i) {
    auto b = a;
    b[i] += 1;
    CHECK(seen.insert(h.hash(b.data())).second);
  }
  auto r = a;
  std::swap(r[3], r[4]);
  CHECK(seen.insert(h.hash(r.data())).second);
}

TEST_CASE("exact set: every inserted key is found, absent keys are not, duplicates are counted once") {
  std::mt19937_64 rng(2);
  const int64_t n = 200000;
  NgramSet s(NgramSet::Kind::exact, n);
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) k = rng();
  keys[5] = 0;  // the empty marker is a legal hash
  for (const uint64_t k : keys) s.insert(k);
  for (int i = 0; i < 1000; ++i) s.insert(keys[static_cast<size_t>(i)]);
  CHECK(s.inserted() == n);
  for (const uint64_t k : keys) REQUIRE(s.contains(k));
  int64_t false_hits = 0;
  for (int i = 0; i < 200000; ++i) false_hits += s.contains(rng());
  CHECK(false_hits == 0);
  CHECK(s.bytes() <= 17 * n);  // 16 bytes per key at load 1/2
  // probe() reports exactly the members, in order.
  std::vector<uint64_t> probe{keys[0], rng(), keys[7], rng(), keys[9]};
  std::vector<size_t> hits;
  s.probe(probe.data(), probe.size(), [&](size_t i) { hits.push_back(i); });
  CHECK(hits == std::vector<size_t>{0, 2, 4});
}

TEST_CASE("Bloom filter: no false negatives; false-positive rate below 1e-5 (about 6e-6) at 32 bits per key") {
  std::mt19937_64 rng(3);
  const int64_t n = 1000000;
  NgramSet s(NgramSet::Kind::bloom, n, 32.0);
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) {
    k = rng();
    s.insert(k);
  }
  for (const uint64_t k : keys) REQUIRE(s.contains(k));
  const int64_t probes = 4000000;
  int64_t fp = 0;
  for (int64_t i = 0; i < probes; ++i) fp += s.contains(rng());
  const double observed = static_cast<double>(fp) / static_cast<double>(probes);
  MESSAGE("Bloom 32 bits/key: " << s.bytes() / 1e6 << " MB for 1M keys, expected FPR "
                                << s.expected_false_positive_rate() << ", observed " << observed);
  CHECK(s.bytes() <= 4 * n + 64);
  CHECK(s.expected_false_positive_rate() < 1e-5);
  CHECK(observed < 1e-5);
}

// ---- audit checks on hand-made streams

namespace {

AuditRecord rec(int64_t step, int64_t mb, int64_t rank, int64_t instance, int64_t epoch = 1) {
  AuditRecord r;
  r.step = step;
  r.epoch = epoch;
  r.batch = step - 1;
  r.microbatch = mb;
  r.rank = rank;
  r.instance = instance;
  r.xxh3 = static_cast<uint64_t>(instance) * 0x9E3779B97F4A7C15ull;
  return r;
}

// G = 4 instances, mb = 1, so 4 micro-batches; micro-batch m on rank m mod W.
std::vector<AuditRecord> stream(int64_t steps, int W) {
  std::vector<AuditRecord> v;
  for (int r = 0; r < W; ++r)  // rank files concatenated
    for (int64_t s = 1; s <= steps; ++s)
      for (int64_t m = r; m < 4; m += W) v.push_back(rec(s, m, r, (s - 1) * 4 + m));
  return v;
}

StreamExpectation expect(int W) {
  StreamExpectation e;
  e.global_batch_instances = 4;
  e.microbatch_instances = 1;
  e.world_size = W;
  return e;
}

}  // namespace

TEST_CASE("audit checks: a clean hand-made stream passes partition, exactly-once and layout equality") {
  for (const int W : {1, 2, 4}) {
    const auto s = stream(5, W);
    CHECK(check_partition(s, expect(W)).status == "pass");
    CHECK(check_exactly_once(s, expect(W)).status == "pass");
    CHECK(compare_streams(batches_by_label(stream(5, 1)), batches_by_label(s), "layout").status == "pass");
  }
}

TEST_CASE("audit checks: each defect is reported at its first position") {
  SUBCASE("a micro-batch from the wrong rank") {
    auto s = stream(3, 2);
    for (auto& r : s)
      if (r.step == 2 && r.microbatch == 1) r.rank = 0;  // rank 1's (1 mod 2)
    const CheckResult c = check_partition(s, expect(2));
    REQUIRE(c.failed());
    CHECK(c.first->step == 2);
    CHECK(c.first->microbatch == 1);
    CHECK(c.first->rank == 0);
  }
  SUBCASE("an instance twice in one global batch, and again in the epoch") {
    auto s = stream(3, 1);
    s[1 * 4 + 3].instance = s[0].instance;  // step 2, micro-batch 3 repeats step 1's first instance
    const CheckResult p = check_partition(s, expect(1));
    CHECK(p.status == "pass");  // not within one batch
    const CheckResult e = check_exactly_once(s, expect(1));
    REQUIRE(e.failed());
    CHECK(e.first->step == 2);
    CHECK(e.first->microbatch == 3);
    CHECK(e.first->instance == s[0].instance);
    s[1 * 4 + 2].instance = s[1 * 4 + 3].instance;
    const CheckResult p2 = check_partition(s, expect(1));
    REQUIRE(p2.failed());
    CHECK(p2.first->step == 2);
    CHECK(p2.first->microbatch == 3);
  }
  SUBCASE("a missing micro-batch and a missing step") {
    auto s = stream(4, 1);
    s.erase(s.begin() + 6);  // step 2, micro-batch 2
    const CheckResult p = check_partition(s, expect(1));
    REQUIRE(p.failed());
    CHECK(p.first->step == 2);
    CHECK(p.first->microbatch == 2);
    auto t = stream(4, 1);
    t.erase(t.begin() + 8, t.begin() + 12);  // all of step 3
    StreamExpectation e = expect(1);
    e.last_step = 4;
    const CheckResult x = check_exactly_once(t, e);
    REQUIRE(x.failed());
    CHECK(x.first->step == 3);
    CHECK(x.details["missing_steps"] == 1);
  }
  SUBCASE("two streams that part at step 3") {
    const auto a = stream(5, 1);
    auto b = a;
    b[2 * 4 + 1].instance = 999;
    const CheckResult c = compare_streams(batches_by_label(a), batches_by_label(b), "x");
    REQUIRE(c.failed());
    CHECK(c.failures == 1);
    CHECK(c.first->step == 3);
    CHECK(c.first->microbatch == 1);
    CHECK(c.first->instance == 999);
    // Delivery order: a resumed log that repeats its first step is aligned with the trainer's steps.
    std::vector<AuditRecord> resumed(a.begin() + 8, a.end());  // steps 3..5
    resumed.insert(resumed.begin(), a.begin() + 8, a.begin() + 12);
    const CheckResult d = compare_streams(batches_in_delivery_order(a, 1, 4), batches_in_delivery_order(resumed, 3, 4), "r", 3);
    REQUIRE(d.failed());
    CHECK(d.first->step == 4);
  }
}

TEST_CASE("leakcheck report: fields of docs/formats/leakcheck.md, and documents without an EOS") {
  Corpus c;
  LoaderConfig lc = loader_config(c);
  LeakCheckOptions o;
  o.steps = 6;
  o.threads = 1;
  o.layouts = {2};
  const LeakReport r = run_leakcheck(lc, o);
  const nlohmann::json& j = r.json;
  CHECK(j["format"] == "olmoref-leakcheck/2");
  CHECK(j["status"] == "clean");
  for (const char* k : {"run", "levels", "stream", "attribution", "holdout", "counts", "accept", "affected", "checks",
                        "contaminated_documents", "partial_overlaps"})
    CHECK(j.contains(k));
  for (const char* k : {"shared_files", "exact_instances", "exact_documents", "verbatim_spans", "ngram_fraction",
                        "near_duplicates", "audit_partition", "audit_exactly_once", "audit_resume", "audit_layout"}) {
    INFO(k);
    REQUIRE(j["checks"].contains(k));
    CHECK(j["checks"][k].contains("status"));
    CHECK(j["checks"][k].contains("failures"));
  }
  CHECK(j["holdout"]["documents"].get<int64_t>() > 20);
  CHECK(r.summary.find("CLEAN") != std::string::npos);
  // Without an EOS id the holdout instances act as documents and the exact document check is skipped.
  DatasetOptions d;
  d.sequence_length = 64;
  d.vocab_size = kVocab;
  d.dtype = Dtype::u16;
  lc.dataset = std::make_shared<FslDataset>(Mix::from_paths(c.train), d);
  const LeakReport u = run_leakcheck(lc, o);
  CHECK(u.json["holdout"]["documents_are_instances"] == true);
  CHECK(u.check("exact_documents")["status"] == "skipped");
  CHECK(u.exit_code() == 0);
  // A holdout file shorter than one instance still counts (its documents are held out too).
  std::vector<uint32_t> tiny = random_documents(1, 5);
  tiny.resize(30);
  tiny.back() = kEos;
  lc.holdout = HoldoutSpec::separate(Mix::from_paths({c.holdout[0], write_u16(c.dir.file("tiny.u16"), tiny)}));
  const LeakReport t = run_leakcheck(lc, o);
  CHECK(t.json["holdout"]["files"] == 2);
  CHECK(t.json["holdout"]["tokens"].get<int64_t>() == r.json["holdout"]["tokens"].get<int64_t>() + 30);
  // No holdout: an error that says what to set.
  lc.holdout = HoldoutSpec{};
  CHECK_THROWS_WITH_AS(run_leakcheck(lc, o), doctest::Contains("holdout"), std::invalid_argument);
}

TEST_CASE("leakcheck: external audit logs are checked against the configured stream") {
  Corpus c;
  const LoaderConfig lc = loader_config(c);
  TempDir dir("ext");
  // A run's log: the loader with its own audit, 7 steps.
  {
    LoaderConfig w = lc;
    w.audit = std::make_shared<AuditLog>(dir.file("audit.jsonl"));
    Loader l(w);
    for (int i = 0; i < 7; ++i) l.next_batch();
    w.audit->flush();
  }
  LeakCheckOptions o;
  o.steps = 12;  // more than the log holds: only the log's steps are compared
  o.threads = 1;
  o.audit_logs = {dir.file("audit.jsonl")};
  const LeakReport good = run_leakcheck(lc, o);
  CHECK(good.check("external_audit")["status"] == "pass");
  CHECK(good.json["stream"]["steps"] == 12);
  o.steps = 3;  // fewer: the stream is extended to the log's 7 steps
  CHECK(run_leakcheck(lc, o).json["stream"]["steps"] == 7);
  // A log from another seed is another stream.
  {
    LoaderConfig w = lc;
    w.seed = 1;
    w.audit = std::make_shared<AuditLog>(dir.file("other.jsonl"));
    Loader l(w);
    for (int i = 0; i < 7; ++i) l.next_batch();
    w.audit->flush();
  }
  o.audit_logs = {dir.file("other.jsonl")};
  const LeakReport bad = run_leakcheck(lc, o);
  CHECK(bad.check("external_audit")["status"] == "fail");
  CHECK(bad.check("external_audit")["first"]["step"] == 1);
  CHECK(bad.exit_code() == 1);
}
