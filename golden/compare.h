// golden/compare.h — compare traces of any framework (read by interop/trace_formats.h) under per-metric rules
// (docs/formats/compare.md), in the spirit of Megatron's golden values.
//
// Rules: per metric, `exact` (bit patterns where both sides carry them, else equal numbers or strings),
// `close` (|b − a| <= atol + rtol·|a|, A being the reference), `at_most` (a metric only B records, such as a
// replay's error against the state it was handed: b <= limit at every step of A) or `report` (never fails). Each rule allows a
// number of failing steps (Megatron: exact allows none, approximate max(1, min(n/100, 50)): "megatron").
// A step of A missing from B fails (Megatron counts it as inf); steps only in B are ignored and counted.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "interop/trace_formats.h"

namespace olmoref {

struct MetricRule {
  enum class Check { exact, close, at_most, report };
  std::string name;    // the rule's name (its table in the rules file); several rules may check one metric
  std::string metric;  // the metric it checks (default: the name)
  Check check = Check::exact;
  double rtol = 0, atol = 0;
  double limit = 0;                  // at_most
  int64_t max_failing_steps = 0;     // -1: Megatron's max(1, min(n/100, 50))
  int64_t first_step = 0;            // 0: from A's first step
  int64_t last_step = 0;             // 0: to A's last step
  int64_t min_steps = 1;             // fewer compared steps than this fails the rule
  bool required = true;              // the metric must be present in both traces
};

struct CompareRules {
  std::vector<MetricRule> rules;
  std::string description;  // where the rules came from, for the report
};

// Parses a rules file: TOML (one table per metric, see docs/formats/compare.md) or JSON (same keys). Throws
// std::invalid_argument naming the file and the bad key.
CompareRules parse_rules(const std::string& text, const std::string& origin);
CompareRules load_rules(const std::string& path);
// No rules file: exact bits on loss, grad_norm, lr, data_digest and param_digest when both traces are olmoref
// traces; otherwise `loss` close with rtol 1e-5 (the metrics other frameworks' traces carry are decimals).
CompareRules default_rules(const LoadedTrace& a, const LoadedTrace& b);

struct MetricResult {
  MetricRule rule;
  bool present = true;         // in both traces
  int64_t compared = 0;        // steps of A in range that were checked
  int64_t missing_in_b = 0;    // of those, absent from B (counted as failing)
  int64_t missing_in_a = 0;    // steps in range where only B has the metric (counted as failing, and compared)
  int64_t failing = 0;         // steps that break the rule (missing included)
  int64_t allowed = 0;         // failing steps the rule allows
  int64_t first_failing_step = -1;
  int64_t first_differing_step = -1;  // first step whose values are not identical (even when allowed)
  bool numeric = false;               // the metric has numbers (digests do not)
  double max_abs = 0, max_rel = 0;    // over compared numeric steps
  int64_t max_rel_step = -1;
  bool pass = true;
  std::string note;
};

struct CompareResult {
  std::vector<MetricResult> metrics;
  int64_t first_differing_step = -1;   // over every ruled metric
  int64_t steps_only_in_b = 0;
  bool pass = true;
};

CompareResult compare_traces(const LoadedTrace& a, const LoadedTrace& b, const CompareRules& rules);
// The `exact` check: identical bit patterns where both carry them, else equal numbers (NaN equals NaN with the same
// bits) or strings.
bool identical_values(const MetricValue& a, const MetricValue& b);
// The human-readable report: inputs, rules, a table per metric, the first differing step with the values of
// every metric there, and a last line "PASS: ..." or "FAIL: ...".
std::string format_compare_report(const LoadedTrace& a, const LoadedTrace& b, const CompareRules& rules,
                                  const CompareResult& result);

// ---- Megatron-LM's own comparison ----
// What Megatron's functional tests do with two golden-values files (tests/functional_tests/python_test_utils/
// common.py `pipeline`, test_pretraining_regular_pipeline.py CHECK_THRESHOLDS): per metric a list of checks, each
// evaluated at the golden file's steps with np.isclose(actual, golden, rtol, atol) (a string value, "nan", counts
// as inf, which is close only to inf). A deterministic check (rtol = atol = 0) must hold at every step; an
// approximate one may fail on min(max(total // 100, 1), 50) steps (pass iff the fraction of close steps is
// >= 1 - allowed / total, in floating point as Megatron computes it); a metric whose golden values hold one step
// must hold there. With compare_approximate_results (Megatron's --allow-nondeterministic-algo runs) the
// deterministic checks are skipped. Which Megatron (MegatronRules, interop/trace_formats.h):
//   current: total = the number of golden values (PR #6771); a step the actual values lack is "nan"; thresholds as
//            CHECK_THRESHOLDS has them (PR #4238: num-zeros rtol 0.20); iteration-time compares the medians of
//            its steady window (steps 5..20 for runs up to 25 steps, 30..45 beyond; else the first four finite
//            values after the window's start) as one step; a metric without a threshold there is refused.
//   legacy:  total = (end_step - start_step) / step_interval + 1; a step the actual values lack fails;
//            [exact, approximate rtol 0.05] for every metric.
struct MegatronCheck {
  std::string metric;  // Megatron's name ("lm loss")
  bool deterministic = true;
  double rtol = 0, atol = 0;
};
// Megatron's checks for the metrics asked (default: its default METRICS, lm loss and num-zeros). Current rules:
// CHECK_THRESHOLDS' entries; a metric it has no entry for throws std::invalid_argument naming the ones it has.
std::vector<MegatronCheck> megatron_default_checks(const std::vector<std::string>& metrics = {"lm loss", "num-zeros"},
                                                   MegatronRules rules = MegatronRules::current);

struct MegatronCheckResult {
  MegatronCheck check;
  bool skipped = false;     // a deterministic check under compare_approximate_results
  bool pass = false;
  int64_t steps = 0;        // golden steps compared
  int64_t failing = 0;      // steps not close (a step missing from the actual values included)
  int64_t missing = 0;      // golden steps the actual values lack
  double allowed = 0;       // failing steps allowed (approximate checks)
  int64_t first_failing_step = -1;
  std::string message;      // Megatron's own wording: "... test for metric lm loss: PASSED" / "... : FAILED"
  std::string note;         // how the values were compared when not step by step (iteration-time's medians)
};
struct MegatronPipelineResult {
  std::vector<MegatronCheckResult> checks;
  bool pass = true;
  MegatronRules rules = MegatronRules::current;
};
// golden and actual must be golden values (format "megatron"; megatron_golden_values makes them from any trace).
MegatronPipelineResult megatron_pipeline(const LoadedTrace& golden, const LoadedTrace& actual,
                                         const std::vector<MegatronCheck>& checks, bool compare_approximate_results,
                                         MegatronRules rules = MegatronRules::current);
std::string format_megatron_report(const LoadedTrace& golden, const LoadedTrace& actual,
                                   const MegatronPipelineResult& r);

}  // namespace olmoref
