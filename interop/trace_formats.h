// interop/trace_formats.h — other frameworks' per-step metric files, read and written as they do
// (docs/formats/compare.md, docs/formats/frameworks.md).
//
// Readers (format detected from the content):
//   olmoref   trace.jsonl (olmoref-trace/1): every field; exact values from the *_hex fields and the digests
//   jsonl     any JSON Lines with a "step" per record (e.g. golden/replay/replay.py's output): its numeric fields
//   megatron  Megatron-LM golden values: {"lm loss": {"start_step", "end_step", "step_interval", "values": {"1": ...}}}
//   steploss  plain text, one "step loss" per line (TorchTitan's tests/assets/losses/*.txt); '#' comments; an
//             optional first line of column names ("step loss"), but a first line holding numbers is data and must
//             parse as data (a malformed first record is refused, not taken for a header)
//   torchtitan-log  TorchTitan's console training log (`step: N  loss: X  grad_norm: Y  memory: ...`, with or
//             without ANSI colour, any logging prefix); loss and grad_norm as printed (4 decimals), "validate
//             step:" lines as validation_loss; other lines ignored
// Metric names are normalised (canonical_metric): Megatron's "lm loss" and TorchTitan's loss column are `loss`,
// "grad-norm" is `grad_norm`, "learning-rate" is `lr`; others keep their names.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace olmoref {

struct MetricValue {
  double value = 0;   // the number (NaN for string metrics such as digests)
  std::string exact;  // an exact representation when the source has one (IEEE hex bits, a digest), else ""
};

// A Megatron golden-values metric's header: values at start_step, then every step_interval up to end_step.
struct MegatronRange {
  int64_t start_step = 1, end_step = 1, step_interval = 1;
};

struct LoadedTrace {
  std::string path;
  std::string format;  // "olmoref", "jsonl", "megatron", "steploss", "torchtitan-log"
  std::map<std::string, std::map<int64_t, MetricValue>> metrics;  // metric -> step -> value
  std::map<std::string, MegatronRange> megatron_ranges;  // megatron files: each metric's header
  std::map<std::string, int> decimals;  // metrics the source printed rounded to this many decimals (console logs)
  std::vector<int64_t> steps() const;  // every step that has any metric, ascending
  std::string describe() const;        // "path (format, N steps a..b, metrics ...)"
};

// Reads a trace file (or a run directory: DIR/trace.jsonl). Throws std::runtime_error naming the file and line.
LoadedTrace load_trace_any(const std::string& path);

// A framework's metric name as olmoref calls it ("lm loss" -> "loss", "grad-norm" -> "grad_norm", ...).
std::string canonical_metric(const std::string& name);

// An olmoref trace's `loss` is ce + z-loss. Megatron's "lm loss" and TorchTitan's loss are the cross-entropy
// alone, so a trace compared with or handed to them should carry its `ce` as `loss`: this replaces the loss
// series by the ce series (exact bits). Throws naming the file when the trace has no ce.
void use_ce_as_loss(LoadedTrace& t);

// Megatron-LM has changed how its functional tests extract and compare golden values; which version to follow
// (docs/formats/compare.md, "Megatron's own comparison"):
//   current  Megatron-LM since its PR #6771 (and #4238): only the steps a run logged are kept, the failing-step
//            allowance counts the golden values, num-zeros' approximate rtol is 0.20, timings and memory are
//            compared approximately only (iteration-time by the median of its steady window), a step the actual
//            values lack is "nan"
//   legacy   what olmoref applied before (`--megatron-rules legacy`): unlogged steps written as "nan" up to
//            train_iters, the allowance from (end_step - start_step) / step_interval + 1 (Megatron from PR #4591 to
//            #6771), [exact, approximate rtol 0.05] for every metric (num-zeros' rtol before #4238), a step the
//            actual values lack fails. No single Megatron revision had all of these together.
enum class MegatronRules { current, legacy };
MegatronRules parse_megatron_rules(const std::string& name);  // "current" | "legacy"; throws naming both
const char* megatron_rules_name(MegatronRules r);

// What Megatron-LM's functional tests keep of a run (tests/functional_tests/python_test_utils/common.py,
// read_tb_logs_as_list): each metric as TensorBoard stores it (fp32), rounded to 5 decimals by Python's round(),
// at start_step and then at every step k > start_step with k % step_interval == 0, up to train_iters. Current
// rules: only the steps the run logged, the header's start_step and end_step the first and last of them and its
// step_interval their cadence (the gcd of the gaps between kept steps other than start_step; step_interval when
// fewer than two). Legacy rules: every step of the grid, "nan" where the run did not log it (Megatron's comparison
// reads it as inf), the header start_step, the last grid step and step_interval.
struct MegatronGoldenOptions {
  int64_t start_step = 1;
  int64_t step_interval = 5;
  int64_t train_iters = 0;                                      // 0: the trace's last step
  std::vector<std::string> metrics = {"lm loss", "num-zeros"};  // Megatron's names; its default METRICS
  MegatronRules rules = MegatronRules::current;
};
// The golden values as a LoadedTrace (format "megatron", ranges set): the input of Megatron's comparison.
LoadedTrace megatron_golden_values(const LoadedTrace& t, const MegatronGoldenOptions& opts);
// The same as golden-values JSON: metrics in the order asked, step keys in integer order, numbers as Python's
// json writes them (repr), so a file written here equals the one Megatron's extractor writes from the run.
std::string to_megatron_json(const LoadedTrace& t, const MegatronGoldenOptions& opts);
// Python's round(x, 5) of a double (correctly rounded to 5 decimals, ties to even on the exact binary value).
double python_round5(double x);
// Megatron's name for one of our metrics and back ("loss" <-> "lm loss", "num_zeros" <-> "num-zeros", ...).
std::string megatron_metric_name(const std::string& ours);

std::string to_steploss_text(const LoadedTrace& t);  // "step loss" lines, %.17g (exact round trip)

}  // namespace olmoref
