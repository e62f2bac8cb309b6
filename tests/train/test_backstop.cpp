// tests/train/test_backstop.cpp — the in-loop memorization backstop (train/eval.h): a small training
// run on data where a holdout slice is repeated is flagged (holdout loss significantly below the
// sealed fresh split's); the same run with a non-holdout slice repeated instead is not. Also: the
// bootstrap, the [eval] config keys, and that evaluation leaves training bit-identical.
#include <doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "golden/trace.h"
#include "train/config.h"
#include "train/eval.h"
#include "train/trainer.h"
#include "tests/data/leak_fixture.h"

using namespace olmoref;
using olmoref::leaktest::TempDir;
using olmoref::leaktest::write_u16;

namespace {

// Random documents over the tiny config's vocabulary: tokens in [0, 500), EOS 511.
std::vector<uint32_t> random_docs(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> t;
  while (static_cast<int64_t>(t.size()) < n) {
    const uint32_t len = 20 + rng() % 41;
    for (uint32_t i = 0; i < len; ++i) t.push_back(rng() % 500);
    t.push_back(511);
  }
  t.resize(static_cast<size_t>(n));
  return t;
}

std::vector<uint32_t> repeated(const std::vector<uint32_t>& t, size_t begin, size_t end, int times) {
  std::vector<uint32_t> out;
  for (int i = 0; i < times; ++i) out.insert(out.end(), t.begin() + static_cast<std::ptrdiff_t>(begin), t.begin() + static_cast<std::ptrdiff_t>(end));
  return out;
}

std::string list(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
  return s + "]";
}

// The tiny config on random documents; `repeat` is the slice repeated in training (a holdout slice
// for the leak, another random slice for the clean control).
TrainConfig config(const TempDir& d, const std::vector<uint32_t>& repeat, int64_t steps, int64_t interval) {
  const std::string base = write_u16(d.file("base.u16"), random_docs(20000, 11));
  const std::string rep = write_u16(d.file("repeat.u16"), repeat);
  return load_config(std::string(OLMOREF_TEST_SOURCE_ROOT) + "/configs/tiny.toml",
                     {"data.train_files=" + list({base, rep}), "data.holdout_files=" + list({d.file("holdout.u16")}),
                      "data.dtype=\"u16\"", "data.eos_id=511", "train.steps=" + std::to_string(steps),
                      "schedule.warmup=20", "eval.interval=" + std::to_string(interval), "eval.instances=32",
                      "eval.fresh_files=" + list({d.file("fresh.u16")}), "eval.bootstrap=1000"});  // alpha: the default, 0.01
}

constexpr int64_t kSliceTokens = 20 * 64;  // the first 20 of the holdout's 40 instances
// The slice is seen 16 times an epoch (of about 80 steps): by step 150 the leaked run's gap is about -1.5 (3 times
// the bound checked) and the clean run's intervals hold zero with room on both sides.
constexpr int kRepeats = 16;
constexpr int64_t kSteps = 150, kInterval = 50;

struct Run {
  std::vector<nlohmann::json> evals;
  std::vector<TraceRecord> trace;
};

// Two threads where evaluation runs between the steps of a pool with workers; one for the long runs, whose bits no
// thread count changes (test_training T2), the pool's waits being most of their time at two.
Run train(const TrainConfig& cfg, const std::string& out, int64_t stop_after = -1, bool resume = false, int threads = 2) {
  RunOptions o;
  o.out_dir = out;
  o.threads = threads;
  o.quiet = true;
  o.stop_after = stop_after;
  o.resume = resume;
  Run r;
  r.trace = run_training(cfg, o);
  std::ifstream in(out + "/eval.jsonl");
  std::string line;
  while (std::getline(in, line)) r.evals.push_back(nlohmann::json::parse(line));
  return r;
}

}  // namespace

TEST_CASE("backstop: a leaked holdout slice is flagged, a clean run is not") {
  TempDir d("backstop");
  const std::vector<uint32_t> holdout = random_docs(40 * 64, 21), fresh = random_docs(40 * 64, 22),
                              other = random_docs(40 * 64, 23);
  write_u16(d.file("holdout.u16"), holdout);
  write_u16(d.file("fresh.u16"), fresh);

  const TrainConfig leaked = config(d, repeated(holdout, 0, kSliceTokens, kRepeats), kSteps, kInterval);
  const Run bad = train(leaked, d.file("leaked"), -1, false, 1);
  REQUIRE(bad.evals.size() == 3);
  for (const auto& e : bad.evals)
    MESSAGE("leaked run, step " << e["step"] << ": holdout " << e["holdout"]["loss"] << " fresh " << e["fresh"]["loss"]
                                << " gap " << e["gap"] << " CI " << e["ci"] << " flag " << e["flag"]);
  const nlohmann::json& last = bad.evals.back();
  CHECK(last["flag"] == true);
  CHECK(last["ci"][1].get<double>() < 0.0);
  CHECK(last["gap"].get<double>() < -0.5);
  // The memorized documents come first in the per-document list: they lie in the leaked slice.
  const nlohmann::json& docs = last["documents"];
  REQUIRE(docs.size() > 10);
  CHECK(docs[0]["token_start"].get<int64_t>() < kSliceTokens);
  CHECK(docs[0]["loss"].get<double>() < last["fresh"]["loss"].get<double>() - 1.0);

  // The control: the same run with a slice of other documents repeated instead.
  const TrainConfig clean = config(d, repeated(other, 0, kSliceTokens, kRepeats), kSteps, kInterval);
  const Run good = train(clean, d.file("clean"), -1, false, 1);
  REQUIRE(good.evals.size() == 3);
  for (const auto& e : good.evals) {
    MESSAGE("clean run, step " << e["step"] << ": holdout " << e["holdout"]["loss"] << " fresh " << e["fresh"]["loss"]
                               << " gap " << e["gap"] << " CI " << e["ci"] << " flag " << e["flag"]);
    CHECK(e["flag"] == false);
    CHECK(e["ci"][0].get<double>() <= 0.0);
    CHECK(e["ci"][1].get<double>() >= 0.0);
  }
}

TEST_CASE("backstop: evaluation leaves the trace bit-identical, and a resumed run continues eval.jsonl") {
  TempDir d("backstop-trace");
  const std::vector<uint32_t> holdout = random_docs(40 * 64, 21);
  write_u16(d.file("holdout.u16"), holdout);
  write_u16(d.file("fresh.u16"), random_docs(40 * 64, 22));
  const std::vector<uint32_t> slice = repeated(holdout, 0, kSliceTokens, 2);
  TrainConfig with = config(d, slice, 12, 3), without = config(d, slice, 12, 0);
  with.checkpoint.interval = 6;
  const Run a = train(with, d.file("with")), b = train(without, d.file("without"));
  REQUIRE(a.trace.size() == b.trace.size());
  for (size_t i = 0; i < a.trace.size(); ++i) CHECK(a.trace[i].to_json() == b.trace[i].to_json());
  CHECK(a.evals.size() == 4);
  CHECK(b.evals.empty());
  CHECK(with.resume_hash() == without.resume_hash());  // [eval] is not part of what a resume must match
  // Stopped at step 6 (evaluated at 3 and 6) and resumed: the same eval records (all but the wall time).
  train(with, d.file("resumed"), 6);
  const Run r = train(with, d.file("resumed"), -1, true);
  REQUIRE(r.evals.size() == a.evals.size());
  for (size_t i = 0; i < a.evals.size(); ++i) {
    nlohmann::json x = a.evals[i], y = r.evals[i];
    x.erase("seconds");
    y.erase("seconds");
    CHECK(x == y);
  }
}

TEST_CASE("bootstrap CI: deterministic, covers a zero gap, excludes a real one") {
  std::mt19937 rng(5);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::vector<double> a(40), b(40), c(40);
  for (auto& x : a) x = n01(rng);
  for (auto& x : b) x = n01(rng);
  for (auto& x : c) x = n01(rng) - 1.5;
  const BootstrapCI same = bootstrap_mean_gap(a, b, 2000, 0.05, 7);
  const BootstrapCI again = bootstrap_mean_gap(a, b, 2000, 0.05, 7);
  CHECK(same.lo == again.lo);
  CHECK(same.hi == again.hi);
  CHECK(same.lo < 0.0);
  CHECK(same.hi > 0.0);
  const BootstrapCI lower = bootstrap_mean_gap(c, a, 2000, 0.05, 7);
  CHECK(lower.hi < 0.0);
  CHECK(lower.p_not_lower < 0.01);
  const BootstrapCI other_seed = bootstrap_mean_gap(a, b, 2000, 0.05, 8);
  CHECK(other_seed.lo != same.lo);
}

TEST_CASE("[eval] config keys: parsed, validated, written back, and not part of resume_hash") {
  const std::string root = OLMOREF_TEST_SOURCE_ROOT;
  const TrainConfig c = load_config(root + "/configs/tiny.toml",
                                    {"data.train_files=[\"x.u16\"]", "data.holdout_files=[\"h.u16\"]", "eval.interval=7",
                                     "eval.fresh_mix=\"f.mix\"", "eval.instances=9", "eval.bootstrap=500",
                                     "eval.alpha=0.1", "eval.seed=3"});
  CHECK(c.eval.interval == 7);
  CHECK(c.eval.instances == 9);
  CHECK(c.eval.fresh_mix == "f.mix");
  CHECK(c.eval.bootstrap == 500);
  CHECK(c.eval.alpha == 0.1);
  CHECK(c.eval.seed == 3);
  const TrainConfig back = parse_config_text(c.to_toml(), "resolved");
  CHECK(back.eval.interval == 7);
  CHECK(back.eval.fresh_mix == "f.mix");
  const TrainConfig plain = load_config(root + "/configs/tiny.toml", {"data.train_files=[\"x.u16\"]"});
  CHECK(plain.eval.interval == 0);
  CHECK(plain.resume_hash() == load_config(root + "/configs/tiny.toml", {"data.train_files=[\"x.u16\"]", "eval.instances=5"}).resume_hash());
  CHECK_THROWS_WITH_AS(load_config(root + "/configs/tiny.toml", {"eval.intervall=3"}),
                       doctest::Contains("unknown config key 'eval.intervall'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_config(root + "/configs/tiny.toml", {"data.holdout_files=[\"h.u16\"]", "eval.interval=5"}),
                       doctest::Contains("eval.fresh_mix"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_config(root + "/configs/tiny.toml", {"eval.interval=5", "eval.fresh_mix=\"f.mix\""}),
                       doctest::Contains("data.holdout_mix"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_config(root + "/configs/tiny.toml", {"eval.alpha=1.5"}), doctest::Contains("eval.alpha"),
                       std::invalid_argument);
}
