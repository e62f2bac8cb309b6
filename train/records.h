// train/records.h — a resumed run's records (trace.jsonl and the audit logs) against the checkpoint it continues.
//
// A resume appends to the records of the run directory. They must hold every step up to the checkpoint's step K
// (from the step a "records_begin" record names, when the run began its records anew), and the trace's record of
// step K must be the step the checkpoint holds (tokens, epoch, data digest): otherwise the records would continue
// silently with steps missing, or continue another run's. `olmoref train --new-records` accepts records that lack
// steps and begins them again at K + 1 (docs/formats/trace.md, records_begin).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "train/config.h"

namespace olmoref {

struct RecordsCheck {
  // What the records lack, one line per file ("RUN/trace.jsonl: missing (no record of steps 1..4)"); empty when
  // they hold every step they should.
  std::vector<std::string> missing;
  int64_t begin = 1;  // the first step the records must hold (a trace record's records_begin, else 1)
};

// Checks RUN's trace and, when `audit` (this run writes audit logs), the audit logs of every rank against the
// checkpoint `meta` read from `ckpt_dir`. Throws, naming the file, the line and both values, when a record
// contradicts the checkpoint or another record (a step repeated or out of order, step K's tokens, epoch or data
// digest differing); returns what is missing. batch_digest: the data digest of the batch the checkpoint's loader
// drew at step K (checkpoint_batch_digest), "" to skip that comparison.
RecordsCheck check_run_records(const std::string& run_dir, const std::string& ckpt_dir, const ckpt::CheckpointMeta& meta,
                               bool audit, const std::string& batch_digest);

// The data digest (XXH3-64 of the token ids, as trace.jsonl's data_digest) of the batch step K drew, rebuilt from the
// checkpoint's loader state and this run's data; "" when it cannot be (another batch source, other data, no step).
std::string checkpoint_batch_digest(const TrainConfig& cfg, const ckpt::CheckpointMeta& meta,
                                    bool ignore_fingerprint_mismatch);

// Cuts every audit log of RUN to the records of steps <= meta.step (and a torn last line). Records are matched to
// steps by the batch each step drew (data_history): an audit record's own "step" is the loader's position in its
// batches, which differs from the trainer's step after a change of the global batch or a start from
// data.olmo_core_state.
void cut_audit_logs(const std::string& run_dir, const ckpt::CheckpointMeta& meta);

// RUN's audit logs (audit.jsonl, audit-rankNNNNN.jsonl), sorted.
std::vector<std::string> audit_logs(const std::string& run_dir);
bool is_audit_log_name(const std::string& file_name);
// A run's records by file name: trace.jsonl, the audit logs, eval.jsonl (the backstop's): what no output may replace.
bool is_run_record_name(const std::string& file_name);

}  // namespace olmoref
