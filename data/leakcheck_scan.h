// data/leakcheck_scan.h — the leak check's holdout index and its scans of a training stream (data/leakcheck.cpp
// runs the stages; docs/formats/leakcheck.md). Internal to the leak check: its report is the interface.
#pragma once

#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "data/audit_check.h"
#include "data/leak_match.h"
#include "data/leakcheck.h"

namespace olmoref::data::leak {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double rate(int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; }

// One number through a printf format ("%.3f"), for the report's and the summary's text.
inline std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

inline uint64_t xxh3_u32(const uint32_t* t, int64_t n) { return XXH3_64bits(t, static_cast<size_t>(n) * sizeof(uint32_t)); }

// ---------------------------------------------------------------------------------------------
// The holdout: every token of its files, its documents, instance and document hashes, n-grams.

struct HoldoutDoc {
  int32_t file = 0;
  int64_t file_start = 0;  // first token in the file
  int64_t begin = 0;       // first token in Holdout::tokens
  int64_t len = 0;         // tokens, EOS included
};

struct Holdout {
  std::shared_ptr<const FslDataset> ds;
  std::vector<uint32_t> tokens;     // all holdout files, concatenated
  std::vector<int64_t> file_begin;  // offset of file f in tokens
  std::vector<HoldoutDoc> docs;
  bool docs_are_instances = false;  // no EOS known: each holdout instance (and file tail) is a document
  std::unordered_map<uint64_t, int64_t> instance_hash;  // XXH3 -> holdout instance
  std::unordered_map<uint64_t, int64_t> doc_hash;       // XXH3 -> document, documents >= min_doc_tokens
  int64_t ngram_positions = 0;

  const uint32_t* instance_tokens(int64_t id) const {
    const FslDataset::Location loc = ds->locate(id);
    return tokens.data() + file_begin[static_cast<size_t>(loc.file)] + loc.token_start;
  }
};

std::unique_ptr<Holdout> load_holdout(std::shared_ptr<const FslDataset> ds, std::optional<uint32_t> eos,
                                      int64_t min_doc_tokens);

// ---------------------------------------------------------------------------------------------
// Scanning the stream.

struct PartHits {
  std::unordered_map<int64_t, FirstCount> instances;  // holdout instance -> occurrences
  std::unordered_map<int64_t, FirstCount> docs;       // holdout document -> whole-document occurrences
  MatchSink matches;                                  // verbatim spans of holdout documents
  int64_t hash_mismatch = 0;
  std::vector<std::pair<uint64_t, int64_t>> delivered;  // (hash of the file path, first token) of each piece
  void merge(PartHits& o) {
    delivered.insert(delivered.end(), o.delivered.begin(), o.delivered.end());
    o.delivered.clear();
    for (auto& [k, v] : o.instances) instances[k].add(v);
    for (auto& [k, v] : o.docs) docs[k].add(v);
    matches.merge(o.matches);
    hash_mismatch += o.hash_mismatch;
    o.instances.clear();
    o.docs.clear();
  }
};

struct ScanContext {
  const Holdout& h;
  const HoldoutText& text;
  const SeedIndex& index;
  int ngram;
  int64_t L;             // tokens of a delivered piece
  int64_t instance_len;  // tokens of a holdout instance (the exact-instance check needs L == instance_len)
  std::optional<uint32_t> eos;
  int64_t min_doc_tokens;
};

struct StreamScan {
  PartHits hits;
  int64_t tokens = 0, instances = 0;
  double seconds = 0.0;
};

// Scans `steps` batches of the stream `base` delivers at world size W (each rank's loader in turn); rank r's audit
// log goes to audit_prefix + ".r<r>.jsonl".
StreamScan scan_stream(const LoaderConfig& base, int W, int64_t steps, const std::string& audit_prefix,
                       const ScanContext& ctx, ThreadPool& pool, int64_t chunk_tokens);

// The same scan over another framework's stream: pieces read by ext.read.
StreamScan scan_external(const ExternalStream& ext, int64_t steps, const ScanContext& ctx, ThreadPool& pool,
                         int64_t chunk_tokens);

// A span cut by an instance boundary leaves at most k - 1 of its tokens in the neighbouring instance, too few to seed
// a match there: when that neighbour (the same file's next or previous instance) was delivered too, its tokens are
// read and compared with the document's continuation, so the document's delivered run is not cut short by the cut.
void bridge_boundaries(StreamScan& scan, const std::vector<const FslDataset*>& datasets, const HoldoutText& text,
                       int k, int64_t L);

// Runs `world_size` rank loaders for `steps` batches with audit logs only; returns the union.
std::vector<AuditRecord> audit_stream(const LoaderConfig& base, int world_size, int64_t steps, const std::string& dir,
                                      const std::string& tag);

// The work directory of generated audit logs; a temporary one is removed with it.
struct TempDir {
  std::string path;
  bool remove = false;
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
};

}  // namespace olmoref::data::leak
