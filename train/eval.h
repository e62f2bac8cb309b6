// train/eval.h — the in-loop memorization backstop: a membership signal (holdout loss against a sealed fresh
// split) that catches leakage the data checks cannot see.
//
// Every eval.interval steps the current parameters are evaluated on a fixed subset of the holdout
// (data.holdout_*) and of a sealed fresh split of the same distribution that no mix the loader sees
// ever names (eval.fresh_*). If the loader leaked holdout data into training, the model memorizes
// it and the holdout loss falls below the fresh loss; a clean run shows no such gap. Reported per
// evaluation (one JSON line in OUT/eval.jsonl, docs/formats/leakcheck.md):
//   - mean cross-entropy per instance on both sets (nats per target; z-loss excluded), and Min-K%
//     (the mean of each instance's 20% highest per-token losses, arXiv:2310.16789);
//   - the holdout-minus-fresh gap with a percentile bootstrap confidence interval: the documents
//     touched by each subset are resampled with replacement within their set (a cluster bootstrap,
//     unpaired: the sets hold different documents; instances when no EOS id is known), the draws
//     from the counter-based RNG (core/rng.h, RngPurpose::bootstrap), so the report is a pure
//     function of the losses;
//   - flag = the whole interval lies below zero (holdout significantly below fresh at level alpha);
//   - per-document losses on the holdout subset, lowest first, so memorized documents stand out.
// A gap is evidence of leakage; no gap is not evidence of none (weak signal, fades with training).
//
// The evaluation has its own model instance (micro-batch 1) and buffers; it reads the parameters and
// never touches the loader, its RNG, or anything the next training step reads, so a run's trace is
// the same with and without it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/olmo3.h"
#include "train/config.h"

namespace olmoref {

class ThreadPool;
namespace data {
class FslDataset;
}

// A resampling unit of the bootstrap: the summed cross-entropy of its targets and their count.
struct LossUnit {
  double sum = 0.0;
  int64_t targets = 0;
};

struct EvalSetStats {
  int64_t instances = 0;
  int64_t targets = 0;
  double loss = 0.0;   // mean cross-entropy per target (= mean of the per-instance means)
  double min_k = 0.0;  // mean over instances of the mean of the 20% highest per-token losses
  std::string unit;    // "document" (EOS known) or "instance": what the bootstrap resamples
  std::vector<LossUnit> units;
};

struct EvalDocument {
  int64_t document = 0;  // ordinal in the holdout (EOS-delimited documents in mix order)
  std::string file;
  int64_t token_start = 0;
  int64_t targets = 0;   // targets of this document inside the evaluated instances
  double loss = 0.0;     // their mean cross-entropy
};

struct EvalResult {
  int64_t step = 0;
  EvalSetStats holdout, fresh;
  double gap = 0.0;            // holdout.loss - fresh.loss
  double ci_lo = 0.0, ci_hi = 0.0;
  double p_not_lower = 1.0;    // share of bootstrap gaps >= 0
  bool flagged = false;        // ci_hi < 0
  int64_t bootstrap = 0;
  double alpha = 0.0;
  std::vector<EvalDocument> documents;  // holdout documents, lowest loss first
  double seconds = 0.0;
};
nlohmann::json eval_result_json(const EvalResult& r);

// The percentile bootstrap of loss(a) - loss(b), loss = sum of unit sums / sum of unit targets:
// `resamples` times, each set's units are drawn with replacement (a cluster bootstrap when units are
// documents: the instances of one document are not independent, and which documents a finite
// sample holds is most of the difference between two samples of one distribution).
struct BootstrapCI {
  double lo = 0.0, hi = 0.0, p_not_lower = 1.0;
};
BootstrapCI bootstrap_gap(const std::vector<LossUnit>& a, const std::vector<LossUnit>& b, int64_t resamples,
                          double alpha, uint64_t seed);
// The same with one target per value: the gap of plain means.
BootstrapCI bootstrap_mean_gap(const std::vector<double>& a, const std::vector<double>& b, int64_t resamples,
                               double alpha, uint64_t seed);

// Whether the backstop evaluates after `step` (every rank can tell, without the evaluator).
inline bool eval_due(const EvalConfig& e, int64_t step) { return e.interval > 0 && step % e.interval == 0; }

class Evaluator {
 public:
  // Opens the holdout and fresh sets with the run's sequence length, vocabulary and dtype and picks
  // the evaluated subsets (eval.instances evenly spaced instances of each, in instance order).
  explicit Evaluator(const TrainConfig& cfg);
  ~Evaluator();

  bool due(int64_t step) const { return eval_due(cfg_.eval, step); }
  // params: the full fp32 master parameters.
  EvalResult run(const float* params, ThreadPool& pool, int64_t step);

  const std::vector<int64_t>& holdout_subset() const { return holdout_ids_; }
  const std::vector<int64_t>& fresh_subset() const { return fresh_ids_; }

 struct DocIndex;  // document boundaries of a set's files (eval.cpp)

 private:
  EvalSetStats evaluate(const data::FslDataset& ds, const DocIndex* doc_index, const std::vector<int64_t>& ids,
                        const float* params, ThreadPool& pool, std::vector<EvalDocument>* docs);

  TrainConfig cfg_;
  std::shared_ptr<const data::FslDataset> holdout_, fresh_;
  std::vector<int64_t> holdout_ids_, fresh_ids_;
  std::unique_ptr<DocIndex> holdout_docs_, fresh_docs_;
  Olmo3 model_;
  std::vector<float> grad_, logits_;
};

// The backstop as the training loop runs it: after each step, when due, evaluates, appends a line to
// OUT/eval.jsonl and prints a one-line summary (and a warning when flagged) to stderr.
class EvalBackstop {
 public:
  // resume_step >= 0: a resumed run; eval.jsonl keeps its records up to that step.
  EvalBackstop(const TrainConfig& cfg, const std::string& out_dir, int64_t resume_step, bool quiet);
  ~EvalBackstop();
  void after_step(const float* params, ThreadPool& pool, int64_t step);
  bool due(int64_t step) const { return eval_.due(step); }
  const std::vector<EvalResult>& results() const { return results_; }

 private:
  Evaluator eval_;
  std::string path_;
  bool quiet_;
  std::vector<EvalResult> results_;
};

// A backstop for runs whose config enables it (eval.interval > 0), else nullptr.
std::unique_ptr<EvalBackstop> make_eval_backstop(const TrainConfig& cfg, const std::string& out_dir, int64_t resume_step,
                                                 bool quiet);

}  // namespace olmoref
