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
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

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
      {"learning-rate", "lr"}, {"learning rate", "lr"}, {"learning_rate", "lr"}};
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
      const int64_t step = j.at("step").get<int64_t>();
      if (first) t.format = j.contains("loss_hex") ? "olmoref" : "jsonl";
      first = false;
      for (const auto& [key, v] : j.items()) {
        if (key == "step") continue;
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

void read_megatron(LoadedTrace& t, const json& j) {
  t.format = "megatron";
  for (const auto& [name, m] : j.items()) {
    if (!m.is_object() || !m.contains("values")) continue;
    auto& series = t.metrics[canonical_metric(name)];
    const json& vals = m.at("values");
    try {
      if (vals.is_object()) {
        for (const auto& [step, v] : vals.items()) series[std::stoll(step)] = {number_of(v), ""};
      } else if (vals.is_array()) {  // older golden files: a list sampled from start_step every step_interval
        const int64_t start = m.value("start_step", int64_t{1}), every = m.value("step_interval", int64_t{1});
        for (size_t i = 0; i < vals.size(); ++i) series[start + static_cast<int64_t>(i) * every] = {number_of(vals[i]), ""};
      } else {
        throw std::runtime_error("\"values\" must be an object or a list");
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(t.path + ": Megatron metric '" + name + "': " + e.what());
    }
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
      if (series.empty() && lineno == 1) continue;  // a header line ("step loss")
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
  read_steploss(t, text);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Writers
// ---------------------------------------------------------------------------------------------

std::string to_megatron_json(const LoadedTrace& t, int64_t step_interval) {
  if (step_interval < 1) throw std::invalid_argument("step interval must be >= 1");
  json out = json::object();
  for (const auto& [name, series] : t.metrics) {
    if (series.empty() || std::isnan(series.begin()->second.value)) continue;  // digests are not numbers
    const std::string key = name == "loss" ? "lm loss" : name == "grad_norm" ? "grad-norm" : name;
    const int64_t start = series.begin()->first, end = series.rbegin()->first;
    json values = json::object();
    for (const auto& [step, v] : series)
      if ((step - start) % step_interval == 0) values[std::to_string(step)] = v.value;
    out[key] = {{"start_step", start}, {"end_step", end}, {"step_interval", step_interval}, {"values", values}};
  }
  return out.dump(2) + "\n";
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
