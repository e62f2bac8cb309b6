// trace compare (golden/compare.h): the readers of every format, the rules and their failure accounting, the
// report's first differing step, and the writers' round trips.
#include <doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <fstream>
#include <string>
#include <unistd.h>

#include "golden/compare.h"
#include "golden/resume_compare.h"
#include "golden/trace.h"

using namespace olmoref;

namespace {

std::string tmp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("olmoref-compare-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string write(const std::string& name, const std::string& text) {
  const std::string p = tmp_path(name);
  std::ofstream(p) << text;
  return p;
}

// An olmoref trace of n steps with loss 8 - 0.1*s (fp32), whose step `bump` (if any) has its loss nudged by one ulp.
std::string olmoref_trace(const std::string& name, int n, int bump = -1) {
  std::string text;
  for (int s = 1; s <= n; ++s) {
    TraceRecord r;
    r.step = s;
    r.epoch = 1;
    r.loss = 8.0f - 0.1f * static_cast<float>(s);
    if (s == bump) r.loss = std::nextafter(r.loss, 100.0f);
    r.ce = r.loss;
    r.grad_norm = 1.5f;
    r.lr = 1e-3 * s;
    r.tokens = 100 * s;
    r.num_zeros = 1600 + s;
    r.data_digest = "00000000000000" + std::to_string(10 + s);
    r.param_digest = "0123456789abcdef0123456789abcd" + std::to_string(10 + s);
    text += r.to_json() + "\n";
  }
  return write(name, text);
}

const MetricResult& result_for(const CompareResult& r, const std::string& name) {
  for (const auto& m : r.metrics)
    if (m.rule.name == name) return m;
  throw std::runtime_error("no result for " + name);
}

}  // namespace

TEST_CASE("readers: olmoref, generic JSON Lines, Megatron golden values, step-loss text") {
  const LoadedTrace a = load_trace_any(olmoref_trace("a.jsonl", 5));
  CHECK(a.format == "olmoref");
  CHECK(a.steps().size() == 5);
  const MetricValue& l3 = a.metrics.at("loss").at(3);
  CHECK(l3.exact.size() == 8);
  CHECK(l3.value == static_cast<double>(8.0f - 0.1f * 3.0f));  // the exact fp32 value from the hex, not the %.9g decimal
  CHECK(a.metrics.at("param_digest").at(2).exact == "0123456789abcdef0123456789abcd12");
  CHECK(a.metrics.at("lr").at(2).exact.size() == 16);

  const LoadedTrace j = load_trace_any(write("j.jsonl", "{\"step\": 1, \"loss\": 7.5, \"note\": \"x\"}\n\n{\"step\": 2, \"loss\": 7.25}\n"));
  CHECK(j.format == "jsonl");
  CHECK(j.metrics.at("loss").at(2).value == 7.25);

  const LoadedTrace m = load_trace_any(write(
      "golden_values_dev_dgx_h100.json",
      R"({"lm loss": {"start_step": 1, "end_step": 10, "step_interval": 5, "values": {"1": 10.84092, "5": 10.8406, "10": 10.80966}},
          "num-zeros": {"start_step": 1, "end_step": 10, "step_interval": 5, "values": {"1": 1629.0, "5": "nan", "10": 1700.0}}})"));
  CHECK(m.format == "megatron");
  CHECK(m.metrics.at("loss").at(10).value == 10.80966);  // "lm loss" is `loss`
  CHECK(std::isnan(m.metrics.at("num_zeros").at(5).value));  // "num-zeros" is `num_zeros`; "nan": a missing step
  CHECK(m.metrics.at("num_zeros").at(5).exact == "nan");
  CHECK(m.megatron_ranges.at("loss").step_interval == 5);
  // Old list form: the extractor kept TensorBoard's scalars [0::5] (iterations 1, 6, 11) and wrote start_step 0.
  const LoadedTrace ml = load_trace_any(write(
      "old_megatron.json", R"({"lm loss": {"start_step": 0, "end_step": 10, "step_interval": 5, "values": [10.9, 10.8, 10.7]}})"));
  CHECK(ml.metrics.at("loss").at(1).value == 10.9);
  CHECK(ml.metrics.at("loss").at(11).value == 10.7);
  CHECK(ml.metrics.at("loss").count(10) == 0);

  const LoadedTrace t = load_trace_any(write("llama3_cuda.txt", "# TorchTitan\n1 8.048324584960938\n2 7.751155376434326\n\n3 7.0\n"));
  CHECK(t.format == "steploss");
  CHECK(t.metrics.at("loss").at(2).value == 7.751155376434326);
  const LoadedTrace th = load_trace_any(write("header.txt", "step loss\n1 8.5\n"));
  CHECK(th.metrics.at("loss").size() == 1);

  CHECK_THROWS_WITH_AS(load_trace_any(write("bad.txt", "1 8.0\nx y\n")), doctest::Contains("bad.txt:2"), std::runtime_error);
  CHECK_THROWS_WITH_AS(load_trace_any(write("dup.jsonl", "{\"step\":1,\"loss\":1}\n{\"step\":1,\"loss\":2}\n")),
                       doctest::Contains("appears twice"), std::runtime_error);
  CHECK_THROWS_AS(load_trace_any(tmp_path("missing.jsonl")), std::runtime_error);
}

TEST_CASE("default rules: two olmoref traces must agree bit for bit; the first differing step is reported") {
  const LoadedTrace a = load_trace_any(olmoref_trace("d1.jsonl", 6));
  const LoadedTrace same = load_trace_any(olmoref_trace("d2.jsonl", 6));
  const LoadedTrace bumped = load_trace_any(olmoref_trace("d3.jsonl", 6, 4));
  const CompareRules rules = default_rules(a, same);
  REQUIRE(rules.rules.size() == 7);  // loss, grad_norm, lr, num_zeros, data_digest, param_digest, routing_digest
  const CompareResult ok = compare_traces(a, same, rules);
  CHECK(ok.pass);
  CHECK(ok.first_differing_step == -1);
  const CompareResult bad = compare_traces(a, bumped, rules);
  CHECK_FALSE(bad.pass);
  CHECK(bad.first_differing_step == 4);
  CHECK(result_for(bad, "loss").failing == 1);
  CHECK(result_for(bad, "loss").first_failing_step == 4);
  CHECK(result_for(bad, "grad_norm").pass);
  const std::string report = format_compare_report(a, bumped, rules, bad);
  CHECK(report.find("first differing step: 4") != std::string::npos);
  CHECK(report.find("FAIL: loss 1 of 6 steps") != std::string::npos);
  CHECK(report.find("routing:") == std::string::npos);  // dense traces carry no routing
  // Across formats the default is loss within rtol 1e-5.
  const LoadedTrace txt = load_trace_any(write("d.txt", to_steploss_text(a)));
  const CompareRules cross = default_rules(a, txt);
  REQUIRE(cross.rules.size() == 1);
  CHECK(cross.rules[0].check == MetricRule::Check::close);
  CHECK(compare_traces(a, txt, cross).pass);
  CHECK(compare_traces(a, txt, cross).first_differing_step == -1);  // %.17g round-trips the fp32 values
}

TEST_CASE("close rules: tolerance, allowed failing steps, Megatron's allowance, missing steps, ranges") {
  std::string ref, cand;
  for (int s = 1; s <= 200; ++s) {
    ref += std::to_string(s) + " 10.0\n";
    // 1e-6 relative everywhere, 1e-3 at steps 50 and 150, step 120 missing
    if (s == 120) continue;
    cand += std::to_string(s) + (s == 50 || s == 150 ? " 10.01\n" : " 10.00001\n");
  }
  const LoadedTrace a = load_trace_any(write("ref.txt", ref)), b = load_trace_any(write("cand.txt", cand));
  auto rules = [](const std::string& toml) { return parse_rules(toml, "test rules"); };

  CompareResult r = compare_traces(a, b, rules("[loss]\ncheck = \"close\"\nrtol = 1e-5\n"));
  CHECK_FALSE(r.pass);
  CHECK(result_for(r, "loss").failing == 3);  // two out of tolerance + one missing
  CHECK(result_for(r, "loss").missing_in_b == 1);
  CHECK(result_for(r, "loss").first_failing_step == 50);
  CHECK(result_for(r, "loss").max_rel_step == 50);

  r = compare_traces(a, b, rules("[loss]\nrtol = 1e-5\nmax_failing_steps = 3\n"));  // rtol alone means close
  CHECK(r.pass);
  r = compare_traces(a, b, rules("[loss]\nrtol = 1e-5\nmax_failing_steps = \"megatron\"\n"));  // max(1, min(200/100, 50)) = 2
  CHECK(result_for(r, "loss").allowed == 2);
  CHECK_FALSE(r.pass);
  r = compare_traces(a, b, rules("[loss]\nrtol = 1e-5\nlast_step = 49\nmin_steps = 49\n"));
  CHECK(r.pass);
  CHECK(result_for(r, "loss").compared == 49);
  r = compare_traces(a, b, rules("[loss]\nrtol = 1e-5\nlast_step = 49\nmin_steps = 50\n"));
  CHECK_FALSE(r.pass);  // too few steps compared
  r = compare_traces(a, b, rules("[loss]\ncheck = \"report\"\n[grad_norm]\nrequired = false\n"));
  CHECK(r.pass);
  r = compare_traces(a, b, rules("[grad_norm]\ncheck = \"exact\"\n"));
  CHECK_FALSE(r.pass);  // a required metric missing on both sides
  // Two rules on one metric, as Megatron's per-metric list of checks.
  r = compare_traces(a, b, rules("[loss_early]\nmetric = \"loss\"\nrtol = 1e-5\nlast_step = 10\n"
                                 "[loss]\nrtol = 2e-3\nfirst_step = 11\nmax_failing_steps = 1\n"));
  CHECK(r.pass);
  CHECK(result_for(r, "loss_early").compared == 10);

  // The same rules as JSON.
  r = compare_traces(a, b, parse_rules(R"({"loss": {"check": "close", "rtol": 2e-3, "max_failing_steps": 1}})", "json"));
  CHECK(r.pass);
}

TEST_CASE("a metric only one side has at a step fails, whichever side lacks it") {
  std::string full, gappy;
  for (int s = 1; s <= 6; ++s) {
    full += "{\"step\":" + std::to_string(s) + ",\"loss\":2.5,\"z\":0.1}\n";
    gappy += "{\"step\":" + std::to_string(s) + ",\"loss\":2.5" + (s == 4 ? "" : ",\"z\":0.1") + "}\n";
  }
  const LoadedTrace a = load_trace_any(write("full.jsonl", full)), b = load_trace_any(write("gappy.jsonl", gappy));
  const CompareRules rules = parse_rules("[z]\ncheck = \"exact\"\n", "test rules");
  CompareResult r = compare_traces(a, b, rules);  // B lacks z at step 4
  CHECK_FALSE(r.pass);
  CHECK(result_for(r, "z").missing_in_b == 1);
  r = compare_traces(b, a, rules);  // A lacks it: the same failure, not a skipped step
  CHECK_FALSE(r.pass);
  CHECK(result_for(r, "z").missing_in_a == 1);
  CHECK(result_for(r, "z").first_failing_step == 4);
  CHECK(result_for(r, "z").compared == 6);
  // A shorter A against a longer B: B's extra steps fail too.
  const LoadedTrace shorter = load_trace_any(olmoref_trace("short.jsonl", 3)), longer = load_trace_any(olmoref_trace("long.jsonl", 5));
  CHECK_FALSE(compare_traces(shorter, longer, default_rules(shorter, longer)).pass);
  CHECK(compare_traces(shorter, shorter, default_rules(shorter, shorter)).pass);
}

TEST_CASE("non-finite metrics: written as JSON null with exact hex, read back exactly by every reader") {
  TraceRecord r;
  r.step = 1;
  r.loss = std::numeric_limits<float>::quiet_NaN();
  r.ce = std::numeric_limits<float>::infinity();
  r.z = -std::numeric_limits<float>::infinity();
  r.grad_norm = std::numeric_limits<float>::quiet_NaN();
  r.lr = std::numeric_limits<double>::infinity();
  r.data_digest = "0000000000000001";
  r.param_digest = "0123456789abcdef0123456789abcdef";
  const std::string line = r.to_json();
  CHECK(line.find("nan") == std::string::npos);
  CHECK(line.find("inf") == std::string::npos);
  CHECK(line.find("\"loss\":null,\"loss_hex\":\"7fc00000\"") != std::string::npos);
  const TraceRecord back = TraceRecord::from_json(line);  // the JSON library accepts it: it is JSON
  CHECK(std::isnan(back.loss));
  CHECK(back.ce == std::numeric_limits<float>::infinity());
  CHECK(back.z == -std::numeric_limits<float>::infinity());
  CHECK(back.lr == std::numeric_limits<double>::infinity());
  CHECK(back.to_json() == line);
  // trace compare: a diverged trace equals itself and differs from a finite one at the first non-finite step.
  TraceRecord ok = r;
  ok.loss = 2.0f, ok.ce = 2.0f, ok.z = 0.0f, ok.grad_norm = 1.0f, ok.lr = 1e-3;
  const std::string diverged = write("diverged.jsonl", ok.to_json() + "\n" + [&] { TraceRecord x = r; x.step = 2; return x.to_json(); }() + "\n");
  const LoadedTrace d = load_trace_any(diverged);
  CHECK(compare_traces(d, d, default_rules(d, d)).pass);
  const std::string finite = write("finite.jsonl", ok.to_json() + "\n" + [&] { TraceRecord x = ok; x.step = 2; return x.to_json(); }() + "\n");
  const LoadedTrace f = load_trace_any(finite);
  const CompareResult c = compare_traces(f, d, default_rules(f, d));
  CHECK_FALSE(c.pass);
  CHECK(c.first_differing_step == 2);
  CHECK(read_trace(diverged).size() == 2);
}

TEST_CASE("rules files: errors name the file, the rule and the key") {
  CHECK_THROWS_WITH_AS(parse_rules("[loss]\nrtoll = 1e-5\n", "r.toml"), doctest::Contains("'rtoll'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_rules("[loss]\ncheck = \"exact\"\nrtol = 1e-5\n", "r.toml"), doctest::Contains("close"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_rules("[loss]\ncheck = \"approx\"\n", "r.toml"), doctest::Contains("r.toml"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_rules("loss = 1\n", "r.toml"), doctest::Contains("must be a table"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_rules("[loss]\nmax_failing_steps = -1\n", "r.toml"),
                       doctest::Contains("max_failing_steps"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_rules("", "r.toml"), doctest::Contains("no rules"), std::invalid_argument);
  const CompareRules r = parse_rules("[zeta]\n[alpha]\ncheck = \"report\"\n", "order.toml");
  REQUIRE(r.rules.size() == 2);
  CHECK(r.rules[0].name == "zeta");  // file order, not key order
}

TEST_CASE("writers: Megatron golden values as its extractor writes them; step-loss text reads back exactly") {
  const LoadedTrace a = load_trace_any(olmoref_trace("w.jsonl", 12));
  MegatronGoldenOptions o;
  o.metrics = {"lm loss", "num-zeros", "grad-norm"};
  const std::string text = to_megatron_json(a, o);
  // Steps 1, then multiples of 5; keys in integer order; numbers as Python's json writes them.
  CHECK(text.find("\"1\": 7.9,") != std::string::npos);           // round(7.900000095367432, 5)
  CHECK(text.find("\"10\": 1610.0\n") != std::string::npos);      // num_zeros 1600 + s, written as a float
  CHECK(text.find("\"5\"") < text.find("\"10\""));
  const LoadedTrace meg = load_trace_any(write("w.json", text));
  CHECK(meg.format == "megatron");
  CHECK(meg.metrics.at("loss").size() == 3);  // steps 1, 5, 10
  CHECK(meg.metrics.at("loss").at(5).value == python_round5(a.metrics.at("loss").at(5).value));
  CHECK(meg.metrics.at("grad_norm").at(10).value == 1.5);
  CHECK(meg.megatron_ranges.at("loss").end_step == 10);
  // Past the run's last step the legacy extractor wrote "nan" (the current one keeps what was logged: below).
  o.train_iters = 15;
  o.rules = MegatronRules::legacy;
  const LoadedTrace longer = load_trace_any(write("w15.json", to_megatron_json(a, o)));
  CHECK(longer.metrics.at("loss").at(15).exact == "nan");
  o.rules = MegatronRules::current;
  // Digests are not numbers; a metric the trace lacks is refused naming what it has.
  o.metrics = {"param_digest"};
  CHECK_THROWS_WITH_AS(to_megatron_json(a, o), doctest::Contains("lm loss"), std::invalid_argument);
  const LoadedTrace txt = load_trace_any(write("w.txt", to_steploss_text(a)));
  for (const auto& [step, v] : a.metrics.at("loss")) CHECK(txt.metrics.at("loss").at(step).value == v.value);
}

TEST_CASE("step-loss reader: every error names the file and the line") {
  for (const char* text : {"1 2.5\n1 2.5\n", "1 2.5\n99999999999999999999999 3\n", "1 2.5\n2 0x\n", "1 2.5\n2\n"}) {
    CAPTURE(text);
    const std::string p = write("bad-steploss.txt", text);
    CHECK_THROWS_WITH_AS(load_trace_any(p), doctest::Contains((p + ":2:").c_str()), std::runtime_error);
  }
  const std::string p = write("huge.txt", "1 2.5\n2 1e999\n");  // out-of-range decimals read as inf, not a crash
  CHECK(std::isinf(load_trace_any(p).metrics.at("loss").at(2).value));
}

TEST_CASE("Python's round(x, 5) and repr: ties to even on the exact binary value, shortest digits") {
  CHECK(python_round5(0.015625) == 0.01562);     // an exact binary tie: to even
  CHECK(python_round5(0.046875) == 0.04688);     // the other way
  CHECK(python_round5(10.840924999) == 10.84092);
  CHECK(python_round5(-2.5e-6) == -0.0);
  CHECK(python_round5(123456.123456) == 123456.12346);
  // repr forms through the writer: integers get ".0", small numbers an exponent as Python prints them.
  TraceRecord r;
  std::string text;
  const double values[] = {1e-5, 1e-4, 1629.0, 3e16};
  for (int s = 1; s <= 4; ++s) {
    r.step = s;
    r.lr = values[s - 1];
    text += r.to_json() + "\n";
  }
  const LoadedTrace t = load_trace_any(write("repr.jsonl", text));
  MegatronGoldenOptions o;
  o.metrics = {"learning-rate"};
  o.step_interval = 1;
  const std::string j = to_megatron_json(t, o);
  CHECK(j.find("\"1\": 1e-05,") != std::string::npos);
  CHECK(j.find("\"2\": 0.0001,") != std::string::npos);
  CHECK(j.find("\"3\": 1629.0,") != std::string::npos);
  CHECK(j.find("\"4\": 3.000000081769267e+16\n") != std::string::npos);  // fp32 as TensorBoard keeps it
}

namespace {
// Golden values of one metric at 1, 5, 10, ..., n·5 (or just step 1).
LoadedTrace golden_of(const std::vector<double>& v, const char* name = "lm loss") {
  std::string s = std::string("{\"") + name + "\": {\"start_step\": 1, \"end_step\": " +
                  std::to_string(v.size() == 1 ? 1 : 5 * (v.size() - 1)) + ", \"step_interval\": 5, \"values\": {";
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s\"%zu\": %.17g", i ? ", " : "", i == 0 ? size_t{1} : 5 * i, v[i]);
    s += buf;
  }
  static int n = 0;
  std::string file = "g";  // appended apart: GCC 12 warns (-Wrestrict, a false positive) on literal + to_string
  file += std::to_string(n++) + ".json";
  return load_trace_any(write(file, s + "}}}"));
}
const MegatronCheckResult& check_of(const MegatronPipelineResult& r, bool deterministic) {
  for (const auto& c : r.checks)
    if (c.check.deterministic == deterministic) return c;
  throw std::runtime_error("no such check");
}
}  // namespace

TEST_CASE("Megatron's pipeline: exact checks, the approximate allowance in Megatron's arithmetic, skipped checks") {
  const auto checks = megatron_default_checks({"lm loss"});
  std::vector<double> base(21);
  for (size_t i = 0; i < base.size(); ++i) base[i] = 10.0 - 0.1 * static_cast<double>(i);
  const LoadedTrace g = golden_of(base);
  {
    const auto r = megatron_pipeline(g, golden_of(base), checks, false);
    CHECK(r.pass);
    CHECK(check_of(r, true).message == "DETERMINISTIC test for metric lm loss: PASSED");
  }
  {  // one value off by 1e-5: the exact check fails, the approximate one holds
    auto v = base;
    v[3] += 1e-5;
    const auto r = megatron_pipeline(g, golden_of(v), checks, false);
    CHECK_FALSE(r.pass);
    CHECK(check_of(r, true).message == "Exact comparison of lm loss: FAILED");
    CHECK(check_of(r, true).first_failing_step == 15);
    CHECK(check_of(r, false).pass);
    CHECK(megatron_pipeline(g, golden_of(v), checks, true).pass);  // approximate results only: exact skipped
  }
  {  // 21 golden values: one step may be 10% off, two may not (the same under the legacy total of 20.8)
    auto v = base;
    v[4] *= 1.1;
    CHECK(check_of(megatron_pipeline(g, golden_of(v), checks, true), false).pass);
    v[9] *= 1.1;
    CHECK_FALSE(check_of(megatron_pipeline(g, golden_of(v), checks, true), false).pass);
  }
  {  // 200 golden values (steps 1, 5, ..., 995): 200 // 100 = 2 steps allowed now; the legacy rules counted
     // (995 - 1) / 5 + 1 = 199.8 steps and allowed 199.8 // 100 = 1
    std::vector<double> b2(200, 5.0), v2 = b2;
    v2[10] = v2[20] = 9.0;
    const auto r = megatron_pipeline(golden_of(b2), golden_of(v2), checks, true);
    CHECK(check_of(r, false).allowed == 2.0);
    CHECK(r.pass);
    const auto old = megatron_pipeline(golden_of(b2), golden_of(v2), megatron_default_checks({"lm loss"}, MegatronRules::legacy),
                                       true, MegatronRules::legacy);
    CHECK(check_of(old, false).allowed == 1.0);
    CHECK_FALSE(old.pass);
    v2[20] = 5.0;
    CHECK(megatron_pipeline(golden_of(b2), golden_of(v2), megatron_default_checks({"lm loss"}, MegatronRules::legacy),
                            true, MegatronRules::legacy).pass);
    v2[20] = v2[30] = 9.0;  // three: too many under either
    CHECK_FALSE(megatron_pipeline(golden_of(b2), golden_of(v2), checks, true).pass);
  }
  {  // a single golden step must hold, approximate or not
    const auto r = megatron_pipeline(golden_of({10.0}), golden_of({10.6}), checks, true);
    CHECK_FALSE(r.pass);
  }
  {  // a step the actual run did not log ("nan" = inf) fails against a number; missing metrics fail
    const LoadedTrace nan_run = load_trace_any(write("nan.json", R"({"lm loss": {"start_step": 1, "end_step": 5, "step_interval": 5, "values": {"1": 10.0, "5": "nan"}}})"));
    const auto r = megatron_pipeline(golden_of({10.0, 9.9}), nan_run, checks, false);
    CHECK_FALSE(check_of(r, true).pass);
    CHECK(check_of(r, true).first_failing_step == 5);
    const auto r2 = megatron_pipeline(g, golden_of(base, "grad-norm"), checks, false);
    CHECK_FALSE(r2.pass);
    CHECK(r2.checks[0].message.find("not found") != std::string::npos);
  }
}

namespace {
// Golden values of one metric at the given steps, with the header written as given (sparse files, placeholders).
LoadedTrace golden_at(const char* name, const std::map<int64_t, std::string>& values, int64_t interval) {
  std::string s = std::string("{\"") + name + "\": {\"start_step\": " + std::to_string(values.begin()->first) +
                  ", \"end_step\": " + std::to_string(values.rbegin()->first) +
                  ", \"step_interval\": " + std::to_string(interval) + ", \"values\": {";
  bool first = true;
  for (const auto& [step, v] : values) {
    s += first ? "\"" : ", \"";  // appended apart: GCC 12's -Wrestrict false positive on literal + to_string
    s += std::to_string(step) + "\": " + v;
    first = false;
  }
  static int n = 0;
  return load_trace_any(write("ga" + std::to_string(n++) + ".json", s + "}}}"));
}
MegatronPipelineResult pipeline_under(MegatronRules rules, const char* metric, const LoadedTrace& g, const LoadedTrace& a,
                                      bool approximate_only) {
  return megatron_pipeline(g, a, megatron_default_checks({metric}, rules), approximate_only, rules);
}
}  // namespace

TEST_CASE("Megatron's rules now (its PRs #4238, #6771) and before (--megatron-rules legacy): where the verdicts part") {
  const auto cur = MegatronRules::current, old = MegatronRules::legacy;
  CHECK(parse_megatron_rules("current") == cur);
  CHECK(parse_megatron_rules("legacy") == old);
  CHECK_THROWS_WITH_AS(parse_megatron_rules("2024"), doctest::Contains("current"), std::invalid_argument);

  SUBCASE("the allowance counts the golden values, not the header's range") {
    // 200 values every 10 steps under a header that says step_interval 1: now 200 // 100 = 2 steps may fail; the
    // legacy total (1991 - 1) / 1 + 1 = 1991 allows 19 but demands 1 - 19/1991 = 99.05% close, and 198/200 is 99%.
    std::map<int64_t, std::string> g, a;
    for (int64_t i = 0; i < 200; ++i) g[1 + 10 * i] = a[1 + 10 * i] = "1.0";
    a[1] = a[11] = "2.0";
    const auto now = pipeline_under(cur, "lm loss", golden_at("lm loss", g, 1), golden_at("lm loss", a, 1), true);
    const auto then = pipeline_under(old, "lm loss", golden_at("lm loss", g, 1), golden_at("lm loss", a, 1), true);
    CHECK(now.pass);
    CHECK(check_of(now, false).allowed == 2.0);
    CHECK_FALSE(then.pass);
    CHECK(check_of(then, false).allowed == 19.0);
  }
  SUBCASE("num-zeros: approximate within 20% now, 5% before") {
    std::map<int64_t, std::string> g, a;
    for (int64_t k : {1, 5, 10, 15, 20}) {
      g[k] = "1000.0";
      a[k] = "1100.0";  // 10% more zeros
    }
    const LoadedTrace gz = golden_at("num-zeros", g, 5), az = golden_at("num-zeros", a, 5);
    const auto now = pipeline_under(cur, "num-zeros", gz, az, false);
    CHECK_FALSE(check_of(now, true).pass);  // exact fails under both
    CHECK(check_of(now, false).pass);
    CHECK(check_of(now, false).check.rtol == 0.20);
    const auto then = pipeline_under(old, "num-zeros", gz, az, false);
    CHECK_FALSE(check_of(then, false).pass);
    CHECK(check_of(then, false).check.rtol == 0.05);
    CHECK(pipeline_under(cur, "num-zeros", gz, az, true).pass);  // --approximate: passes now, not before
    CHECK_FALSE(pipeline_under(old, "num-zeros", gz, az, true).pass);
    // lm loss keeps 5% under both
    CHECK(megatron_default_checks({"lm loss"}, cur)[1].rtol == 0.05);
  }
  SUBCASE("a step the actual run did not log is \"nan\" now, so it matches a \"nan\" placeholder") {
    const LoadedTrace g = golden_at("lm loss", {{1, "\"nan\""}, {5, "1.0"}}, 5), a = golden_at("lm loss", {{5, "1.0"}}, 5);
    CHECK(pipeline_under(cur, "lm loss", g, a, false).pass);
    CHECK_FALSE(pipeline_under(old, "lm loss", g, a, false).pass);
    // against a number it fails under both
    const LoadedTrace g2 = golden_at("lm loss", {{1, "1.0"}, {5, "1.0"}}, 5);
    CHECK_FALSE(pipeline_under(cur, "lm loss", g2, a, false).pass);
  }
  SUBCASE("iteration-time: approximate only, on the median of its steady window") {
    const LoadedTrace g = golden_at("iteration-time", {{5, "0.25"}, {10, "0.25"}, {15, "0.25"}, {20, "0.25"}}, 5);
    const LoadedTrace a = golden_at("iteration-time", {{5, "0.10"}, {10, "0.25"}, {15, "0.26"}, {20, "100.0"}}, 5);
    const auto now = pipeline_under(cur, "iteration-time", g, a, false);
    REQUIRE(now.checks.size() == 1);  // no exact check for a timing
    CHECK(now.pass);  // median 0.255 against 0.25
    CHECK_FALSE(pipeline_under(old, "iteration-time", g, a, false).pass);
    const LoadedTrace slow = golden_at("iteration-time", {{5, "0.5"}, {10, "0.5"}, {15, "0.5"}, {20, "0.5"}}, 5);
    CHECK_FALSE(pipeline_under(cur, "iteration-time", g, slow, false).pass);
    // Only placeholders: nothing to time, a failure saying so.
    const LoadedTrace none = golden_at("iteration-time", {{1, "\"nan\""}, {5, "\"nan\""}}, 5);
    const auto r = pipeline_under(cur, "iteration-time", none, none, false);
    CHECK_FALSE(r.pass);
    CHECK(r.checks[0].message.find("no finite values") != std::string::npos);
    // A long run compares steps 30..45; a short one with nothing there takes the first four after the warmup.
    const LoadedTrace sparse = golden_at("iteration-time", {{1, "\"nan\""}, {100, "0.25"}, {200, "0.25"}}, 100);
    CHECK(pipeline_under(cur, "iteration-time", sparse, golden_at("iteration-time", {{100, "0.25"}, {200, "0.25"}}, 100),
                         false).pass);
  }
  SUBCASE("a metric Megatron has no threshold for is refused now; the legacy rules gave it [exact, 5%]") {
    CHECK_THROWS_WITH_AS(megatron_default_checks({"lm loss", "grad-norm"}, cur), doctest::Contains("grad-norm"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(megatron_default_checks({"grad-norm"}, cur), doctest::Contains("--rules"), std::invalid_argument);
    CHECK(megatron_default_checks({"grad-norm"}, old).size() == 2);
    CHECK(megatron_default_checks({"mem-allocated-bytes", "mtp_1 loss"}, cur).size() == 3);
  }
  SUBCASE("golden values with no steps fail, saying so") {
    const LoadedTrace empty =
        load_trace_any(write("empty.json", R"({"lm loss": {"start_step": 1, "end_step": 1, "step_interval": 5, "values": {}}})"));
    const auto r = pipeline_under(cur, "lm loss", empty, golden_of({1.0}), false);
    CHECK_FALSE(r.pass);
    CHECK(r.checks[0].message == "Metric lm loss has no values in the golden file.");
  }
  SUBCASE("the report says which rules it applied") {
    std::map<int64_t, std::string> v{{1, "1.0"}};
    const LoadedTrace g = golden_at("lm loss", v, 5);
    CHECK(format_megatron_report(g, g, pipeline_under(cur, "lm loss", g, g, false)).find("rules: current") !=
          std::string::npos);
    CHECK(format_megatron_report(g, g, pipeline_under(old, "lm loss", g, g, false)).find("rules: legacy") !=
          std::string::npos);
  }
}

TEST_CASE("Megatron's extractor now keeps only observed samples; the legacy one wrote \"nan\" where a step was missing") {
  const LoadedTrace a = load_trace_any(olmoref_trace("x.jsonl", 12));
  MegatronGoldenOptions o;
  o.metrics = {"lm loss"};
  o.train_iters = 30;  // past the run's last step (12)
  const LoadedTrace now = load_trace_any(write("x-now.json", to_megatron_json(a, o)));
  CHECK(now.metrics.at("loss").size() == 3);  // 1, 5, 10: no placeholders
  CHECK(now.megatron_ranges.at("loss").end_step == 10);
  CHECK(now.megatron_ranges.at("loss").step_interval == 5);
  o.rules = MegatronRules::legacy;
  const LoadedTrace then = load_trace_any(write("x-then.json", to_megatron_json(a, o)));
  CHECK(then.metrics.at("loss").size() == 7);  // 1, 5, ..., 30
  CHECK(then.metrics.at("loss").at(30).exact == "nan");
  CHECK(then.megatron_ranges.at("loss").end_step == 30);
  // The cadence is what was observed (the gcd of the gaps after the start step), as Megatron infers it.
  o.rules = MegatronRules::current;
  o.train_iters = 0;
  o.step_interval = 2;
  o.start_step = 3;
  const LoadedTrace even = load_trace_any(write("x-even.json", to_megatron_json(a, o)));
  CHECK(even.megatron_ranges.at("loss").start_step == 3);
  CHECK(even.megatron_ranges.at("loss").step_interval == 2);
  CHECK(even.metrics.at("loss").size() == 6);  // 3, 4, 6, 8, 10, 12
}

TEST_CASE("TorchTitan console logs: colour and prefixes stripped, validation lines apart, restarts, rounding") {
  const std::string log =
      "[rank0]:[titan] 2026-11-30 10:00:00,000 - root - INFO - Training starts at step 1\n"
      "[rank0]:[titan] 2026-11-30 10:00:01,000 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss: 12.2511  "
      "\x1b[33mgrad_norm:  4.0123  \x1b[34mmemory: 10.20GiB(12.34%)  tps: 1,234  tflops: 56.78  mfu: 9.87%\x1b[39m\n"
      "[titan] 2026-11-30 10:00:02,000 - root - INFO - step:  2  loss: 11.0000  grad_norm:  3.5000  memory: 1GiB(1%)\n"
      "[titan] 2026-11-30 10:00:03,000 - root - INFO - \x1b[33mvalidate step:  2  \x1b[32mloss:  9.5000  memory: 1GiB(1%)\n"
      "[titan] restarted from the checkpoint at step 1\n"
      "step:  2  loss: 11.0000  grad_norm:  3.5000\n"
      "step: 10  loss:  8.1234  grad_norm:  1.0000\n";
  const LoadedTrace t = load_trace_any(write("titan.log", log));
  CHECK(t.format == "torchtitan-log");
  CHECK(t.metrics.at("loss").size() == 3);
  CHECK(t.metrics.at("loss").at(1).value == 12.2511);
  CHECK(t.metrics.at("grad_norm").at(1).value == 4.0123);
  CHECK(t.metrics.at("validation_loss").at(2).value == 9.5);
  CHECK(t.decimals.at("loss") == 4);
  // A restart that logs a step again with another value is two runs in one file.
  CHECK_THROWS_WITH_AS(load_trace_any(write("titan2.log", "step: 1  loss: 2.0000\nstep: 1  loss: 2.5000\n")),
                       doctest::Contains("titan2.log:2"), std::runtime_error);
  // The default rule allows half the last printed digit: 8.12344 and 8.12336 both print 8.1234.
  const LoadedTrace ours = load_trace_any(write("ours.txt", "1 12.25114\n2 11.00004\n10 8.12344\n"));
  CHECK(compare_traces(ours, t, default_rules(ours, t)).pass);
  const LoadedTrace off = load_trace_any(write("off.txt", "1 12.25114\n2 11.00004\n10 8.12360\n"));
  CHECK_FALSE(compare_traces(off, t, default_rules(off, t)).pass);
}

TEST_CASE("step-loss text: a first line with numbers is data, never a silently dropped header") {
  for (const char* text : {"1 2.5x\n2 3.0\n", "1.5 2.0\n2 3.0\n", "1\n2 3.0\n"}) {
    CAPTURE(text);
    const std::string p = write("firstline.txt", text);
    CHECK_THROWS_WITH_AS(load_trace_any(p), doctest::Contains((p + ":1:").c_str()), std::runtime_error);
  }
  CHECK(load_trace_any(write("hdr.txt", "step,loss\n1,2.5\n")).metrics.at("loss").at(1).value == 2.5);
}

TEST_CASE("--loss ce: an olmoref trace's loss becomes its cross-entropy, exactly") {
  LoadedTrace a = load_trace_any(olmoref_trace("ce.jsonl", 3));
  const auto ce = a.metrics.at("ce");
  use_ce_as_loss(a);
  CHECK(a.metrics.at("loss").at(2).exact == ce.at(2).exact);
  LoadedTrace s = load_trace_any(write("noce.txt", "1 2.0\n"));
  CHECK_THROWS_WITH_AS(use_ce_as_loss(s), doctest::Contains("noce.txt"), std::runtime_error);
}

TEST_CASE("mixture of experts: trace compare names the first step whose routing differs") {
  // B routes one token differently from step 3 on; its loss only moves (by an ulp) at step 5.
  auto moe_trace = [](const std::string& name, int route_from, int bump) {
    std::string text;
    for (int s = 1; s <= 6; ++s) {
      TraceRecord r;
      r.step = s;
      r.epoch = 1;
      r.loss = 8.0f - 0.1f * static_cast<float>(s);
      if (s >= bump) r.loss = std::nextafter(r.loss, 100.0f);
      r.ce = r.loss;
      r.grad_norm = 1.5f;
      r.lr = 1e-3;
      r.tokens = 100 * s;
      r.data_digest = "00000000000000" + std::to_string(10 + s);
      r.param_digest = "0123456789abcdef0123456789abcd" + std::to_string(10 + s);
      r.moe_lb = 0.01f, r.moe_z = 0.002f;
      r.routing_digest = (s >= route_from ? "ffffffffffffff" : "00000000000000") + std::to_string(10 + s);
      r.expert_load = {{3, 1}, {2, 2}};
      text += r.to_json() + "\n";
    }
    return write(name, text);
  };
  const LoadedTrace a = load_trace_any(moe_trace("m1.jsonl", 99, 99));
  const LoadedTrace b = load_trace_any(moe_trace("m2.jsonl", 3, 5));
  const CompareRules rules = default_rules(a, b);
  const CompareResult same = compare_traces(a, load_trace_any(moe_trace("m3.jsonl", 99, 99)), rules);
  CHECK(same.pass);
  CHECK(format_compare_report(a, a, rules, same).find("routing: identical at every compared step") != std::string::npos);
  const CompareResult r = compare_traces(a, b, rules);
  CHECK_FALSE(r.pass);
  CHECK(r.first_differing_step == 3);
  CHECK(result_for(r, "routing_digest").first_differing_step == 3);
  CHECK(result_for(r, "loss").first_differing_step == 5);
  const std::string report = format_compare_report(a, b, rules, r);
  CHECK(report.find("routing: first differs at step 3") != std::string::npos);
  // The MoE fields round-trip through the trace reader.
  TraceRecord t;
  t.step = 1, t.epoch = 1, t.data_digest = "00", t.param_digest = "11", t.routing_digest = "abcdef0123456789";
  t.moe_lb = 0.25f, t.moe_z = 0.5f, t.expert_load = {{1, 2, 3}};
  const TraceRecord back = TraceRecord::from_json(t.to_json());
  CHECK(back.routing_digest == "abcdef0123456789");
  CHECK(back.moe_lb == 0.25f);
  CHECK(back.moe_z == 0.5f);
  CHECK(back.expert_load == std::vector<std::vector<int64_t>>{{1, 2, 3}});
}

TEST_CASE("at_most: a replay's own error, judged at every step of A, its first step over the limit named") {
  std::string golden, replay;
  for (int s = 1; s <= 5; ++s) {
    golden += "{\"step\":" + std::to_string(s) + ",\"loss\":2.5}\n";
    const double err = s == 4 ? 3e-4 : 1e-6 * s;
    replay += "{\"step\":" + std::to_string(s) + ",\"loss\":2.5" +
              (s == 2 ? std::string() : ",\"update_err\":" + std::to_string(err)) + "}\n";
  }
  const LoadedTrace a = load_trace_any(write("am-golden.jsonl", golden)), b = load_trace_any(write("am-replay.jsonl", replay));
  const CompareRules loose = parse_rules("[update_err]\ncheck = \"at_most\"\nlimit = 1e-3\n", "am.toml");
  CompareResult r = compare_traces(a, b, loose);
  CHECK_FALSE(r.pass);  // step 2 lacks it: a judged step the replay did not judge
  CHECK(result_for(r, "update_err").missing_in_b == 1);
  CHECK(result_for(r, "update_err").first_failing_step == 2);
  const CompareRules from3 = parse_rules("[update_err]\ncheck = \"at_most\"\nlimit = 1e-3\nfirst_step = 3\n", "am.toml");
  r = compare_traces(a, b, from3);
  CHECK(r.pass);
  CHECK(result_for(r, "update_err").compared == 3);
  CHECK(result_for(r, "update_err").max_abs == doctest::Approx(3e-4));
  CHECK(result_for(r, "update_err").max_rel_step == 4);
  const CompareRules tight = parse_rules("[update_err]\ncheck = \"at_most\"\nlimit = 1e-4\nfirst_step = 3\n", "am.toml");
  r = compare_traces(a, b, tight);
  CHECK_FALSE(r.pass);
  CHECK(r.first_differing_step == 4);
  CHECK(format_compare_report(a, b, tight, r).find("at_most 0.0001") != std::string::npos);
  // Absent from B altogether: fails unless not required.
  const LoadedTrace none = load_trace_any(write("am-none.jsonl", golden));
  CHECK_FALSE(compare_traces(a, none, tight).pass);
  CHECK(compare_traces(a, none, parse_rules("[update_err]\ncheck = \"at_most\"\nlimit = 1\nrequired = false\n", "am.toml")).pass);
  // The limit belongs to at_most alone.
  CHECK_THROWS_WITH_AS(parse_rules("[e]\ncheck = \"at_most\"\n", "am.toml"), doctest::Contains("limit"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_rules("[e]\nlimit = 1\n", "am.toml"), doctest::Contains("at_most"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_rules("[e]\ncheck = \"at_most\"\nlimit = 1\nrtol = 1\n", "am.toml"), doctest::Contains("not rtol"),
                       std::invalid_argument);
}

TEST_CASE("at_most after a failing rule is still judged (no short circuit)") {
  std::string golden, replay;
  for (int s = 1; s <= 3; ++s) {
    golden += "{\"step\":" + std::to_string(s) + ",\"loss\":2.5}\n";
    replay += "{\"step\":" + std::to_string(s) + ",\"loss\":2.6,\"update_err\":" + (s == 3 ? "0.5" : "0.0") + "}\n";
  }
  const LoadedTrace a = load_trace_any(write("sc-golden.jsonl", golden)), b = load_trace_any(write("sc-replay.jsonl", replay));
  const CompareResult r = compare_traces(
      a, b, parse_rules("[loss]\nrtol = 1e-5\n[update_err]\ncheck = \"at_most\"\nlimit = 0.1\n", "sc.toml"));
  CHECK_FALSE(r.pass);
  CHECK(result_for(r, "update_err").compared == 3);
  CHECK(result_for(r, "update_err").first_failing_step == 3);
}

TEST_CASE("resume comparison: identical, and the first difference named in the order a user acts on") {
  // Four steps; the resumed trace may change one metric at one step.
  auto trace = [&](const std::string& name, int bad_step, const std::string& bad_metric) {
    std::string text;
    for (int s = 1; s <= 4; ++s) {
      const bool bad = s == bad_step;
      text += "{\"step\":" + std::to_string(s) + ",\"loss\":" + (bad && bad_metric == "loss" ? "2.6" : "2.5") +
              ",\"grad_norm\":1.5,\"lr\":" + (bad && bad_metric == "lr" ? "0.002" : "0.001") +
              ",\"data_digest\":\"" + (bad && bad_metric == "data" ? "ff" : "0" + std::to_string(s)) +
              "\",\"param_digest\":\"" + (bad && bad_metric == "params" ? "ee" : "p" + std::to_string(s)) + "\"}\n";
    }
    return load_trace_any(write(name, text));
  };
  ResumeAuditInput in;
  in.straight = trace("rs-straight.jsonl", 0, "");
  in.stop_after = 2;
  in.straight_at_stop = {{"params", "A"}, {"optimizer", "B"}};
  in.final_straight = {{"params", "F"}};
  auto judge = [&](int step, const std::string& metric, StateDigests loaded = {{"params", "A"}, {"optimizer", "B"}},
                   StateDigests fin = {{"params", "F"}}) {
    in.resumed = trace("rs-resumed.jsonl", step, metric);
    in.loaded = loaded;
    in.final_resumed = fin;
    return compare_resume(in);
  };
  ResumeFinding f = judge(0, "");
  CHECK(f.identical);
  CHECK(format_resume_report(in, f, "test").find("IDENTICAL") != std::string::npos);
  f = judge(3, "data");
  CHECK(f.first_step == 3);
  CHECK(f.first_what == "batch");
  f = judge(3, "lr");
  CHECK(f.first_what == "lr");
  f = judge(4, "params");
  CHECK(f.first_step == 4);
  CHECK(f.first_what == "parameters after the step");
  // The loaded state comes before anything computed from it; a difference before the stop before everything.
  f = judge(3, "loss", {{"params", "A"}, {"optimizer", "X"}});
  CHECK(f.first_step == 2);
  CHECK(f.first_what == "optimizer state as loaded");
  f = judge(1, "loss", {{"params", "X"}, {"optimizer", "B"}});
  CHECK(f.first_step == 1);
  CHECK(f.diagnosis.find("before the stop") != std::string::npos);
  f = judge(0, "", {{"params", "A"}, {"optimizer", "B"}}, {{"params", "G"}});
  CHECK(f.first_what == "final state");
  const std::string report = format_resume_report(in, f, "test");
  CHECK(report.find("DIFFERENT: first at step 4: final state") != std::string::npos);
}
