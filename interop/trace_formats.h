// interop/trace_formats.h — other frameworks' per-step metric files, read and written as they do
// (docs/formats/compare.md, docs/formats/frameworks.md).
//
// Readers (format detected from the content):
//   olmoref   trace.jsonl (olmoref-trace/1): every field; exact values from the *_hex fields and the digests
//   jsonl     any JSON Lines with a "step" per record (e.g. golden/replay/replay.py's output): its numeric fields
//   megatron  Megatron-LM golden values: {"lm loss": {"start_step", "end_step", "step_interval", "values": {"1": ...}}}
//   steploss  plain text, one "step loss" per line (TorchTitan's tests/assets/losses/*.txt); '#' comments
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

struct LoadedTrace {
  std::string path;
  std::string format;  // "olmoref", "jsonl", "megatron", "steploss"
  std::map<std::string, std::map<int64_t, MetricValue>> metrics;  // metric -> step -> value
  std::vector<int64_t> steps() const;  // every step that has any metric, ascending
  std::string describe() const;        // "path (format, N steps a..b, metrics ...)"
};

// Reads a trace file (or a run directory: DIR/trace.jsonl). Throws std::runtime_error naming the file and line.
LoadedTrace load_trace_any(const std::string& path);

// A framework's metric name as olmoref calls it ("lm loss" -> "loss", "grad-norm" -> "grad_norm", ...).
std::string canonical_metric(const std::string& name);

// Writers, so an olmoref trace can be handed to tools that read the other formats.
std::string to_megatron_json(const LoadedTrace& t, int64_t step_interval = 1);  // every metric with numbers
std::string to_steploss_text(const LoadedTrace& t);                             // "step loss" lines, %.9g

}  // namespace olmoref
