// golden/resume_compare.h — one comparison and one report for every resume audit: a run straight through against
// the same run stopped after step K and resumed in a fresh process. olmoref's own `resume-check` and the frameworks'
// `golden resume-audit` both judge with it, so "identical" and "the first difference" mean the same thing for both.
//
// Every compared value is exact (bit patterns where a trace carries them, digests as strings): a resume either
// changes nothing or it changed something, and the report names the first step where it did and what differed
// first there, in the order a user acts on: the state the resumed process loaded (parameters, then optimizer state),
// the batch the step consumed, its lr, and only then the step's own results (loss, grad norm, parameters after it),
// which with the same batch, lr and loaded state point at an RNG stream or state the checkpoint leaves out.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "interop/trace_formats.h"

namespace olmoref {

// Digests of a training state by part ("params", "optimizer", ...; a part a side lacks is not compared).
using StateDigests = std::map<std::string, std::string>;

struct ResumeAuditInput {
  LoadedTrace straight;   // steps 1..N, one process
  LoadedTrace resumed;    // steps 1..K from the run that stopped after K, K+1..N from the fresh process that resumed
  int64_t stop_after = 0;                    // K
  StateDigests straight_at_stop, loaded;     // the straight run's state after step K; the resumed process's after loading
  StateDigests final_straight, final_resumed;
};

struct ResumeStepRow {
  int64_t step = 0;
  bool present = true;  // the resumed trace has the step
  std::map<std::string, bool> same;  // per compared metric: identical
  double loss_a = 0, loss_b = 0;
};

struct ResumeFinding {
  bool identical = true;
  int64_t first_step = -1;        // the first step whose record differs (K for a difference in the loaded state)
  std::string first_what;         // "parameters as loaded", "optimizer state as loaded", "batch", "lr", "loss", ...
  std::string diagnosis;          // what it means, in a sentence
  std::vector<ResumeStepRow> rows;
  std::vector<std::string> metrics;  // the metrics compared, in priority order
};

// The metrics a resume audit compares, in the order a difference is named: the batch (data_digest), lr, loss,
// grad_norm, the parameters after the step (param_digest); each only where both traces carry it.
ResumeFinding compare_resume(const ResumeAuditInput& in);
// The table (one line per step) and the verdict's last line: "IDENTICAL: ..." or "DIFFERENT: first at step S: WHAT
// (DIAGNOSIS)". `who` names the trainer ("olmoref", "OLMo-core 3.0.0's Trainer", ...).
std::string format_resume_report(const ResumeAuditInput& in, const ResumeFinding& f, const std::string& who);

}  // namespace olmoref
