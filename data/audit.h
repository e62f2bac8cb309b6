// data/audit.h — the per-step data audit log: which bytes of which file every instance of every step came from,
// so a leakage or duplication claim can be checked after the fact (docs/formats/leakcheck.md).
//
// One JSON line per instance of every audited micro-batch:
//   {"step":12,"epoch":1,"batch":11,"microbatch":3,"rank":1,"instance":40213,
//    "file":"corpus/train/part-00002.npy","file_index":2,"token_start":1048576,"token_end":1050624,
//    "xxh3":"9f3c0a1b2c3d4e5f"}
// step is 1-based across epochs (OLMo-core's global_step); batch is the 0-based row of the epoch;
// instance is the global instance id; [token_start, token_end) are token offsets in `file`; xxh3
// is XXH3_64bits (seed 0) over the instance's token ids as little-endian uint32, whatever the file
// dtype, printed as 16 lower-case hex digits. A micro-batch of k instances gives k lines.
// Under intra-document masking (data.document_masking) each line also ends in "documents":[n1,n2,...]: the lengths of
// the documents the model cut the instance into (core/documents.h, at data.eos_id), in order, summing to the
// sequence length, so the boundaries attention was kept inside can be checked against the tokens afterwards; a run
// without masking writes no such key.
//
// The leakage detector and the resume checks read this file; keep it append-only and stable.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace olmoref::data {

struct AuditRecord {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t batch = 0;
  int64_t microbatch = 0;
  int64_t rank = 0;
  int64_t instance = 0;
  std::string file;
  int64_t file_index = 0;
  int64_t token_start = 0;
  int64_t token_end = 0;
  uint64_t xxh3 = 0;
  std::vector<int32_t> documents;  // the document lengths under intra-document masking; empty: masking off

  bool operator==(const AuditRecord&) const = default;
};

// XXH3_64bits over the ids as little-endian uint32 bytes: the token digest used everywhere.
uint64_t xxh3_tokens(std::span<const uint32_t> tokens);
std::string hex64(uint64_t v);  // 16 lower-case hex digits

std::string audit_record_json(const AuditRecord& r);  // one line, no trailing newline
AuditRecord parse_audit_record(const std::string& json_line);

class AuditLog {
 public:
  enum class Mode { truncate, append };
  explicit AuditLog(std::string path, Mode mode = Mode::truncate);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  void write(const AuditRecord& r);  // thread-safe
  void flush();                      // the trainer flushes at checkpoints so log and state agree
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  std::mutex mutex_;
};

// Reads a whole audit log; throws naming the file and line on a malformed record.
std::vector<AuditRecord> read_audit_log(const std::string& path);

}  // namespace olmoref::data
