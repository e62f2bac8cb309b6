// golden/trace.h — the per-step trace (docs/formats/trace.md).
//
// trace.jsonl: one JSON object per optimizer step, appended and flushed as the step completes.
// Exact values travel as hex bit patterns (loss_hex, grad_norm_hex, lr_hex); the decimal fields are
// for people and plots. Nothing time- or machine-dependent is in a record, so two runs that computed
// the same thing write byte-identical traces.
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace olmoref {

inline constexpr const char* kTraceFormat = "olmoref-trace/1";

struct TraceRecord {
  int64_t step = 0;          // 1-based optimizer step
  int64_t epoch = 0;         // data epoch the batch came from
  float loss = 0;            // (Σ ce + Σ z) / targets, over the global batch
  float ce = 0, z = 0;       // its two parts
  float grad_norm = 0;       // global L2 norm before clipping
  float clip = 1;            // clipping coefficient applied
  double lr = 0;             // learning rate of this step's update
  int64_t tokens = 0;        // cumulative tokens consumed, including this step
  int64_t num_zeros = -1;    // zero elements of the clipped gradient (Megatron's num-zeros); -1: not recorded
  int skipped = -1;          // 1: SkipStepAdamW skipped this step's update, 0: it did not; -1: the optimizer never skips
  std::string data_digest;   // XXH3-64 of the batch token ids (hex)
  std::string param_digest;  // XXH3-128 Merkle root of the parameters after the update (hex)
  // Mixture of experts only (written when routing_digest is set; docs/formats/trace.md):
  float moe_lb = 0, moe_z = 0;          // the weighted load-balancing and router z-loss, also inside `loss`
  std::string routing_digest;           // XXH3-64 over the instances' routing digests, in global instance order
  std::vector<std::vector<int64_t>> expert_load;  // [layer][expert] tokens routed (each token counts k times)
  // > 0 on the first record a run wrote after resuming with records that lacked steps (train --new-records): the
  // records begin again at this step. Written only then, so every other record is as it was.
  int64_t records_begin = 0;

  // The record's fields, without its checksum (what comparisons of records read).
  std::string to_json() const;
  // The line the trace holds: to_json() with "record_xxh3" last, the XXH3-64 of to_json()'s bytes, so a line changed
  // after it was written (a flipped bit, an edit) is found where it is read.
  std::string to_line() const;
  // Throws TraceChecksumError when the line carries record_xxh3 and its bytes do not match it, std::runtime_error
  // when it is not a record (a line without record_xxh3, written before it was recorded, is read as before).
  static TraceRecord from_json(const std::string& line);
};

// A trace line whose record_xxh3 does not match its bytes: damaged, never a record torn by a kill (which is no JSON).
struct TraceChecksumError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<TraceRecord> read_trace(const std::string& path);  // throws naming the file and line

// For any JSON Lines log whose records carry a "step" (trace, audit, eval): keeps the records of steps
// <= last_step and drops the rest, rewriting the file atomically. A killed run may have written
// records past its newest checkpoint (or a torn last line); the resumed run writes them again.
void truncate_step_records(const std::string& path, int64_t last_step);

class TraceWriter {
 public:
  TraceWriter() = default;
  // append=false truncates; append=true keeps earlier records (resume).
  void open(const std::string& path, bool append);
  void write(const TraceRecord& r);
  // fsync: the records written so far are on disk (called before a checkpoint becomes complete, so a checkpoint
  // never holds a step its trace lost).
  void sync();
  ~TraceWriter();

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace olmoref
