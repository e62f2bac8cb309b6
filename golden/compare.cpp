#include "golden/compare.h"

#include <algorithm>
#include <cctype>
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
#include <toml++/toml.h>

namespace olmoref {

namespace {

using nlohmann::json;
std::string fmt_num(double v) {
  if (std::isnan(v)) return "nan";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string fmt_short(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

bool identical(const MetricValue& a, const MetricValue& b) { return identical_values(a, b); }

std::string check_text(const MetricRule& r) {
  switch (r.check) {
    case MetricRule::Check::exact: return "exact";
    case MetricRule::Check::report: return "report";
    case MetricRule::Check::close: return "close rtol=" + fmt_short(r.rtol) + " atol=" + fmt_short(r.atol);
    case MetricRule::Check::at_most: return "at_most " + fmt_short(r.limit);
  }
  return "?";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------------------------

namespace {

MetricRule rule_from_fields(const std::string& metric, const std::map<std::string, json>& fields,
                            const std::string& origin) {
  MetricRule r;
  r.name = metric;
  r.metric = canonical_metric(metric);
  auto bad = [&](const std::string& key, const std::string& why) -> std::invalid_argument {
    return std::invalid_argument(origin + ": rule for '" + metric + "', key '" + key + "': " + why);
  };
  bool has_check = false, has_tol = false, has_limit = false;
  for (const auto& [key, v] : fields) {
    if (key == "metric") {
      if (!v.is_string() || v.get<std::string>().empty()) throw bad(key, "must be a metric name");
      r.metric = canonical_metric(v.get<std::string>());
    } else if (key == "check") {
      if (!v.is_string()) throw bad(key, "must be \"exact\", \"close\", \"at_most\" or \"report\"");
      const std::string c = v.get<std::string>();
      if (c == "exact") r.check = MetricRule::Check::exact;
      else if (c == "close") r.check = MetricRule::Check::close;
      else if (c == "at_most") r.check = MetricRule::Check::at_most;
      else if (c == "report") r.check = MetricRule::Check::report;
      else throw bad(key, "must be \"exact\", \"close\", \"at_most\" or \"report\" (got \"" + c + "\")");
      has_check = true;
    } else if (key == "limit") {
      if (!v.is_number() || v.get<double>() < 0) throw bad(key, "must be a number >= 0");
      r.limit = v.get<double>();
      has_limit = true;
    } else if (key == "rtol" || key == "atol") {
      if (!v.is_number() || v.get<double>() < 0) throw bad(key, "must be a number >= 0");
      (key == "rtol" ? r.rtol : r.atol) = v.get<double>();
      has_tol = true;
    } else if (key == "max_failing_steps") {
      if (v.is_string() && v.get<std::string>() == "megatron") r.max_failing_steps = -1;
      else if (v.is_number_integer() && v.get<int64_t>() >= 0) r.max_failing_steps = v.get<int64_t>();
      else throw bad(key, "must be an integer >= 0 or \"megatron\" (max(1, min(steps/100, 50)))");
    } else if (key == "first_step" || key == "last_step" || key == "min_steps") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) throw bad(key, "must be an integer >= 0");
      (key == "first_step" ? r.first_step : key == "last_step" ? r.last_step : r.min_steps) = v.get<int64_t>();
    } else if (key == "required") {
      if (!v.is_boolean()) throw bad(key, "must be true or false");
      r.required = v.get<bool>();
    } else {
      throw bad(key, "unknown key (known: metric, check, rtol, atol, limit, max_failing_steps, first_step, "
                     "last_step, min_steps, required)");
    }
  }
  if (!has_check && has_tol) r.check = MetricRule::Check::close;
  if (r.check == MetricRule::Check::exact && has_tol) throw bad("check", "\"exact\" takes no rtol/atol; use \"close\"");
  if ((r.check == MetricRule::Check::at_most) != has_limit)
    throw bad(has_limit ? "limit" : "check", "\"at_most\" and limit go together (B's value must be <= limit)");
  if (r.check == MetricRule::Check::at_most && has_tol) throw bad("check", "\"at_most\" takes a limit, not rtol/atol");
  if (r.last_step > 0 && r.first_step > r.last_step) throw bad("last_step", "must be >= first_step");
  return r;
}

json toml_to_json(const toml::node& n) {
  if (auto v = n.as_string()) return v->get();
  if (auto v = n.as_integer()) return v->get();
  if (auto v = n.as_floating_point()) return v->get();
  if (auto v = n.as_boolean()) return v->get();
  return nullptr;
}

}  // namespace

CompareRules parse_rules(const std::string& text, const std::string& origin) {
  CompareRules out;
  out.description = origin;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw std::invalid_argument(origin + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) throw std::invalid_argument(origin + ": must be a JSON object of metric -> rule");
    for (const auto& [metric, rule] : j.items()) {
      if (!rule.is_object()) throw std::invalid_argument(origin + ": rule for '" + metric + "' must be an object");
      std::map<std::string, json> fields;
      for (const auto& [k, v] : rule.items()) fields[k] = v;
      out.rules.push_back(rule_from_fields(metric, fields, origin));
    }
  } else {
    toml::table root;
    try {
      root = toml::parse(text, origin);
    } catch (const toml::parse_error& e) {
      std::ostringstream msg;
      msg << origin << ": TOML syntax error at line " << e.source().begin.line << ": " << e.description();
      throw std::invalid_argument(msg.str());
    }
    // Rules in file order (toml++ tables are sorted by key).
    std::vector<std::pair<uint32_t, std::string>> order;
    for (const auto& [k, v] : root) {
      if (!v.is_table())
        throw std::invalid_argument(origin + ": top-level key '" + std::string(k.str()) +
                                    "' must be a table: [metric] with check/rtol/atol/...");
      order.emplace_back(v.source().begin.line, std::string(k.str()));
    }
    std::sort(order.begin(), order.end());
    for (const auto& [line, metric] : order) {
      std::map<std::string, json> fields;
      for (const auto& [k, v] : *root[metric].as_table()) {
        const json jv = toml_to_json(v);
        if (jv.is_null())
          throw std::invalid_argument(origin + ": rule for '" + metric + "', key '" + std::string(k.str()) +
                                      "': must be a string, number or boolean");
        fields[std::string(k.str())] = jv;
      }
      out.rules.push_back(rule_from_fields(metric, fields, origin));
    }
  }
  if (out.rules.empty()) throw std::invalid_argument(origin + ": no rules (add a table per metric, e.g. [loss])");
  std::set<std::string> seen;
  for (const auto& r : out.rules)
    if (!seen.insert(r.name).second) throw std::invalid_argument(origin + ": two rules named '" + r.name + "'");
  return out;
}

CompareRules load_rules(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(path + ": cannot open rules file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_rules(ss.str(), path);
}

CompareRules default_rules(const LoadedTrace& a, const LoadedTrace& b) {
  CompareRules out;
  if (a.format == "olmoref" && b.format == "olmoref") {
    out.description =
        "default for two olmoref traces: exact bits on loss, grad_norm, lr, data_digest, param_digest; num_zeros "
        "and (mixture of experts) routing_digest exact where both traces record them";
    for (const char* m : {"loss", "grad_norm", "lr", "num_zeros", "data_digest", "param_digest", "routing_digest"}) {
      MetricRule r;
      r.name = r.metric = m;
      // Older traces do not carry num_zeros, dense ones no routing_digest.
      r.required = std::string(m) != "num_zeros" && std::string(m) != "routing_digest";
      out.rules.push_back(r);
    }
  } else {
    MetricRule r;
    r.name = r.metric = "loss";
    r.check = MetricRule::Check::close;
    r.rtol = 1e-5;
    // A console log prints the loss rounded (TorchTitan: 4 decimals): allow half a unit of its last digit.
    int decimals = -1;
    for (const LoadedTrace* t : {&a, &b}) {
      const auto d = t->decimals.find("loss");
      if (d != t->decimals.end() && (decimals < 0 || d->second < decimals)) decimals = d->second;
    }
    if (decimals >= 0) r.atol = 0.5 * std::pow(10.0, -decimals) * (1 + 1e-9);
    out.description = "default across formats: loss close, rtol 1e-5" +
                      (decimals >= 0 ? " + atol " + fmt_short(r.atol) + " (a log printed it with " +
                                           std::to_string(decimals) + " decimals)"
                                     : std::string()) +
                      " (pass --rules FILE for others)";
    out.rules.push_back(r);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

namespace {

// at_most: a quantity only B records (a replay's own error against a reference it was handed), judged at every step
// A has: B must hold it there and it must not exceed the limit. Its first step over the limit counts as the first
// difference.
bool judge_at_most(const LoadedTrace& a, const LoadedTrace& b, const MetricRule& rule, MetricResult& m) {
  const auto ib = b.metrics.find(rule.metric);
  if (ib == b.metrics.end()) {
    m.present = false;
    m.pass = !rule.required;
    m.note = std::string("missing in B") + (rule.required ? "" : " (not required)");
    return m.pass;
  }
  m.numeric = true;
  for (int64_t step : a.steps()) {
    if (rule.first_step > 0 && step < rule.first_step) continue;
    if (rule.last_step > 0 && step > rule.last_step) continue;
    ++m.compared;
    const auto jb = ib->second.find(step);
    bool fail;
    if (jb == ib->second.end()) {
      ++m.missing_in_b;
      fail = true;
    } else {
      const double v = jb->second.value;
      fail = !(v <= rule.limit);  // NaN fails
      if (v > m.max_abs || std::isnan(v)) {
        m.max_abs = std::isnan(v) ? std::numeric_limits<double>::infinity() : v;
        m.max_rel_step = step;
      }
    }
    if (fail) {
      ++m.failing;
      if (m.first_failing_step < 0) m.first_failing_step = step;
      if (m.first_differing_step < 0) m.first_differing_step = step;
    }
  }
  m.allowed = rule.max_failing_steps >= 0 ? rule.max_failing_steps
                                          : std::max<int64_t>(1, std::min<int64_t>(m.compared / 100, 50));
  m.pass = m.failing <= m.allowed && m.compared >= rule.min_steps;
  if (m.compared < rule.min_steps)
    m.note = "only " + std::to_string(m.compared) + " steps compared, rule needs " + std::to_string(rule.min_steps);
  return m.pass;
}

}  // namespace

bool identical_values(const MetricValue& a, const MetricValue& b) {
  if (!a.exact.empty() && !b.exact.empty()) return a.exact == b.exact;
  if (std::isnan(a.value) && std::isnan(b.value)) return a.exact == b.exact;
  return a.value == b.value;
}

CompareResult compare_traces(const LoadedTrace& a, const LoadedTrace& b, const CompareRules& rules) {
  CompareResult res;
  {
    const auto sa = a.steps();
    const std::set<int64_t> in_a(sa.begin(), sa.end());
    for (int64_t s : b.steps()) res.steps_only_in_b += in_a.count(s) ? 0 : 1;
  }
  for (const MetricRule& rule : rules.rules) {
    MetricResult m;
    m.rule = rule;
    const auto ia = a.metrics.find(rule.metric), ib = b.metrics.find(rule.metric);
    if (rule.check == MetricRule::Check::at_most) {
      const bool held = judge_at_most(a, b, rule, m);
      res.pass = res.pass && held;
      if (m.first_differing_step >= 0 &&
          (res.first_differing_step < 0 || m.first_differing_step < res.first_differing_step))
        res.first_differing_step = m.first_differing_step;
      res.metrics.push_back(m);
      continue;
    }
    if (ia == a.metrics.end() || ib == b.metrics.end()) {
      m.present = false;
      m.pass = !rule.required;
      m.note = std::string("missing in ") + (ia == a.metrics.end() ? "A" : "") +
               (ia == a.metrics.end() && ib == b.metrics.end() ? " and " : "") + (ib == b.metrics.end() ? "B" : "") +
               (rule.required ? "" : " (not required)");
      res.pass = res.pass && m.pass;
      res.metrics.push_back(m);
      continue;
    }
    const auto& A = ia->second;
    const auto& B = ib->second;
    for (const auto& [step, va] : A) {
      if (rule.first_step > 0 && step < rule.first_step) continue;
      if (rule.last_step > 0 && step > rule.last_step) continue;
      ++m.compared;
      const auto jb = B.find(step);
      bool fail = false;
      if (jb == B.end()) {
        ++m.missing_in_b;
        fail = rule.check != MetricRule::Check::report;
        if (m.first_differing_step < 0) m.first_differing_step = step;
      } else {
        const MetricValue& vb = jb->second;
        const bool same = identical(va, vb);
        if (!same && m.first_differing_step < 0) m.first_differing_step = step;
        const bool numeric = !std::isnan(va.value) || !std::isnan(vb.value);
        double abs_d = 0, rel_d = 0;
        if (numeric) {
          m.numeric = true;
          abs_d = std::abs(vb.value - va.value);
          if (std::isnan(abs_d)) abs_d = same ? 0 : std::numeric_limits<double>::infinity();
          rel_d = abs_d == 0 ? 0 : (va.value != 0 ? abs_d / std::abs(va.value) : std::numeric_limits<double>::infinity());
          if (abs_d > m.max_abs) m.max_abs = abs_d;
          if (rel_d > m.max_rel) {
            m.max_rel = rel_d;
            m.max_rel_step = step;
          }
        }
        switch (rule.check) {
          case MetricRule::Check::exact: fail = !same; break;
          case MetricRule::Check::close:
            fail = numeric ? !(same || abs_d <= rule.atol + rule.rtol * std::abs(va.value)) : !same;
            break;
          case MetricRule::Check::report: fail = false; break;
        }
      }
      if (fail) {
        ++m.failing;
        if (m.first_failing_step < 0) m.first_failing_step = step;
      }
    }
    // A metric B has at a step where A lacks it is as much a difference as the other way round, except against
    // Megatron golden values: they hold a sample of the steps, and Megatron compares at those alone.
    for (const auto& [step, vb] : a.format == "megatron" ? decltype(B){} : B) {
      if (rule.first_step > 0 && step < rule.first_step) continue;
      if (rule.last_step > 0 && step > rule.last_step) continue;
      if (A.count(step)) continue;
      ++m.compared;
      ++m.missing_in_a;
      if (m.first_differing_step < 0 || step < m.first_differing_step) m.first_differing_step = step;
      if (rule.check != MetricRule::Check::report) {
        ++m.failing;
        if (m.first_failing_step < 0 || step < m.first_failing_step) m.first_failing_step = step;
      }
    }
    m.allowed = rule.max_failing_steps >= 0 ? rule.max_failing_steps
                                            : std::max<int64_t>(1, std::min<int64_t>(m.compared / 100, 50));
    if (rule.check == MetricRule::Check::report) {
      m.pass = true;
    } else {
      m.pass = m.failing <= m.allowed && m.compared >= rule.min_steps;
      if (m.compared < rule.min_steps)
        m.note = "only " + std::to_string(m.compared) + " steps compared, rule needs " + std::to_string(rule.min_steps);
    }
    if (m.first_differing_step >= 0 &&
        (res.first_differing_step < 0 || m.first_differing_step < res.first_differing_step))
      res.first_differing_step = m.first_differing_step;
    res.pass = res.pass && m.pass;
    res.metrics.push_back(m);
  }
  return res;
}

std::string format_compare_report(const LoadedTrace& a, const LoadedTrace& b, const CompareRules& rules,
                                  const CompareResult& r) {
  std::ostringstream o;
  o << "A: " << a.describe() << "\n";
  o << "B: " << b.describe() << "\n";
  o << "rules: " << rules.description << "\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-16s %-28s %6s %9s %10s %10s %8s %10s  %s\n", "rule", "check", "steps",
                "failing", "max |d|", "max rel", "at step", "first diff", "result");
  o << line;
  for (const auto& m : r.metrics) {
    const std::string failing = std::to_string(m.failing) + "/" + std::to_string(m.allowed);
    const std::string fd = m.first_differing_step < 0 ? "-" : std::to_string(m.first_differing_step);
    const bool bound = m.rule.check == MetricRule::Check::at_most;  // "max |d|" is B's largest value, at its step
    const std::string at =
        m.max_rel_step < 0 || (m.max_rel == 0 && !bound) ? "-" : std::to_string(m.max_rel_step);
    std::string result = m.pass ? "ok" : "FAIL";
    if (m.rule.check == MetricRule::Check::report) result = "(report)";
    if (!m.note.empty()) result += " (" + m.note + ")";
    const std::string label = m.rule.name;
    std::snprintf(line, sizeof line, "%-16s %-28s %6lld %9s %10s %10s %8s %10s  %s\n", label.c_str(),
                  check_text(m.rule).c_str(), static_cast<long long>(m.compared), failing.c_str(),
                  m.numeric ? fmt_short(m.max_abs).c_str() : "-", m.numeric && !bound ? fmt_short(m.max_rel).c_str() : "-",
                  at.c_str(), fd.c_str(), result.c_str());
    o << line;
  }
  o << "\n";
  if (r.first_differing_step < 0) {
    o << "first differing step: none (every compared value is identical)\n";
  } else {
    const int64_t s = r.first_differing_step;
    o << "first differing step: " << s << "\n";
    std::set<std::string> shown;
    for (const auto& m : r.metrics) {
      if (!m.present || !shown.insert(m.rule.metric).second) continue;
      auto show = [&](const LoadedTrace& t) -> std::string {
        const auto& series = t.metrics.at(m.rule.metric);
        const auto it = series.find(s);
        if (it == series.end()) return "(missing)";
        const MetricValue& v = it->second;
        if (std::isnan(v.value) && !v.exact.empty()) return v.exact;
        return fmt_num(v.value) + (v.exact.empty() ? "" : " [" + v.exact + "]");
      };
      if (m.rule.check == MetricRule::Check::at_most) {  // B's own quantity: its value against the limit
        std::snprintf(line, sizeof line, "  %-16s limit %-32s B %s%s\n", m.rule.metric.c_str(),
                      fmt_short(m.rule.limit).c_str(), show(b).c_str(), m.first_failing_step == s ? "   <- over" : "");
        o << line;
        continue;
      }
      const std::string va = show(a), vb = show(b);
      const auto& sa = a.metrics.at(m.rule.metric);
      const auto& sb = b.metrics.at(m.rule.metric);
      const auto pa = sa.find(s), pb = sb.find(s);
      const bool same = pa != sa.end() && pb != sb.end() && identical(pa->second, pb->second);
      std::snprintf(line, sizeof line, "  %-16s A %-36s B %s%s\n", m.rule.metric.c_str(), va.c_str(), vb.c_str(),
                    same ? "" : "   <- differs");
      o << line;
    }
  }
  // Mixture of experts: where the routing itself first differed, so a drifting loss can be told from a different
  // choice of experts (the loss follows the routing, not the other way round).
  for (const auto& m : r.metrics)
    if (m.present && m.rule.metric == "routing_digest") {
      if (m.first_differing_step < 0)
        o << "routing: identical at every compared step (routing_digest)\n";
      else
        o << "routing: first differs at step " << m.first_differing_step
          << " (routing_digest: some token chose other experts there)\n";
      break;
    }
  if (r.steps_only_in_b > 0)
    o << "(" << r.steps_only_in_b
      << (a.format == "megatron" ? " step(s) of B are not among A's golden-value steps: not compared, as in Megatron)\n"
                                 : " step(s) of B are not in A: every rule covering them counts them as failing)\n");
  if (r.pass) {
    o << "PASS: every rule holds";
  } else {
    o << "FAIL:";
    bool firstm = true;
    for (const auto& m : r.metrics) {
      if (m.pass) continue;
      o << (firstm ? " " : "; ") << m.rule.name << " ";
      if (!m.present) o << m.note;
      else if (m.failing > m.allowed)
        o << m.failing << " of " << m.compared << " steps break '" << check_text(m.rule) << "' (allowed "
          << m.allowed << "), first at step " << m.first_failing_step;
      else o << m.note;
      firstm = false;
    }
  }
  o << "\n";
  return o.str();
}

// ---------------------------------------------------------------------------------------------
// Megatron's pipeline
// ---------------------------------------------------------------------------------------------

namespace {

// CHECK_THRESHOLDS of Megatron-LM's tests/functional_tests/python_test_utils/test_pretraining_regular_pipeline.py
// since its PR #4238: whether a metric has an exact check, and its approximate check's rtol (atol 0 throughout).
struct MegatronThreshold {
  const char* name;
  bool deterministic;
  double rtol;
};
constexpr MegatronThreshold kMegatronThresholds[] = {
    {"iteration-time", false, 0.05}, {"mem-allocated-bytes", false, 0.05}, {"mem-max-allocated-bytes", false, 0.05},
    {"lm loss", true, 0.05},         {"mtp_1 loss", true, 0.05},          {"mtp_2 loss", true, 0.05},
    {"num-zeros", true, 0.20},       {"generated_tokens", true, 0.05},    {"logprobs", true, 0.05},
    {"total loss", true, 0.05}};

}  // namespace

std::vector<MegatronCheck> megatron_default_checks(const std::vector<std::string>& metrics, MegatronRules rules) {
  std::vector<MegatronCheck> out;
  for (const std::string& m : metrics) {
    if (rules == MegatronRules::legacy) {
      out.push_back({m, true, 0, 0});
      out.push_back({m, false, 0.05, 0});
      continue;
    }
    const std::string name = megatron_metric_name(canonical_metric(m));
    const MegatronThreshold* t = nullptr;
    std::string known;
    for (const MegatronThreshold& k : kMegatronThresholds) {
      if (name == k.name) t = &k;
      known += (known.empty() ? "" : ", ") + std::string(k.name);
    }
    if (!t)
      throw std::invalid_argument(
          "--metrics: Megatron's functional tests have no threshold for '" + m + "' (their CHECK_THRESHOLDS has " +
          known + "); check it under rules of your own with --rules FILE (docs/formats/compare.md), or give "
          "--megatron-rules legacy for olmoref's former [exact, approximate rtol 0.05] on any metric");
    if (t->deterministic) out.push_back({m, true, 0, 0});
    out.push_back({m, false, t->rtol, 0});
  }
  return out;
}

namespace {

// np.isclose(a, g, rtol, atol) with equal_nan=False: |a - g| <= atol + rtol·|g|; inf is close only to the same inf.
bool np_isclose(double a, double g, double rtol, double atol) {
  if (std::isnan(a) || std::isnan(g)) return false;
  if (std::isinf(a) || std::isinf(g)) return a == g;
  return std::abs(a - g) <= atol + rtol * std::abs(g);
}

// Megatron's reading of a golden value: a string ("nan") is inf, a number is itself (a NaN stays NaN).
double megatron_number(const MetricValue& v) {
  return v.exact.empty() ? v.value : std::numeric_limits<double>::infinity();
}

// np.median: NaN if any value is NaN, else the middle value (the mean of the two middle ones).
double np_median(std::vector<double> v) {
  for (double x : v)
    if (std::isnan(x)) return x;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Megatron's iteration-time comparison (since its PRs #5010, #5023, #6771): one value each side, the medians over the
// steady window of the golden file's finite steps. Returns the steps used (empty: none; `why` says so).
std::vector<int64_t> iteration_time_steps(const std::map<int64_t, MetricValue>& golden, std::string& why) {
  std::vector<int64_t> finite;
  for (const auto& [step, v] : golden)
    if (v.exact.empty() && std::isfinite(v.value)) finite.push_back(step);
  if (finite.empty()) {
    why = "Metric iteration-time has no finite values.";
    return {};
  }
  const bool short_run = finite.back() <= 25;
  const int64_t lo = short_run ? 5 : 30, hi = short_run ? 21 : 46;  // Python's range(lo, hi)
  std::vector<int64_t> steps;
  for (int64_t s : finite)
    if (s >= lo && s < hi) steps.push_back(s);
  if (steps.empty())
    for (int64_t s : finite)
      if (s >= lo && steps.size() < 4) steps.push_back(s);
  if (steps.empty()) why = "Metric iteration-time has no finite values after its warmup window.";
  return steps;
}

}  // namespace

MegatronPipelineResult megatron_pipeline(const LoadedTrace& golden, const LoadedTrace& actual,
                                         const std::vector<MegatronCheck>& checks, bool compare_approximate_results,
                                         MegatronRules rules) {
  MegatronPipelineResult out;
  out.rules = rules;
  const bool current = rules == MegatronRules::current;
  for (const MegatronCheck& c : checks) {
    MegatronCheckResult r;
    r.check = c;
    const std::string kind = c.deterministic ? "DETERMINISTIC" : "APPROXIMATE";
    const std::string metric = canonical_metric(c.metric);
    const std::string failed =
        std::string(c.deterministic ? "Exact" : "Approximate") + " comparison of " + c.metric + ": FAILED";
    if (c.deterministic && compare_approximate_results) {
      r.skipped = r.pass = true;
      r.message = kind + " test for metric " + c.metric + ": SKIPPED (approximate results only)";
      out.checks.push_back(r);
      continue;
    }
    const auto g = golden.metrics.find(metric);
    const auto a = actual.metrics.find(metric);
    if (g == golden.metrics.end() || a == actual.metrics.end()) {
      r.message = g == golden.metrics.end()
                      ? "Metric " + c.metric + " is required but not provided in golden values"
                      : "Metric " + c.metric + " not found in the actual values (Megatron: not in the Tensorboard logs)";
      out.pass = false;
      out.checks.push_back(r);
      continue;
    }
    if (current && g->second.empty()) {
      r.message = "Metric " + c.metric + " has no values in the golden file.";
      out.pass = false;
      out.checks.push_back(r);
      continue;
    }
    // The actual value at a golden step: now "nan" (inf) where the run did not log it; before, a failure.
    auto actual_at = [&](int64_t step, bool& missing) {
      const auto av = a->second.find(step);
      missing = av == a->second.end();
      return missing ? std::numeric_limits<double>::infinity() : megatron_number(av->second);
    };
    if (current && megatron_metric_name(metric) == "iteration-time") {
      std::string why;
      const std::vector<int64_t> steps = iteration_time_steps(g->second, why);
      if (steps.empty()) {
        r.message = why;
        out.pass = false;
        out.checks.push_back(r);
        continue;
      }
      std::vector<double> gv, av;
      for (int64_t s : steps) {
        bool missing = false;
        gv.push_back(megatron_number(g->second.at(s)));
        av.push_back(actual_at(s, missing));
        r.missing += missing;
      }
      const double gm = np_median(gv), am = np_median(av);
      r.steps = 1;
      r.pass = np_isclose(am, gm, c.rtol, c.atol);
      r.failing = r.pass ? 0 : 1;
      if (!r.pass) r.first_failing_step = steps.front();
      r.note = "medians of steps " + std::to_string(steps.front()) + ".." + std::to_string(steps.back()) + " (" +
               std::to_string(steps.size()) + " values): golden " + fmt_num(gm) + ", actual " + fmt_num(am);
      r.message = r.pass ? kind + " test for metric " + c.metric + ": PASSED" : failed;
      out.pass = out.pass && r.pass;
      out.checks.push_back(r);
      continue;
    }
    for (const auto& [step, gv] : g->second) {
      ++r.steps;
      bool missing = false;
      const double av = actual_at(step, missing);
      r.missing += missing;
      const bool close = (!missing || current) && np_isclose(av, megatron_number(gv), c.rtol, c.atol);
      if (!close) {
        ++r.failing;
        if (r.first_failing_step < 0) r.first_failing_step = step;
      }
    }
    double total = static_cast<double>(r.steps);
    if (!current) {
      const auto range = golden.megatron_ranges.find(metric);
      const MegatronRange mr = range != golden.megatron_ranges.end() ? range->second : MegatronRange{};
      total = static_cast<double>(mr.end_step - mr.start_step) / static_cast<double>(mr.step_interval) + 1;
    }
    if (c.deterministic || total == 1.0 || r.steps == 0) {
      r.allowed = 0;
      r.pass = r.failing == 0 && r.steps > 0;
    } else {
      r.allowed = std::min(std::max(std::floor(total / 100), 1.0), 50.0);
      const double close_fraction = static_cast<double>(r.steps - r.failing) / static_cast<double>(r.steps);
      r.pass = close_fraction >= 1 - r.allowed / total;
    }
    r.message = r.pass ? kind + " test for metric " + c.metric + ": PASSED" : failed;
    out.pass = out.pass && r.pass;
    out.checks.push_back(r);
  }
  return out;
}

std::string format_megatron_report(const LoadedTrace& golden, const LoadedTrace& actual,
                                   const MegatronPipelineResult& r) {
  std::ostringstream o;
  o << "golden: " << golden.describe() << "\n";
  o << "actual: " << actual.describe() << "\n";
  o << "comparison: Megatron-LM's functional-test pipeline (np.isclose at the golden steps; \"nan\" = inf)\n";
  o << "rules: " << megatron_rules_name(r.rules)
    << (r.rules == MegatronRules::current
            ? " (Megatron-LM since its PR #6771: failing steps allowed per golden value; num-zeros approximate rtol 0.20)"
            : " (olmoref's former rules: failing steps allowed per (end_step - start_step) / step_interval + 1; "
              "approximate rtol 0.05 for every metric)")
    << "\n\n";
  for (const auto& c : r.checks) {
    o << c.message;
    if (!c.skipped && c.steps > 0) {
      o << "  [" << (c.check.deterministic ? "rtol 0 atol 0" : "rtol " + fmt_short(c.check.rtol) + " atol " +
                                                                  fmt_short(c.check.atol))
        << "; " << c.failing << " of " << c.steps << " steps not close";
      if (!c.check.deterministic) o << ", " << fmt_short(c.allowed) << " allowed";
      if (c.missing) o << ", " << c.missing << " missing";
      o << "]";
      if (!c.note.empty()) o << "\n    " << c.note;
      if (c.first_failing_step >= 0) {
        const std::string metric = canonical_metric(c.check.metric);
        auto show = [&](const LoadedTrace& t) -> std::string {
          const auto& series = t.metrics.at(metric);
          const auto it = series.find(c.first_failing_step);
          if (it == series.end()) return "(missing)";
          return it->second.exact.empty() ? fmt_num(it->second.value) : "\"" + it->second.exact + "\"";
        };
        o << "\n    first at step " << c.first_failing_step << ": golden " << show(golden) << ", actual "
          << show(actual);
      }
    }
    o << "\n";
  }
  o << (r.pass ? "PASS: every Megatron check holds" : "FAIL: a Megatron check failed") << "\n";
  return o.str();
}

}  // namespace olmoref
