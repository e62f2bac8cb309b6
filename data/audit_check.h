// data/audit_check.h — checks over audit logs (data/audit.h): what the loader delivered, step by step
// (partition, coverage, no repeats within an epoch, resume continuity: what a loader-leakage detector must check).
//
//   check_partition     per global batch: the ranks' micro-batches partition it exactly (each
//                       micro-batch index once, from the rank that owns it, mb instances, no instance
//                       twice), the labels agree (step = (epoch-1)*batches_per_epoch + batch + 1) and,
//                       with a reference, the batch is OLMo-core's row for (epoch, batch) in row order
//                       and every record's file, offsets and XXH3 are what that instance holds.
//   check_exactly_once  per epoch: every instance at most once (duplicates), no step missing, and
//                       with a reference no instance of the expected steps' rows left out (skips).
//   compare_streams     two streams equal step by step (resume vs uninterrupted, one layout vs another):
//                       per step the instances and XXH3s in canonical micro-batch order.
//
// Every result keeps the first offence in stream order (step, then micro-batch), with its rank and
// instance, so a report points at the first batch to look at.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/audit.h"
#include "data/dataset.h"

namespace olmoref::data {

// Where in the stream something happened.
struct StreamPosition {
  int64_t step = -1;
  int64_t epoch = -1;
  int64_t microbatch = -1;
  int64_t rank = -1;
  int64_t instance = -1;      // global instance id (of the served dataset)
  int64_t index = -1;         // position of the instance inside its micro-batch
  int64_t token_offset = -1;  // token offset inside the instance (n-gram hits), else -1
  std::string file;           // the instance's token file, when known
  int64_t token_start = -1;   // the instance's first token in `file`
  int world_size = 0;         // the layout the stream was produced with (0: not layout specific)

  // Stream order: step, micro-batch, position in the micro-batch, token offset.
  bool before(const StreamPosition& o) const;
};
void to_json(nlohmann::json& j, const StreamPosition& p);

struct CheckResult {
  std::string name;
  std::string status = "pass";  // "pass", "fail" or "skipped"
  int64_t checked = 0;          // what was checked (steps, instances, ...; see details)
  int64_t failures = 0;
  std::optional<StreamPosition> first;  // the first offence in stream order
  std::string first_reason;
  std::string skipped_reason;
  nlohmann::json details = nlohmann::json::object();  // check-specific counts

  CheckResult() = default;
  explicit CheckResult(std::string name_) : name(std::move(name_)) {}

  bool failed() const { return status == "fail"; }
  void fail(const StreamPosition& at, const std::string& reason);  // counts; keeps the earliest
  void skip(const std::string& reason);
  void merge(const CheckResult& other);  // adds failures, keeps the earlier first offence
  nlohmann::json to_json() const;
};

// What the stream should look like.
struct StreamExpectation {
  int64_t global_batch_instances = 0;
  int64_t microbatch_instances = 0;
  int world_size = 1;  // the ranks whose logs are merged (micro-batch m belongs to rank m / (M/W)); 0: per step,
                       // the ranks the step's records come from (a run resumed at other layouts)
  // Optional reference: the configured dataset and seed. Row (epoch, batch) is
  // GlobalOrder(seed, epoch, dataset->size(), G).batch(batch).
  std::shared_ptr<const FslDataset> dataset;
  uint64_t seed = 0;
  bool check_content = true;  // with a reference: re-read every instance and compare XXH3/file/offsets
  // With check_content: the run masked within documents at this EOS, so every record must carry the document lengths
  // its tokens give (core/documents.h); unset, a record must carry none.
  std::optional<uint32_t> document_eos;
  // The steps the stream should hold, inclusive; last_step < 0: whatever the records hold.
  int64_t first_step = 1;
  int64_t last_step = -1;
};

// Where an audit record's instance was delivered (index: its place in the micro-batch, -1 unknown).
StreamPosition position_of(const AuditRecord& r, int64_t index = -1);

CheckResult check_partition(const std::vector<AuditRecord>& records, const StreamExpectation& e);
CheckResult check_exactly_once(const std::vector<AuditRecord>& records, const StreamExpectation& e);
// One global batch of a stream as the trainer saw it: `step` is the trainer's step, `records` the
// batch's records in canonical micro-batch order.
struct DeliveredBatch {
  int64_t step = 0;
  std::vector<const AuditRecord*> records;
};
// A single loader's log in delivery order: every `records_per_batch` consecutive records (a
// loader auditing all micro-batches writes G per batch; 0: split where the step label changes) form
// one batch, and the k-th batch is trainer step first_trainer_step + k, so a loader that mislabels
// or repeats batches is still aligned with what the trainer did.
std::vector<DeliveredBatch> batches_in_delivery_order(const std::vector<AuditRecord>& records,
                                                      int64_t first_trainer_step = 1, int64_t records_per_batch = 0);
// The union of several ranks' logs: grouped by step label.
std::vector<DeliveredBatch> batches_by_label(const std::vector<AuditRecord>& records);

// Compares two streams batch by batch, aligned on DeliveredBatch::step, over the steps either
// holds in [from_step, to_step] (to_step < 0: no upper bound). A batch equals when every
// position holds the same micro-batch index, instance, XXH3, epoch and batch. One offence per
// differing step; `world_size` is stamped on the offences.
CheckResult compare_streams(const std::vector<DeliveredBatch>& expected, const std::vector<DeliveredBatch>& actual,
                            const std::string& name, int64_t from_step = 1, int64_t to_step = -1,
                            int world_size = 0);

// The records of several logs (e.g. one per rank), concatenated.
std::vector<AuditRecord> read_audit_logs(const std::vector<std::string>& paths);

}  // namespace olmoref::data
