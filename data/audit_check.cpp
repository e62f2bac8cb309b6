#include "data/audit_check.h"

#include "core/documents.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "data/loader.h"
#include "data/shuffle.h"

namespace olmoref::data {

bool StreamPosition::before(const StreamPosition& o) const {
  if (step != o.step) return step < o.step;
  if (microbatch != o.microbatch) return microbatch < o.microbatch;
  if (index != o.index) return index < o.index;
  return token_offset < o.token_offset;
}

void to_json(nlohmann::json& j, const StreamPosition& p) {
  j = nlohmann::json{{"step", p.step},      {"epoch", p.epoch},     {"microbatch", p.microbatch},
                     {"rank", p.rank},      {"instance", p.instance}, {"index_in_microbatch", p.index}};
  if (p.token_offset >= 0) j["token_offset"] = p.token_offset;
  if (!p.file.empty()) j["file"] = p.file;
  if (p.token_start >= 0) j["token_start"] = p.token_start;
  if (p.world_size > 0) j["world_size"] = p.world_size;
}

void CheckResult::fail(const StreamPosition& at, const std::string& reason) {
  status = "fail";
  ++failures;
  if (!first || at.before(*first)) {
    first = at;
    first_reason = reason;
  }
}

void CheckResult::skip(const std::string& reason) {
  status = "skipped";
  skipped_reason = reason;
}

void CheckResult::merge(const CheckResult& o) {
  if (o.status == "skipped") return;
  if (status == "skipped") status = "pass";
  checked += o.checked;
  failures += o.failures;
  if (o.failed()) status = "fail";
  if (o.first && (!first || o.first->before(*first))) {
    first = o.first;
    first_reason = o.first_reason;
  }
}

nlohmann::json CheckResult::to_json() const {
  nlohmann::json j{{"status", status}, {"checked", checked}, {"failures", failures}};
  if (status == "skipped") j["reason"] = skipped_reason;
  if (first) {
    j["first"] = *first;
    j["first"]["reason"] = first_reason;
  }
  for (auto it = details.begin(); it != details.end(); ++it) j[it.key()] = it.value();
  return j;
}

StreamPosition position_of(const AuditRecord& r, int64_t index) {
  StreamPosition p;
  p.step = r.step;
  p.epoch = r.epoch;
  p.microbatch = r.microbatch;
  p.rank = r.rank;
  p.instance = r.instance;
  p.index = index;
  p.file = r.file;
  p.token_start = r.token_start;
  return p;
}

namespace {

using StepRecords = std::map<int64_t, std::vector<const AuditRecord*>>;

// Records grouped by step, each step in canonical micro-batch order (stable: the order inside a
// micro-batch is the order the log holds, which is the row order).
StepRecords by_step(const std::vector<AuditRecord>& records) {
  StepRecords m;
  for (const AuditRecord& r : records) m[r.step].push_back(&r);
  for (auto& [step, v] : m) {
    (void)step;
    std::stable_sort(v.begin(), v.end(),
                     [](const AuditRecord* a, const AuditRecord* b) { return a->microbatch < b->microbatch; });
  }
  return m;
}

// Positions inside micro-batches for a step's records (already in micro-batch order).
std::vector<int64_t> indices_in_microbatch(const std::vector<const AuditRecord*>& recs) {
  std::vector<int64_t> idx(recs.size());
  int64_t k = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    k = (i > 0 && recs[i]->microbatch == recs[i - 1]->microbatch) ? k + 1 : 0;
    idx[i] = k;
  }
  return idx;
}

// The configured order, one permutation per epoch (built on first use).
class Reference {
 public:
  explicit Reference(const StreamExpectation& e) : e_(e) {
    if (e_.dataset) batches_per_epoch_ = e_.dataset->size() / e_.global_batch_instances;
  }
  bool active() const { return e_.dataset != nullptr && batches_per_epoch_ > 0; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t n_instances() const { return e_.dataset->size(); }
  std::span<const uint32_t> row(int64_t epoch, int64_t batch) {
    auto it = orders_.find(epoch);
    if (it == orders_.end()) {
      if (orders_.size() > 2) orders_.clear();  // bounded memory: a stream touches epochs in order
      it = orders_
               .emplace(epoch, std::make_unique<GlobalOrder>(e_.seed, epoch, e_.dataset->size(),
                                                             e_.global_batch_instances, e_.dataset->chunk_instances()))
               .first;
    }
    return it->second->batch(batch);
  }
  // The step's (epoch, batch) in the configured order.
  std::pair<int64_t, int64_t> epoch_batch_of_step(int64_t step) const {
    return {(step - 1) / batches_per_epoch_ + 1, (step - 1) % batches_per_epoch_};
  }

 private:
  const StreamExpectation& e_;
  int64_t batches_per_epoch_ = 0;
  std::map<int64_t, std::unique_ptr<GlobalOrder>> orders_;
};

// Any split the trainer accepts (core/instance_tree.h BatchSplit): ceil(G / mb) micro-batches, the last one shorter,
// over at most that many ranks, whose runs may differ by one.
void require_shape(const StreamExpectation& e) {
  const int64_t M = e.microbatch_instances > 0 ? (e.global_batch_instances + e.microbatch_instances - 1) / e.microbatch_instances : 0;
  if (e.global_batch_instances <= 0 || e.microbatch_instances <= 0 || e.world_size < 0 || e.world_size > M) {
    throw std::invalid_argument("audit check: " + std::to_string(e.world_size) + " rank(s) for " + std::to_string(M) +
                                " micro-batch(es) of " + std::to_string(e.microbatch_instances) +
                                " instances: every rank needs at least one micro-batch");
  }
}

}  // namespace

CheckResult check_partition(const std::vector<AuditRecord>& records, const StreamExpectation& e) {
  require_shape(e);
  CheckResult res("audit_partition");
  const int64_t G = e.global_batch_instances, mb = e.microbatch_instances, M = (G + mb - 1) / mb;
  Reference ref(e);
  int64_t content_checked = 0, documents_checked = 0, documents_wrong = 0;
  std::vector<uint32_t> buf(e.dataset ? static_cast<size_t>(e.dataset->sequence_length()) : 0);
  for (const auto& [step, recs] : by_step(records)) {
    ++res.checked;
    const std::vector<int64_t> idx = indices_in_microbatch(recs);
    const int64_t epoch = recs.front()->epoch, batch = recs.front()->batch;
    for (size_t i = 0; i < recs.size(); ++i) {
      if (recs[i]->epoch != epoch || recs[i]->batch != batch) {
        res.fail(position_of(*recs[i], idx[i]), "the records of step " + std::to_string(step) +
                                                    " disagree on epoch/batch");
      }
    }
    if (ref.active()) {
      const int64_t expect_step = (epoch - 1) * ref.batches_per_epoch() + batch + 1;
      if (epoch < 1 || batch < 0 || expect_step != step) {
        res.fail(position_of(*recs.front(), 0),
                 "step label " + std::to_string(step) + " but epoch " + std::to_string(epoch) + " batch " +
                     std::to_string(batch) + " is step " + std::to_string(expect_step) +
                     " of the configured order (" + std::to_string(ref.batches_per_epoch()) + " batches per epoch)");
      }
    }
    // The step's layout: the configured one, or (world_size 0: logs of a run resumed at other layouts) the ranks
    // the step's records come from, which must be 0..W-1 (every rank computes at least one micro-batch).
    int world = e.world_size;
    if (world == 0) {
      std::set<int64_t> ranks;
      for (const AuditRecord* r : recs) ranks.insert(r->rank);
      world = static_cast<int>(*ranks.rbegin() + 1);
      if (*ranks.begin() != 0 || static_cast<int64_t>(ranks.size()) != world || world > M) {
        res.fail(position_of(*recs.front(), 0), "step " + std::to_string(step) + " has records of " +
                                                    std::to_string(ranks.size()) + " rank(s) up to rank " +
                                                    std::to_string(world - 1) + ": a rank's log is missing");
        world = std::max(1, std::min<int>(world, static_cast<int>(M)));
      }
    }
    // Each micro-batch index once, from its owner, with mb instances.
    std::vector<int64_t> count(static_cast<size_t>(M), 0);
    for (size_t i = 0; i < recs.size(); ++i) {
      const AuditRecord& r = *recs[i];
      if (r.microbatch < 0 || r.microbatch >= M) {
        res.fail(position_of(r, idx[i]), "micro-batch index " + std::to_string(r.microbatch) + " outside 0.." +
                                             std::to_string(M - 1));
        continue;
      }
      ++count[static_cast<size_t>(r.microbatch)];
      const int owner = Loader::rank_of_microbatch(r.microbatch, M, world);
      if (r.rank != owner) {
        res.fail(position_of(r, idx[i]), "micro-batch " + std::to_string(r.microbatch) + " came from rank " +
                                             std::to_string(r.rank) + "; with " + std::to_string(world) +
                                             " ranks its owner is rank " + std::to_string(owner));
      }
    }
    for (int64_t m = 0; m < M; ++m) {
      const int64_t c = count[static_cast<size_t>(m)];
      const int64_t size = std::min(mb, G - m * mb);  // the last micro-batch holds the remainder
      if (c == size) continue;
      StreamPosition p;
      p.step = step;
      p.epoch = epoch;
      p.microbatch = m;
      p.rank = Loader::rank_of_microbatch(m, M, world);
      p.index = c == 0 ? 0 : size;
      res.fail(p, c == 0 ? "micro-batch " + std::to_string(m) + " of step " + std::to_string(step) +
                               " is missing (no rank delivered it)"
                         : "micro-batch " + std::to_string(m) + " has " + std::to_string(c) + " instances, expected " +
                               std::to_string(size));
    }
    // No instance twice in one global batch.
    std::unordered_map<int64_t, const AuditRecord*> seen;
    seen.reserve(recs.size() * 2);
    for (size_t i = 0; i < recs.size(); ++i) {
      const auto [it, fresh] = seen.emplace(recs[i]->instance, recs[i]);
      if (!fresh) {
        res.fail(position_of(*recs[i], idx[i]),
                 "instance " + std::to_string(recs[i]->instance) + " appears twice in the global batch of step " +
                     std::to_string(step) + " (also in micro-batch " + std::to_string(it->second->microbatch) +
                     " from rank " + std::to_string(it->second->rank) + ")");
      }
    }
    if (!ref.active()) continue;
    // The configured row, in row order.
    if (epoch >= 1 && batch >= 0 && batch < ref.batches_per_epoch()) {
      const std::span<const uint32_t> row = ref.row(epoch, batch);
      for (size_t i = 0; i < recs.size(); ++i) {
        const AuditRecord& r = *recs[i];
        if (r.microbatch < 0 || r.microbatch >= M || idx[i] >= mb) continue;
        const int64_t want = row[static_cast<size_t>(r.microbatch * mb + idx[i])];
        if (r.instance != want) {
          res.fail(position_of(r, idx[i]), "instance " + std::to_string(r.instance) + " where the configured order " +
                                               "(epoch " + std::to_string(epoch) + ", batch " + std::to_string(batch) +
                                               ") has instance " + std::to_string(want));
        }
      }
    } else {
      res.fail(position_of(*recs.front(), 0),
               "batch " + std::to_string(batch) + " of epoch " + std::to_string(epoch) + " does not exist: the epoch has " +
                   std::to_string(ref.batches_per_epoch()) + " whole global batches (the tail must be cropped)");
    }
    if (!e.check_content) continue;
    const FslDataset& ds = *e.dataset;
    for (size_t i = 0; i < recs.size(); ++i) {
      const AuditRecord& r = *recs[i];
      ++content_checked;
      if (r.instance < 0 || r.instance >= ds.size()) {
        res.fail(position_of(r, idx[i]), "instance " + std::to_string(r.instance) + " (file " + r.file +
                                             ") is not in the configured dataset of " + std::to_string(ds.size()) +
                                             " instances");
        continue;
      }
      const FslDataset::Location loc = ds.locate(r.instance);
      const std::string& path = ds.file(static_cast<size_t>(loc.file)).path();
      if (r.file != path || r.token_start != loc.token_start || r.token_end != loc.token_start + ds.sequence_length()) {
        res.fail(position_of(r, idx[i]), "instance " + std::to_string(r.instance) + " is recorded as " + r.file + " [" +
                                             std::to_string(r.token_start) + ", " + std::to_string(r.token_end) +
                                             ") but the configured dataset has it at " + path + " [" +
                                             std::to_string(loc.token_start) + ", ...)");
        continue;
      }
      ds.read_instance(r.instance, buf);
      if (xxh3_tokens(buf) != r.xxh3) {
        res.fail(position_of(r, idx[i]), "the delivered tokens of instance " + std::to_string(r.instance) +
                                             " (xxh3 " + hex64(r.xxh3) + ") differ from its content (xxh3 " +
                                             hex64(xxh3_tokens(buf)) + ")");
        continue;
      }
      // The boundaries the model masked with must be the ones the instance's own EOS tokens make: a loader or trainer
      // that cut documents elsewhere (another EOS, an off-by-one, a stale buffer) let attention cross a document.
      const std::vector<int32_t> want =
          e.document_eos ? document_lengths(buf.data(), static_cast<int64_t>(buf.size()), *e.document_eos)
                         : std::vector<int32_t>{};
      if (r.documents != want) {
        auto list = [](const std::vector<int32_t>& v) {
          std::string s = "[";
          for (size_t k = 0; k < v.size() && k < 8; ++k) s += (k ? "," : "") + std::to_string(v[k]);
          return s + (v.size() > 8 ? ",...]" : "]");
        };
        res.fail(position_of(r, idx[i]),
                 !e.document_eos ? "instance " + std::to_string(r.instance) + " records documents " + list(r.documents) +
                                       " but the config has no intra-document masking (data.document_masking)"
                 : r.documents.empty()
                     ? "instance " + std::to_string(r.instance) + " records no documents but the config masks within "
                       "documents at EOS " + std::to_string(*e.document_eos) + " (data.document_masking)"
                     : "instance " + std::to_string(r.instance) + " was masked as documents " + list(r.documents) + " (" +
                           std::to_string(r.documents.size()) + ") but its tokens end documents at EOS " +
                           std::to_string(*e.document_eos) + " as " + list(want) + " (" + std::to_string(want.size()) + ")");
        ++documents_wrong;
      } else if (!want.empty()) {
        ++documents_checked;
      }
    }
  }
  res.details["steps"] = res.checked;
  if (e.document_eos) {
    res.details["documents_checked"] = documents_checked;
    res.details["documents_wrong"] = documents_wrong;
  }
  res.details["world_size"] = e.world_size;
  res.details["reference"] = ref.active();
  res.details["content_checked"] = content_checked;
  return res;
}

CheckResult check_exactly_once(const std::vector<AuditRecord>& records, const StreamExpectation& e) {
  require_shape(e);
  CheckResult res("audit_exactly_once");
  const int64_t mb = e.microbatch_instances, M = (e.global_batch_instances + mb - 1) / mb;
  Reference ref(e);
  const StepRecords steps = by_step(records);
  // epoch -> instance -> step of first use
  std::map<int64_t, std::unordered_map<int64_t, int64_t>> used;
  std::map<int64_t, std::unordered_map<uint64_t, int64_t>> content;
  int64_t duplicates = 0, duplicate_content = 0, skipped = 0, missing_steps = 0, unexpected_steps = 0;
  for (const auto& [step, recs] : steps) {
    const std::vector<int64_t> idx = indices_in_microbatch(recs);
    for (size_t i = 0; i < recs.size(); ++i) {
      const AuditRecord& r = *recs[i];
      ++res.checked;
      const auto [it, fresh] = used[r.epoch].emplace(r.instance, step);
      if (!fresh) {
        ++duplicates;
        res.fail(position_of(r, idx[i]), "instance " + std::to_string(r.instance) + " used again in epoch " +
                                             std::to_string(r.epoch) + " (first at step " + std::to_string(it->second) +
                                             ")");
        continue;
      }
      const auto [ct, cfresh] = content[r.epoch].emplace(r.xxh3, r.instance);
      if (!cfresh && ct->second != r.instance) ++duplicate_content;  // same tokens, other instance: data, not loader
    }
  }
  if (!steps.empty()) {
    const int64_t first = e.first_step, last = e.last_step >= 0 ? e.last_step : steps.rbegin()->first;
    for (int64_t s = first; s <= last; ++s) {
      if (steps.count(s)) continue;
      ++missing_steps;
      StreamPosition p;
      p.step = s;
      p.microbatch = 0;
      p.index = 0;
      if (ref.active()) p.epoch = ref.epoch_batch_of_step(s).first;
      res.fail(p, "no records for step " + std::to_string(s) + ": its global batch was skipped");
    }
    for (const auto& [s, recs] : steps) {
      if (s >= first && s <= last) continue;
      ++unexpected_steps;
      res.fail(position_of(*recs.front(), 0), "step " + std::to_string(s) + " is outside the expected steps " +
                                                  std::to_string(first) + ".." + std::to_string(last));
    }
    // Skips: an instance of an expected step's configured row that its epoch never delivered.
    if (ref.active()) {
      for (int64_t s = first; s <= last; ++s) {
        const auto [epoch, batch] = ref.epoch_batch_of_step(s);
        const std::span<const uint32_t> row = ref.row(epoch, batch);
        const auto& u = used[epoch];
        for (size_t i = 0; i < row.size(); ++i) {
          if (u.count(row[i])) continue;
          ++skipped;
          StreamPosition p;
          p.step = s;
          p.epoch = epoch;
          p.microbatch = static_cast<int64_t>(i) / mb;
          p.rank = e.world_size > 0 ? Loader::rank_of_microbatch(p.microbatch, M, e.world_size) : -1;  // -1: unknown
          p.instance = row[i];
          p.index = static_cast<int64_t>(i) % mb;
          res.fail(p, "instance " + std::to_string(row[i]) + " of step " + std::to_string(s) +
                          "'s configured row was never delivered in epoch " + std::to_string(epoch));
        }
      }
    }
  }
  res.details["instances"] = res.checked;
  res.details["duplicates"] = duplicates;
  res.details["skipped_instances"] = skipped;
  res.details["missing_steps"] = missing_steps;
  res.details["unexpected_steps"] = unexpected_steps;
  res.details["duplicate_content"] = duplicate_content;  // informational: identical instances in the data
  res.details["epochs"] = static_cast<int64_t>(used.size());
  res.details["reference"] = ref.active();
  return res;
}

std::vector<DeliveredBatch> batches_in_delivery_order(const std::vector<AuditRecord>& records,
                                                      int64_t first_trainer_step, int64_t records_per_batch) {
  std::vector<DeliveredBatch> out;
  for (size_t i = 0; i < records.size(); ++i) {
    const bool starts = records_per_batch > 0 ? i % static_cast<size_t>(records_per_batch) == 0
                                              : i == 0 || records[i].step != records[i - 1].step;
    if (starts) {
      out.emplace_back();
      out.back().step = first_trainer_step + static_cast<int64_t>(out.size()) - 1;
    }
    out.back().records.push_back(&records[i]);
  }
  for (auto& b : out) {
    std::stable_sort(b.records.begin(), b.records.end(),
                     [](const AuditRecord* x, const AuditRecord* y) { return x->microbatch < y->microbatch; });
  }
  return out;
}

std::vector<DeliveredBatch> batches_by_label(const std::vector<AuditRecord>& records) {
  std::vector<DeliveredBatch> out;
  for (auto& [step, recs] : by_step(records)) out.push_back({step, std::move(recs)});
  return out;
}

CheckResult compare_streams(const std::vector<DeliveredBatch>& expected, const std::vector<DeliveredBatch>& actual,
                            const std::string& name, int64_t from_step, int64_t to_step, int world_size) {
  CheckResult res(name);
  std::map<int64_t, const DeliveredBatch*> E, A;
  for (const auto& b : expected) E.emplace(b.step, &b);
  for (const auto& b : actual) A.emplace(b.step, &b);
  std::set<int64_t> steps;
  for (const auto& [s, b] : E) {
    (void)b;
    if (s >= from_step && (to_step < 0 || s <= to_step)) steps.insert(s);
  }
  for (const auto& [s, b] : A) {
    (void)b;
    if (s >= from_step && (to_step < 0 || s <= to_step)) steps.insert(s);
  }
  for (const int64_t s : steps) {
    const auto ei = E.find(s), ai = A.find(s);
    ++res.checked;
    if (ai == A.end()) {
      StreamPosition p;
      p.step = s;
      p.epoch = ei->second->records.empty() ? -1 : ei->second->records.front()->epoch;
      p.microbatch = 0;
      p.index = 0;
      p.world_size = world_size;
      res.fail(p, "step " + std::to_string(s) + " is missing (the reference stream has " +
                      std::to_string(ei->second->records.size()) + " instances there)");
      continue;
    }
    const auto& a = ai->second->records;
    if (a.empty()) continue;
    const std::vector<int64_t> idx = indices_in_microbatch(a);
    auto at = [&](size_t i) {
      StreamPosition p = position_of(*a[i], idx[i]);
      p.step = s;  // the trainer's step (the loader's own label is in the reason)
      p.world_size = world_size;
      return p;
    };
    if (ei == E.end()) {
      res.fail(at(0), "step " + std::to_string(s) + " (loader label " + std::to_string(a.front()->step) +
                          ") is not in the reference stream");
      continue;
    }
    const auto& x = ei->second->records;
    const size_t n = std::min(x.size(), a.size());
    bool differs = false;
    for (size_t i = 0; i < n && !differs; ++i) {
      if (x[i]->microbatch == a[i]->microbatch && x[i]->instance == a[i]->instance && x[i]->xxh3 == a[i]->xxh3 &&
          x[i]->epoch == a[i]->epoch && x[i]->batch == a[i]->batch)
        continue;
      differs = true;  // one offence per step: everything after the first difference usually differs too
      res.fail(at(i), "micro-batch " + std::to_string(a[i]->microbatch) + " holds instance " +
                          std::to_string(a[i]->instance) + " (xxh3 " + hex64(a[i]->xxh3) + ", epoch " +
                          std::to_string(a[i]->epoch) + " batch " + std::to_string(a[i]->batch) +
                          ") where the reference has instance " + std::to_string(x[i]->instance) + " (xxh3 " +
                          hex64(x[i]->xxh3) + ", epoch " + std::to_string(x[i]->epoch) + " batch " +
                          std::to_string(x[i]->batch) + ")");
    }
    if (!differs && x.size() != a.size()) {
      res.fail(at(a.size() - 1), "step " + std::to_string(s) + " has " + std::to_string(a.size()) +
                                     " instances, the reference " + std::to_string(x.size()));
    }
  }
  res.details["steps_compared"] = res.checked;
  return res;
}

std::vector<AuditRecord> read_audit_logs(const std::vector<std::string>& paths) {
  std::vector<AuditRecord> all;
  for (const auto& p : paths) {
    std::vector<AuditRecord> r = read_audit_log(p);
    all.insert(all.end(), std::make_move_iterator(r.begin()), std::make_move_iterator(r.end()));
  }
  return all;
}

}  // namespace olmoref::data
