#include "train/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>

#include "data/dataset.h"
#include "data/holdout.h"
#include "data/mix.h"
#include "golden/trace.h"
#include "core/bf16.h"
#include "core/mathfn.h"
#include "core/parallel.h"
#include "core/reduce.h"
#include "core/rng.h"
#include "train/batch_source.h"

namespace olmoref {

namespace {

std::vector<int64_t> evenly_spaced(int64_t n, int64_t k) {
  k = std::min(k, n);
  std::vector<int64_t> ids(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) ids[static_cast<size_t>(i)] = i * n / k;
  return ids;
}

data::Mix fresh_mix(const EvalConfig& e) {
  if (!e.fresh_mix.empty()) return data::Mix::parse_file(e.fresh_mix);
  return data::Mix::from_paths(e.fresh_files);
}


std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

struct Evaluator::DocIndex {
  std::vector<std::vector<int64_t>> starts;  // per file: first token of each document
  std::vector<int64_t> base;                 // per file: ordinal of its first document
};

namespace {

// Document boundaries (EOS-delimited) of every file of a set; nullptr when no EOS id is known.
std::unique_ptr<Evaluator::DocIndex> make_doc_index(const data::FslDataset& ds) {
  if (!ds.eos_id()) return nullptr;
  auto idx = std::make_unique<Evaluator::DocIndex>();
  int64_t ordinal = 0;
  const uint32_t eos = *ds.eos_id();
  for (size_t f = 0; f < ds.n_files(); ++f) {
    const data::TokenFile& tf = ds.file(f);
    std::vector<int64_t> starts{0};
    for (int64_t i = 0; i + 1 < tf.n_tokens(); ++i)
      if (tf.token(i) == eos) starts.push_back(i + 1);
    idx->base.push_back(ordinal);
    ordinal += static_cast<int64_t>(starts.size());
    idx->starts.push_back(std::move(starts));
  }
  return idx;
}

}  // namespace

nlohmann::json eval_result_json(const EvalResult& r) {
  auto set = [](const EvalSetStats& s) {
    return nlohmann::json{{"instances", s.instances}, {"targets", s.targets}, {"loss", s.loss},
                          {"min_k", s.min_k},         {"unit", s.unit},       {"units", static_cast<int64_t>(s.units.size())}};
  };
  nlohmann::json docs = nlohmann::json::array();
  for (const EvalDocument& d : r.documents)
    docs.push_back({{"document", d.document}, {"file", d.file}, {"token_start", d.token_start}, {"targets", d.targets},
                    {"loss", d.loss}});
  return nlohmann::json{{"step", r.step},
                        {"holdout", set(r.holdout)},
                        {"fresh", set(r.fresh)},
                        {"gap", r.gap},
                        {"ci", {r.ci_lo, r.ci_hi}},
                        {"alpha", r.alpha},
                        {"bootstrap", r.bootstrap},
                        {"p_not_lower", r.p_not_lower},
                        {"flag", r.flagged},
                        {"documents", docs},
                        {"seconds", r.seconds}};
}

BootstrapCI bootstrap_gap(const std::vector<LossUnit>& a, const std::vector<LossUnit>& b, int64_t resamples,
                          double alpha, uint64_t seed) {
  if (a.empty() || b.empty() || resamples < 1) throw std::invalid_argument("bootstrap: empty sample or no resamples");
  const uint64_t na = a.size();
  std::vector<double> gaps(static_cast<size_t>(resamples));
  // Resample r draws unit i of set a from (seed, bootstrap, stream r, counter i) and of set b from
  // counter na + i (rounded up to even: each Philox call gives two draws).
  auto loss_of = [&](const std::vector<LossUnit>& x, uint64_t offset, int64_t r) {
    const uint64_t n = x.size();
    double sum = 0.0;
    int64_t targets = 0;
    auto take = [&](double u) {
      const LossUnit& e = x[std::min<uint64_t>(n - 1, static_cast<uint64_t>(u * static_cast<double>(n)))];
      sum += e.sum;
      targets += e.targets;
    };
    for (uint64_t i = 0; i < n; i += 2) {
      double u1, u2;
      uniform2(seed, RngPurpose::bootstrap, static_cast<uint32_t>(r), offset + i, 0, &u1, &u2);
      take(u1);
      if (i + 1 < n) take(u2);
    }
    return targets > 0 ? sum / static_cast<double>(targets) : 0.0;
  };
  for (int64_t r = 0; r < resamples; ++r) gaps[static_cast<size_t>(r)] = loss_of(a, 0, r) - loss_of(b, na + (na & 1), r);
  std::sort(gaps.begin(), gaps.end());
  const double last = static_cast<double>(resamples - 1);
  BootstrapCI ci;
  ci.lo = gaps[static_cast<size_t>(std::floor(alpha / 2.0 * last))];
  ci.hi = gaps[static_cast<size_t>(std::ceil((1.0 - alpha / 2.0) * last))];
  ci.p_not_lower = static_cast<double>(std::count_if(gaps.begin(), gaps.end(), [](double g) { return g >= 0.0; })) /
                   static_cast<double>(resamples);
  return ci;
}

BootstrapCI bootstrap_mean_gap(const std::vector<double>& a, const std::vector<double>& b, int64_t resamples,
                               double alpha, uint64_t seed) {
  std::vector<LossUnit> ua, ub;
  for (const double x : a) ua.push_back({x, 1});
  for (const double x : b) ub.push_back({x, 1});
  return bootstrap_gap(ua, ub, resamples, alpha, seed);
}

Evaluator::Evaluator(const TrainConfig& cfg)
    : cfg_(cfg), model_(cfg.model, 1, cfg.train.seq_len, parse_precision(cfg.train.precision)) {
  if (cfg.eval.interval <= 0) throw std::invalid_argument("Evaluator: eval.interval is 0 (the backstop is off)");
  model_.set_z_loss(cfg.train.z_loss);
  if (cfg.data.document_masking) model_.set_document_masking(cfg.data.eos_id);
  const data::DatasetOptions opts = dataset_options(cfg);
  data::DatasetOptions o = opts;
  o.allow_short_files = true;  // a small holdout file is still held out
  const data::HoldoutSpec hs = holdout_spec(cfg.data);
  if (hs.kind == data::HoldoutKind::none)
    throw std::invalid_argument(
        cfg.in_file("config key 'eval.interval': the backstop needs a holdout (data.holdout_mix or data.holdout_files)"));
  holdout_ = std::make_shared<data::FslDataset>(hs.mix, o);
  fresh_ = std::make_shared<data::FslDataset>(fresh_mix(cfg.eval), o);
  if (holdout_->size() < 2 || fresh_->size() < 2)
    throw std::invalid_argument(
        cfg.in_file("config key 'eval.instances': the holdout and the fresh split need at least 2 instances each"));
  holdout_ids_ = evenly_spaced(holdout_->size(), cfg.eval.instances);
  fresh_ids_ = evenly_spaced(fresh_->size(), cfg.eval.instances);
  holdout_docs_ = make_doc_index(*holdout_);
  fresh_docs_ = make_doc_index(*fresh_);
  grad_.assign(static_cast<size_t>(model_.layout().total), 0.0f);
  logits_.assign(static_cast<size_t>(cfg.train.seq_len * cfg.model.vocab_size), 0.0f);
}

Evaluator::~Evaluator() = default;

EvalSetStats Evaluator::evaluate(const data::FslDataset& ds, const DocIndex* doc_index, const std::vector<int64_t>& ids,
                                 const float* params, ThreadPool& pool, std::vector<EvalDocument>* docs) {
  const int64_t T = cfg_.train.seq_len, V = cfg_.model.vocab_size;
  EvalSetStats st;
  std::vector<uint32_t> tokens(static_cast<size_t>(T));
  std::vector<float> ce(static_cast<size_t>(T - 1));
  std::map<int64_t, EvalDocument> per_doc;
  double loss_sum = 0.0, mink_sum = 0.0;
  for (const int64_t id : ids) {
    ds.read_instance(id, tokens);
    model_.forward_backward(params, tokens.data(), T - 1, grad_.data(), &pool, logits_.data());
    // Per-target cross-entropy from the logits, with the training loss's own formula (ref/ops.cpp).
    pool.parallel_for(T - 1, 8, [&](int64_t b, int64_t e) {
      std::vector<float> ex(static_cast<size_t>(V));
      for (int64_t t = b; t < e; ++t) {
        const float* x = logits_.data() + t * V;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t v = 0; v < V; ++v) m = std::max(m, x[v]);
        for (int64_t v = 0; v < V; ++v) ex[static_cast<size_t>(v)] = det::expf(x[v] - m);
        const float lse = m + det::logf(canonical_sum(ex.data(), V));
        ce[static_cast<size_t>(t)] = lse - x[tokens[static_cast<size_t>(t + 1)]];
      }
    });
    double sum = 0.0;
    for (const float c : ce) sum += c;
    const double inst = sum / static_cast<double>(T - 1);
    std::vector<float> sorted = ce;
    const size_t k = std::max<size_t>(1, static_cast<size_t>(std::ceil(0.2 * static_cast<double>(sorted.size()))));
    std::partial_sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end(), std::greater<float>());
    double top = 0.0;
    for (size_t i = 0; i < k; ++i) top += sorted[i];
    loss_sum += inst;
    mink_sum += top / static_cast<double>(k);
    st.targets += T - 1;
    const data::FslDataset::Location loc = ds.locate(id);
    const std::string& file = ds.file(static_cast<size_t>(loc.file)).path();
    for (int64_t t = 0; t + 1 < T; ++t) {
      const int64_t pos = loc.token_start + t + 1;  // the target token's offset in its file
      int64_t doc = id, start = loc.token_start;
      if (doc_index) {
        const auto& s = doc_index->starts[static_cast<size_t>(loc.file)];
        const auto it = std::upper_bound(s.begin(), s.end(), pos) - 1;
        doc = doc_index->base[static_cast<size_t>(loc.file)] + (it - s.begin());
        start = *it;
      }
      EvalDocument& d = per_doc[doc];
      d.document = doc;
      d.file = file;
      d.token_start = start;
      ++d.targets;
      d.loss += ce[static_cast<size_t>(t)];
    }
  }
  st.instances = static_cast<int64_t>(ids.size());
  st.loss = loss_sum / static_cast<double>(ids.size());
  st.min_k = mink_sum / static_cast<double>(ids.size());
  st.unit = doc_index ? "document" : "instance";
  for (const auto& [k, d] : per_doc) {
    (void)k;
    st.units.push_back({d.loss, d.targets});  // d.loss still holds the sum here
  }
  if (docs) {
    docs->clear();
    for (auto& [k, d] : per_doc) {
      (void)k;
      d.loss /= static_cast<double>(d.targets);
      docs->push_back(std::move(d));
    }
    std::stable_sort(docs->begin(), docs->end(), [](const EvalDocument& a, const EvalDocument& b) { return a.loss < b.loss; });
  }
  return st;
}

EvalResult Evaluator::run(const float* params, ThreadPool& pool, int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  EvalResult r;
  r.step = step;
  r.holdout = evaluate(*holdout_, holdout_docs_.get(), holdout_ids_, params, pool, &r.documents);
  r.fresh = evaluate(*fresh_, fresh_docs_.get(), fresh_ids_, params, pool, nullptr);
  r.gap = r.holdout.loss - r.fresh.loss;
  r.bootstrap = cfg_.eval.bootstrap;
  r.alpha = cfg_.eval.alpha;
  const BootstrapCI ci = bootstrap_gap(r.holdout.units, r.fresh.units, cfg_.eval.bootstrap, cfg_.eval.alpha,
                                       cfg_.eval.seed + static_cast<uint64_t>(step));
  r.ci_lo = ci.lo;
  r.ci_hi = ci.hi;
  r.p_not_lower = ci.p_not_lower;
  r.flagged = ci.hi < 0.0;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

EvalBackstop::EvalBackstop(const TrainConfig& cfg, const std::string& out_dir, int64_t resume_step, bool quiet)
    : eval_(cfg), path_(out_dir + "/eval.jsonl"), quiet_(quiet) {
  if (resume_step >= 0) {
    truncate_step_records(path_, resume_step);
  } else {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(path_ + ": cannot create the eval log");
  }
}

EvalBackstop::~EvalBackstop() = default;

void EvalBackstop::after_step(const float* params, ThreadPool& pool, int64_t step) {
  if (!eval_.due(step)) return;
  EvalResult r = eval_.run(params, pool, step);
  {
    std::ofstream out(path_, std::ios::binary | std::ios::app);
    out << eval_result_json(r).dump() << "\n";
    if (!out) throw std::runtime_error(path_ + ": cannot append to the eval log");
  }
  if (!quiet_) {
    std::fprintf(stderr, "eval  %5lld  holdout %.4f  fresh %.4f  gap %+.4f  %g%% CI [%+.4f, %+.4f]  (%lld+%lld instances, %.1f s)\n",
                 static_cast<long long>(step), r.holdout.loss, r.fresh.loss, r.gap, 100.0 * (1.0 - r.alpha), r.ci_lo,
                 r.ci_hi, static_cast<long long>(r.holdout.instances), static_cast<long long>(r.fresh.instances), r.seconds);
    if (r.flagged) {
      std::string low;
      for (size_t i = 0; i < r.documents.size() && i < 3; ++i)
        low += (i ? ", " : "") + std::to_string(r.documents[i].document) + " (" + fmt("%.3f", r.documents[i].loss) + ")";
      std::fprintf(stderr,
                   "eval  %5lld  WARNING: holdout loss is significantly below the fresh split's: the holdout may have "
                   "leaked into training (run `olmoref leakcheck`); lowest holdout documents: %s\n",
                   static_cast<long long>(step), low.c_str());
    }
  }
  results_.push_back(std::move(r));
}

std::unique_ptr<EvalBackstop> make_eval_backstop(const TrainConfig& cfg, const std::string& out_dir, int64_t resume_step,
                                                 bool quiet) {
  if (cfg.eval.interval <= 0) return nullptr;
  return std::make_unique<EvalBackstop>(cfg, out_dir, resume_step, quiet);
}

}  // namespace olmoref
