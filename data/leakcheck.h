// data/leakcheck.h — the holdout leakage detector (`olmoref leakcheck`;
// research/determinism-and-contamination.md §5).
//
// It drives the real Loader (data/loader.h) with the run's configuration and checks the training
// stream exactly as the loader delivers it, step by step, rank by rank:
//
//   shared_files       a training file that is also a holdout file (same path, or same size and XXH3)
//   static_ngrams      the same n-gram overlap against every token of the configured training files,
//                      without the loader: near-duplicates the data itself shares with the holdout. A
//                      warning (near-duplicates are not a loader bug) unless strict
//   exact_instances    a training instance whose XXH3 equals a holdout instance's (holdout cut at the
//                      training sequence length), verified token by token
//   exact_documents    a complete holdout document (EOS-delimited, at least min_doc_tokens tokens)
//                      found inside a training instance, verified token by token
//   near_ngrams        token n-grams (n = 13 by default) of holdout documents found in the stream:
//                      per document the fraction of its n-grams that occur in training; a document
//                      counts as contaminated when the n-grams the stream holds but the configured
//                      training data does not (see static_ngrams) reach near_threshold of it: that
//                      part can only have come from the loader. Exact set (16 B/n-gram) or Bloom
//                      filter (4 B/n-gram) + exact re-verification of every candidate.
//   audit_partition    the ranks' micro-batches partition each global batch (data/audit_check.h), for
//                      the scanned layout and every layout of the invariance check
//   audit_exactly_once each instance at most once per epoch, no step or instance skipped
//   audit_resume       stopping after step k (loader state through its JSON form) and continuing in a
//                      fresh loader gives the uninterrupted stream, for several k
//   audit_layout       W = 2, 4, 8 ranks (each rank its own loader and audit log) give the W = 1 stream
//   external_audit     audit logs of a real run (--audit): the same audit checks, equality with the
//                      configured stream, and their XXH3s against the holdout instances
//
// The report (JSON, docs/formats/leakcheck.md) holds counts and rates per check, the first offending
// (step, micro-batch, rank, instance) of each, and every contaminated holdout document with its hit
// fraction; exit status 1 when contamination or an audit failure is found.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"

namespace olmoref::data {

struct LeakCheckOptions {
  int64_t steps = 0;             // steps of the stream to check, from step 1
  bool whole_epoch = false;      // check every batch of the first epoch (overrides steps)
  int ngram = 13;
  bool bloom = false;            // Bloom filter + exact re-verification instead of the exact set
  double bloom_bits_per_ngram = 32.0;
  double near_threshold = 0.5;   // a holdout document with this fraction of its n-grams hit is contaminated
  int64_t min_doc_tokens = 8;    // exact document matches ignore shorter documents (EOS included)
  std::optional<uint32_t> eos_id;  // default: the dataset's; unknown -> holdout instances act as documents
  int world_size = 1;            // the layout the scanned stream uses (ranks in the report)
  std::vector<int> layouts;      // layout check: world sizes compared with W = 1 (empty: 2, 4, 8 where they divide)
  std::vector<int64_t> resume_at;  // resume check: stop after these steps (empty: mid-run and around epoch ends)
  bool static_check = true;      // scan the configured training files too: attributes overlap to data vs loader
  bool strict = false;           // data-level near-duplicates (static_ngrams) fail the check instead of warning
  bool audit_checks = true;      // partition / exactly-once / resume / layout
  bool content_check = true;     // partition check re-reads every instance to compare its XXH3
  std::vector<std::string> audit_logs;  // audit logs of a run to check as well (all ranks' files)
  int threads = 0;               // scan threads (<= 0: hardware)
  std::string work_dir;          // where generated audit logs go (empty: a temporary directory, removed)
  int64_t chunk_tokens = int64_t{1} << 22;  // tokens handed to the scan threads at once
  std::string config_path;       // for the report only
};

struct LeakReport {
  nlohmann::json json;
  std::string summary;  // a few lines for people
  bool contaminated = false;
  bool audit_failed = false;
  int exit_code() const { return contaminated || audit_failed ? 1 : 0; }
  // The report entry of one check ("near_ngrams", "audit_partition", ...).
  const nlohmann::json& check(const std::string& name) const { return json.at("checks").at(name); }
};

// `loader` is the run's loader configuration exactly as the trainer builds it (dataset, seed,
// batch shape, holdout; debug_bug for the planted-bug tests). Its audit, world_size and rank are
// ignored: the detector sets its own per layout. Throws if the run has no holdout.
LeakReport run_leakcheck(const LoaderConfig& loader, const LeakCheckOptions& options);

}  // namespace olmoref::data
