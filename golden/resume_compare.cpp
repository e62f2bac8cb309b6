#include "golden/resume_compare.h"

#include <cstdio>
#include <set>
#include <type_traits>
#include <sstream>

#include "golden/compare.h"

namespace olmoref {

namespace {

// In the order a difference is named at one step: what went into the step before what came out of it.
constexpr const char* kOrder[] = {"data_digest", "lr", "loss", "grad_norm", "param_digest"};

std::string what_of(const std::string& metric) {
  if (metric == "data_digest") return "batch";
  if (metric == "param_digest") return "parameters after the step";
  return metric;
}

// The first part (in `parts` order, then any other) whose digest differs where both sides have it; "" if none.
std::string first_differing_part(const StateDigests& a, const StateDigests& b) {
  for (const char* part : {"params", "optimizer"}) {
    const auto ia = a.find(part), ib = b.find(part);
    if (ia != a.end() && ib != b.end() && ia->second != ib->second) return part;
  }
  for (const auto& [part, d] : a) {
    const auto ib = b.find(part);
    if (ib != b.end() && ib->second != d) return part;
  }
  return "";
}

std::string diagnosis_of(const std::string& what, int64_t step, int64_t k) {
  if (step <= k)
    return "before the stop: the run that stopped differs from the straight one without any resume, so the trainer "
           "is not deterministic from run to run here (fix that first: no resume can then be judged)";
  if (what == "parameters as loaded")
    return "the resumed process did not load the parameters the stopped run saved";
  if (what == "optimizer state as loaded")
    return "the resumed process's optimizer state differs from the straight run's after step " + std::to_string(k) +
           " (moments or step count not restored)";
  if (what == "batch")
    return "the resumed run consumed another batch: the data loader's position or order was not restored";
  if (what == "lr") return "the resumed run stepped with another lr: the LR schedule's position was not restored";
  if (what == "final state") return "every step's record agrees but the final state does not";
  return "with the same batch and lr, and the loaded state as far as the audit sees it, the step computed something "
         "else: an RNG stream or other state not restored (or one the checkpoint leaves out)";
}

}  // namespace

ResumeFinding compare_resume(const ResumeAuditInput& in) {
  ResumeFinding f;
  for (const char* m : kOrder)
    if (in.straight.metrics.count(m) && in.resumed.metrics.count(m)) f.metrics.push_back(m);
  const int64_t k = in.stop_after;
  // Step by step: the first step whose record differs, and the first metric (in kOrder) that differs there.
  int64_t first = -1;
  std::string first_metric;
  for (int64_t step : in.straight.steps()) {
    ResumeStepRow row;
    row.step = step;
    bool differs = false;
    std::string which;
    for (const std::string& m : f.metrics) {
      const auto& sa = in.straight.metrics.at(m);
      const auto& sb = in.resumed.metrics.at(m);
      const auto pa = sa.find(step), pb = sb.find(step);
      if (pa == sa.end()) continue;
      if (pb == sb.end()) {
        row.present = false;
        row.same[m] = false;
      } else {
        row.same[m] = identical_values(pa->second, pb->second);
        if (m == "loss") row.loss_a = pa->second.value, row.loss_b = pb->second.value;
      }
      if (!row.same[m] && !differs) differs = true, which = m;
    }
    if (differs && first < 0) first = step, first_metric = row.present ? which : "missing step";
    f.rows.push_back(row);
  }
  // A resumed trace with steps the straight one lacks is another run.
  const std::vector<int64_t> straight_steps = in.straight.steps();
  const std::set<int64_t> known(straight_steps.begin(), straight_steps.end());
  for (int64_t step : in.resumed.steps())
    if (!known.count(step) && (first < 0 || step < first)) first = step, first_metric = "extra step";

  const std::string loaded = first_differing_part(in.straight_at_stop, in.loaded);
  const std::string final_part = first_differing_part(in.final_straight, in.final_resumed);
  if (first >= 0 && first <= k) {
    f.first_step = first;
    f.first_what = what_of(first_metric);
  } else if (!loaded.empty()) {
    // What the resumed process loaded comes before anything it computed from it.
    f.first_step = k;
    f.first_what = loaded == "params" ? "parameters as loaded"
                   : loaded == "optimizer" ? "optimizer state as loaded"
                                           : loaded + " as loaded";
  } else if (first >= 0) {
    f.first_step = first;
    f.first_what = what_of(first_metric);
  } else if (!final_part.empty()) {
    f.first_step = straight_steps.empty() ? 0 : straight_steps.back();
    f.first_what = "final state";
  }
  f.identical = f.first_step < 0;
  // A difference in the loaded state is reported at step K but belongs to the resume, not to the run before it.
  const bool at_load = f.first_what.find("as loaded") != std::string::npos;
  if (!f.identical) f.diagnosis = diagnosis_of(f.first_what, at_load ? k + 1 : f.first_step, k);
  return f;
}

std::string format_resume_report(const ResumeAuditInput& in, const ResumeFinding& f, const std::string& who) {
  std::ostringstream o;
  char line[256];
  o << who << ": straight through against stopped after step " << in.stop_after
    << " and resumed in a fresh process (every value exact)\n";
  std::snprintf(line, sizeof line, "  %4s  %-17s %-17s %11s", "step", "loss (straight)", "loss (resumed)", "delta");
  o << line;
  for (const std::string& m : f.metrics)
    if (m != "loss") o << "  " << (m == "data_digest" ? "batch" : m == "param_digest" ? "params" : m);
  o << "\n";
  for (const ResumeStepRow& r : f.rows) {
    if (!r.present) {
      std::snprintf(line, sizeof line, "  %4lld  missing in the resumed trace\n", static_cast<long long>(r.step));
      o << line;
      continue;
    }
    std::snprintf(line, sizeof line, "  %4lld  %-17.9g %-17.9g %11.3e", static_cast<long long>(r.step), r.loss_a,
                  r.loss_b, r.loss_b - r.loss_a);
    o << line;
    for (const std::string& m : f.metrics) {
      if (m == "loss") continue;
      const auto it = r.same.find(m);
      const std::string label = m == "data_digest" ? "batch" : m == "param_digest" ? "params" : m;
      std::snprintf(line, sizeof line, "  %*s", static_cast<int>(label.size()),
                    it == r.same.end() ? "-" : it->second ? "same" : "DIFF");
      o << line;
    }
    o << (r.step <= in.stop_after ? "   (before the stop)\n" : "\n");
  }
  auto states = [&](const char* title, const StateDigests& a, const StateDigests& b, const char* la, const char* lb) {
    if (a.empty() && b.empty()) return;
    const bool same = first_differing_part(a, b).empty();
    o << "  " << title << ": " << (same ? "identical" : "DIFFERENT") << "\n";
    std::set<std::string> parts;
    for (const auto& [p, d] : a) parts.insert(p);
    for (const auto& [p, d] : b) parts.insert(p);
    for (const std::string& p : parts) {
      const auto ia = a.find(p), ib = b.find(p);
      o << "    " << p << ": " << la << " " << (ia == a.end() ? "-" : ia->second) << ", " << lb << " "
        << (ib == b.end() ? "-" : ib->second) << "\n";
    }
  };
  states(("state after step " + std::to_string(in.stop_after)).c_str(), in.straight_at_stop, in.loaded, "straight",
         "loaded");
  states("final state", in.final_straight, in.final_resumed, "straight", "resumed");
  if (f.identical)
    o << "IDENTICAL: resuming changed nothing (every step bit for bit)\n";
  else
    o << "DIFFERENT: first at step " << f.first_step << ": " << f.first_what << " (" << f.diagnosis << ")\n";
  return o.str();
}

}  // namespace olmoref
