#include "interop/trace_formats.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "data/json_file.h"

namespace olmoref {

namespace {

using nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open (a trace file, or a run directory holding trace.jsonl)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::string canonical_metric(const std::string& name) {
  static const std::map<std::string, std::string> alias = {
      {"lm loss", "loss"}, {"lm_loss", "loss"}, {"lm-loss", "loss"},
      {"grad-norm", "grad_norm"}, {"grad norm", "grad_norm"},
      {"learning-rate", "lr"}, {"learning rate", "lr"}, {"learning_rate", "lr"},
      {"num-zeros", "num_zeros"}, {"num zeros", "num_zeros"}};
  const auto it = alias.find(lower(name));
  return it == alias.end() ? name : it->second;
}

namespace {

// The value an IEEE bit pattern in hex stands for: 8 digits fp32, 16 digits fp64.
std::optional<double> value_of_hex(const std::string& hex) {
  if (hex.size() == 8) {
    const uint32_t u = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
    float f;
    std::memcpy(&f, &u, 4);
    return static_cast<double>(f);
  }
  if (hex.size() == 16) {
    const uint64_t u = std::stoull(hex, nullptr, 16);
    double d;
    std::memcpy(&d, &u, 8);
    return d;
  }
  return std::nullopt;
}

double number_of(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = lower(v.get<std::string>());
    if (s == "nan") return kNaN;
    if (s == "inf" || s == "+inf" || s == "infinity") return std::numeric_limits<double>::infinity();
    if (s == "-inf" || s == "-infinity") return -std::numeric_limits<double>::infinity();
    // strtod, not stod: an out-of-range decimal (1e999) is ±inf or 0 with a message here, not a bare exception.
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return d;
  }
  if (v.is_null()) return kNaN;
  throw std::runtime_error("not a number: " + v.dump());
}

void read_jsonl(LoadedTrace& t, const std::string& text) {
  std::istringstream in(text);
  std::string line;
  int64_t lineno = 0;
  bool first = true;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
      if (!j.is_object() || !j.contains("step")) throw std::runtime_error("no \"step\"");
      if (const std::string why = data::record_checksum_mismatch(line); !why.empty()) throw std::runtime_error(why);
      const int64_t step = j.at("step").get<int64_t>();
      if (first) t.format = j.contains("loss_hex") ? "olmoref" : "jsonl";
      first = false;
      for (const auto& [key, v] : j.items()) {
        if (key == "step" || key == data::kRecordChecksumKey) continue;  // the line's checksum, checked above
        if (key.size() > 4 && key.compare(key.size() - 4, 4, "_hex") == 0) continue;
        MetricValue mv;
        if (v.is_number() || v.is_null()) {
          // null: JSON's spelling of a non-finite value (olmoref traces keep the exact bits in the hex twin).
          mv.value = v.is_number() ? v.get<double>() : kNaN;
          const std::string hk = key + "_hex";
          if (j.contains(hk) && j.at(hk).is_string()) {
            mv.exact = lower(j.at(hk).get<std::string>());
            if (auto x = value_of_hex(mv.exact)) mv.value = *x;  // the exact value, not the rounded decimal
          }
        } else if (v.is_string()) {
          mv.value = kNaN;
          mv.exact = lower(v.get<std::string>());
        } else {
          continue;  // objects, arrays, booleans: not metrics
        }
        auto& series = t.metrics[canonical_metric(key)];
        if (!series.emplace(step, mv).second)
          throw std::runtime_error("step " + std::to_string(step) + " appears twice");
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(t.path + ":" + std::to_string(lineno) + ": not a trace record (" + e.what() + ")");
    }
  }
  if (first) throw std::runtime_error(t.path + ": empty trace (no records)");
}

// A golden value: a number, or a string ("nan" for a step the run did not log), which Megatron's comparison takes
// as inf; the string is kept in `exact` so the comparison can tell it from a logged NaN.
MetricValue megatron_value(const json& v) {
  MetricValue mv{number_of(v), ""};
  if (v.is_string()) mv.exact = lower(v.get<std::string>());
  return mv;
}

void read_megatron(LoadedTrace& t, const json& j) {
  t.format = "megatron";
  for (const auto& [name, m] : j.items()) {
    if (!m.is_object() || !m.contains("values")) continue;
    const std::string metric = canonical_metric(name);
    auto& series = t.metrics[metric];
    const json& vals = m.at("values");
    try {
      const int64_t every = m.value("step_interval", int64_t{1});
      if (every < 1) throw std::runtime_error("\"step_interval\" must be >= 1");
      if (vals.is_object()) {
        for (const auto& [step, v] : vals.items()) {
          size_t used = 0;
          const int64_t s = std::stoll(step, &used);
          if (used != step.size()) throw std::runtime_error("step key '" + step + "' is not an integer");
          series[s] = megatron_value(v);
        }
      } else if (vals.is_array()) {
        // Older golden files hold a list: the extractor of the time took every TensorBoard scalar of the run
        // (iterations 1, 2, 3, ...) and kept list[0::step_interval], writing "start_step": 0 as the list index.
        // Element i is therefore iteration 1 + i·step_interval; reading it as start_step + i·step_interval would
        // put every value one step early. A list with start_step >= 1 is taken to start at that iteration.
        const int64_t start_index = m.value("start_step", int64_t{0});
        const int64_t first = start_index <= 0 ? 1 : start_index;
        for (size_t i = 0; i < vals.size(); ++i)
          series[first + static_cast<int64_t>(i) * every] = megatron_value(vals[i]);
      } else {
        throw std::runtime_error("\"values\" must be an object or a list");
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(t.path + ": Megatron metric '" + name + "': " + e.what());
    }
    MegatronRange r;
    r.step_interval = m.value("step_interval", int64_t{1});
    r.start_step = series.empty() ? 1 : series.begin()->first;
    r.end_step = series.empty() ? 1 : series.rbegin()->first;
    t.megatron_ranges[metric] = r;
  }
  if (t.metrics.empty())
    throw std::runtime_error(t.path + ": a JSON object but no metric with \"values\" (expected Megatron golden values)");
}

void read_steploss(LoadedTrace& t, const std::string& text) {
  t.format = "steploss";
  std::istringstream in(text);
  std::string line;
  int64_t lineno = 0;
  auto& series = t.metrics["loss"];
  while (std::getline(in, line)) {
    ++lineno;
    for (char& c : line)
      if (c == ',' || c == '\t' || c == ':' || c == '\r') c = ' ';
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string s_step, s_loss;
    if (!(ls >> s_step)) continue;
    try {
      size_t used = 0;
      const int64_t step = std::stoll(s_step, &used);
      if (used != s_step.size()) throw std::invalid_argument("step");
      if (!(ls >> s_loss)) throw std::invalid_argument("loss");
      if (!series.emplace(step, MetricValue{number_of(json(s_loss)), ""}).second)
        throw std::runtime_error("step " + std::to_string(step) + " appears twice");
    } catch (const std::invalid_argument&) {
      // A header names columns; a first line with a digit in it is a record, and a broken one must not vanish.
      if (series.empty() && lineno == 1 && line.find_first_of("0123456789") == std::string::npos) continue;
      if (lineno == 1)
        throw std::runtime_error(t.path + ":1: the first line holds numbers but is not \"STEP LOSS\" (got '" + line +
                                 "'); a header line may hold only column names, e.g. \"step loss\"");
      throw std::runtime_error(t.path + ":" + std::to_string(lineno) + ": expected \"STEP LOSS\" (got '" + line + "')");
    } catch (const std::out_of_range&) {
      throw std::runtime_error(t.path + ":" + std::to_string(lineno) + ": the step number is out of range (line '" +
                               line + "')");
    } catch (const std::exception& e) {  // a repeated step, a loss that is not a number
      throw std::runtime_error(t.path + ":" + std::to_string(lineno) + ": " + e.what() + " (line '" + line + "')");
    }
  }
  if (series.empty()) throw std::runtime_error(t.path + ": no \"step loss\" lines");
}

// ANSI escape sequences (TorchTitan colours its console lines): ESC [ ... final byte.
std::string strip_ansi(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\x1b' && i + 1 < s.size() && s[i + 1] == '[') {
      i += 2;
      while (i < s.size() && !(s[i] >= 0x40 && s[i] <= 0x7e)) ++i;
      continue;
    }
    out += s[i];
  }
  return out;
}

// "step: N" at a word boundary, then "loss: X" (TorchTitan's MetricsProcessor.log and log_validation lines).
struct TitanLine {
  bool validation = false;
  int64_t step = 0;
  std::string loss, grad_norm;
};
std::optional<TitanLine> parse_titan_line(const std::string& raw) {
  const std::string line = strip_ansi(raw);
  size_t at = std::string::npos;
  for (size_t p = line.find("step:"); p != std::string::npos; p = line.find("step:", p + 1))
    if (p == 0 || !std::isalnum(static_cast<unsigned char>(line[p - 1]))) {
      at = p;
      break;
    }
  if (at == std::string::npos) return std::nullopt;
  TitanLine t;
  t.validation = at >= 9 && line.compare(at - 9, 9, "validate ") == 0;
  std::istringstream in(line.substr(at + 5));
  std::string step, key;
  if (!(in >> step)) return std::nullopt;
  size_t used = 0;
  try {
    t.step = std::stoll(step, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != step.size()) return std::nullopt;
  while (in >> key) {
    std::string value;
    if (key == "loss:" && (in >> value)) t.loss = value;
    else if (key == "grad_norm:" && (in >> value)) t.grad_norm = value;
  }
  if (t.loss.empty()) return std::nullopt;
  return t;
}

bool looks_like_titan_log(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  for (int n = 0; n < 100000 && std::getline(in, line); ++n)
    if (parse_titan_line(line)) return true;
  return false;
}

void read_titan_log(LoadedTrace& t, const std::string& text) {
  t.format = "torchtitan-log";
  std::istringstream in(text);
  std::string line;
  int64_t lineno = 0;
  std::map<std::string, std::map<int64_t, int64_t>> line_of;  // metric -> step -> line it came from
  auto put = [&](const std::string& metric, int64_t step, const std::string& text_value) {
    double v;
    try {
      v = number_of(json(text_value));
    } catch (const std::exception&) {
      throw std::runtime_error(t.path + ":" + std::to_string(lineno) + ": " + metric + " '" + text_value +
                               "' is not a number");
    }
    auto& series = t.metrics[metric];
    const auto it = series.find(step);
    if (it != series.end()) {
      // A restarted job logs again the steps after its checkpoint: the same values are fine, others are two runs.
      if (it->second.value == v || (std::isnan(v) && std::isnan(it->second.value))) return;
      throw std::runtime_error(t.path + ":" + std::to_string(lineno) + ": step " + std::to_string(step) + " " +
                               metric + " " + text_value + " differs from line " +
                               std::to_string(line_of[metric][step]) +
                               " (two runs in one log? split it, or keep the restarted run's part)");
    }
    series[step] = {v, ""};
    line_of[metric][step] = lineno;
    // TorchTitan prints "{x:7.4f}": the value is known to half a unit in the last printed digit.
    const auto dot = text_value.find('.');
    const int digits = dot == std::string::npos ? 0 : static_cast<int>(text_value.size() - dot - 1);
    auto d = t.decimals.find(metric);
    if (d == t.decimals.end() || digits < d->second) t.decimals[metric] = digits;
  };
  while (std::getline(in, line)) {
    ++lineno;
    const auto p = parse_titan_line(line);
    if (!p) continue;
    if (p->validation) {
      put("validation_loss", p->step, p->loss);
      continue;
    }
    put("loss", p->step, p->loss);
    if (!p->grad_norm.empty()) put("grad_norm", p->step, p->grad_norm);
  }
  if (!t.metrics.count("loss"))
    throw std::runtime_error(t.path + ": a TorchTitan log without training lines (\"step: N  loss: X\")");
}

// Python's repr of a double (what json.dump writes): the shortest digits that round-trip; fixed notation when
// the decimal point falls within -4 < decpt <= 16 (".0" added to integers), else d.ddde±XX.
std::string python_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = neg ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // value = 0.digits × 10^decpt
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += ex;
  }
  return out;
}

}  // namespace

std::vector<int64_t> LoadedTrace::steps() const {
  std::set<int64_t> s;
  for (const auto& [name, series] : metrics)
    for (const auto& [step, v] : series) s.insert(step);
  return {s.begin(), s.end()};
}

std::string LoadedTrace::describe() const {
  const auto st = steps();
  std::string s = path + " (" + format + ", " + std::to_string(st.size()) + " steps";
  if (!st.empty()) s += " " + std::to_string(st.front()) + ".." + std::to_string(st.back());
  s += ")";
  return s;
}

LoadedTrace load_trace_any(const std::string& path_in) {
  LoadedTrace t;
  t.path = path_in;
  if (std::filesystem::is_directory(path_in)) t.path = path_in + "/trace.jsonl";
  const std::string text = read_text(t.path);
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw std::runtime_error(t.path + ": empty file");
  if (text[first] == '{') {
    json whole;
    bool single = true;
    try {
      whole = json::parse(text);
    } catch (const json::exception&) {
      single = false;  // several JSON values: JSON Lines
    }
    if (single && whole.is_object() && !whole.contains("step")) {
      read_megatron(t, whole);
      return t;
    }
    read_jsonl(t, text);
    return t;
  }
  if (looks_like_titan_log(text)) {
    read_titan_log(t, text);
    return t;
  }
  read_steploss(t, text);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Writers
// ---------------------------------------------------------------------------------------------

void use_ce_as_loss(LoadedTrace& t) {
  const auto ce = t.metrics.find("ce");
  if (ce == t.metrics.end())
    throw std::runtime_error(t.path + ": no ce metric (the cross-entropy without z-loss); only olmoref traces carry it");
  t.metrics["loss"] = ce->second;
}

double python_round5(double x) {
  if (!std::isfinite(x)) return x;
  // glibc's printf rounds the exact binary value correctly (ties to even), as CPython's round() does through
  // its own correctly rounded dtoa; both then take the double nearest to the 5-decimal string.
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.5f", x);
  return std::strtod(buf, nullptr);
}

std::string megatron_metric_name(const std::string& ours) {
  static const std::map<std::string, std::string> names = {
      {"loss", "lm loss"}, {"num_zeros", "num-zeros"}, {"grad_norm", "grad-norm"}, {"lr", "learning-rate"}};
  const auto it = names.find(ours);
  return it == names.end() ? ours : it->second;
}

MegatronRules parse_megatron_rules(const std::string& name) {
  if (name == "current") return MegatronRules::current;
  if (name == "legacy") return MegatronRules::legacy;
  throw std::invalid_argument("--megatron-rules '" + name + "': expected current (Megatron-LM since its PR #6771, the "
                              "default) or legacy (the rules olmoref applied before it followed Megatron's current ones; "
                              "docs/formats/compare.md)");
}

const char* megatron_rules_name(MegatronRules r) { return r == MegatronRules::current ? "current" : "legacy"; }

LoadedTrace megatron_golden_values(const LoadedTrace& t, const MegatronGoldenOptions& o) {
  if (o.step_interval < 1) throw std::invalid_argument("--step-interval must be >= 1");
  if (o.start_step < 1) throw std::invalid_argument("--start-step must be >= 1");
  const auto all = t.steps();
  const int64_t iters = o.train_iters > 0 ? o.train_iters : (all.empty() ? 0 : all.back());
  if (iters < o.start_step)
    throw std::invalid_argument(t.path + ": no step in " + std::to_string(o.start_step) + ".." + std::to_string(iters));
  LoadedTrace g;
  g.path = t.path;
  g.format = "megatron";
  for (const std::string& name : o.metrics) {
    const std::string metric = canonical_metric(name);
    const auto it = t.metrics.find(metric);
    if (it == t.metrics.end() || it->second.empty() || std::isnan(it->second.begin()->second.value)) {
      std::string have;
      for (const auto& [m, series] : t.metrics)
        if (!series.empty() && !std::isnan(series.begin()->second.value))
          have += (have.empty() ? "" : ", ") + megatron_metric_name(m);
      throw std::invalid_argument(t.path + ": no numeric metric '" + name + "' to write (it has: " + have +
                                  (metric == "num_zeros" ? "; traces written before num_zeros was recorded lack it: "
                                                           "rerun, or pass --metrics \"lm loss\"" : "") + ")");
    }
    auto& out = g.metrics[metric];
    MegatronRange r;
    r.step_interval = o.step_interval;
    r.start_step = o.start_step;
    const bool legacy = o.rules == MegatronRules::legacy;
    for (int64_t k = o.start_step; k <= iters; ++k) {
      if (k != o.start_step && k % o.step_interval != 0) continue;
      const auto v = it->second.find(k);
      if (v == it->second.end()) {
        if (!legacy) continue;  // the current extractor keeps what the run logged
        r.end_step = k;
        out[k] = {std::numeric_limits<double>::quiet_NaN(), "nan"};  // the legacy extractor wrote "nan"
        continue;
      }
      r.end_step = k;
      // TensorBoard keeps a scalar as fp32 (integers above 2^24 too), Python widens it and rounds to 5 decimals.
      const double tb = static_cast<double>(static_cast<float>(v->second.value));
      out[k] = {python_round5(tb), std::isnan(tb) ? "nan" : ""};
    }
    if (out.empty())
      throw std::invalid_argument(t.path + ": metric '" + name + "' has no value at the sampled steps (" +
                                  std::to_string(o.start_step) + ", then multiples of " +
                                  std::to_string(o.step_interval) + " up to " + std::to_string(iters) +
                                  "); Megatron's extractor would leave it out: check --start-step and --step-interval");
    if (!legacy) {
      // Megatron infers the cadence from what it kept, ignoring the special start sample (PR #6771).
      r.start_step = out.begin()->first;
      int64_t gcd = 0, prev = -1, cadence_steps = 0;
      for (const auto& [k, v] : out) {
        if (k == o.start_step) continue;
        if (prev >= 0) gcd = std::gcd(gcd, k - prev);
        prev = k;
        ++cadence_steps;
      }
      r.step_interval = cadence_steps >= 2 ? gcd : o.step_interval;
    }
    g.megatron_ranges[metric] = r;
  }
  return g;
}

std::string to_megatron_json(const LoadedTrace& t, const MegatronGoldenOptions& o) {
  const LoadedTrace g = megatron_golden_values(t, o);
  std::string s = "{";
  bool first_metric = true;
  for (const std::string& name : o.metrics) {
    const std::string metric = canonical_metric(name);
    const MegatronRange& r = g.megatron_ranges.at(metric);
    s += first_metric ? "\n" : ",\n";
    first_metric = false;
    s += "    " + json(name).dump() + ": {\n        \"start_step\": " + std::to_string(r.start_step) +
         ",\n        \"end_step\": " + std::to_string(r.end_step) +
         ",\n        \"step_interval\": " + std::to_string(r.step_interval) + ",\n        \"values\": {";
    bool first = true;
    for (const auto& [step, v] : g.metrics.at(metric)) {  // std::map: integer order
      s += first ? "\n" : ",\n";
      first = false;
      // A NaN is written as the string "nan" like a missing step: strict JSON has no NaN, and Megatron's
      // comparison turns both into inf.
      s += "            \"" + std::to_string(step) + "\": " + (std::isnan(v.value) ? std::string("\"nan\"") : python_repr(v.value));
    }
    s += "\n        }\n    }";
  }
  s += "\n}\n";
  return s;
}

std::string to_steploss_text(const LoadedTrace& t) {
  const auto it = t.metrics.find("loss");
  if (it == t.metrics.end()) throw std::runtime_error(t.path + ": no loss metric to write");
  std::string s;
  char buf[64];
  for (const auto& [step, v] : it->second) {
    std::snprintf(buf, sizeof buf, "%lld %.17g\n", static_cast<long long>(step), v.value);  // exact round trip
    s += buf;
  }
  return s;
}

}  // namespace olmoref
