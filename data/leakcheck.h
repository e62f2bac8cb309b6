// data/leakcheck.h — the holdout leakage detector (`olmoref leakcheck`; docs/formats/leakcheck.md).
//
// It answers "which holdout documents did the model see, how much of each, from where, and since when". It drives
// the real Loader (data/loader.h) with the run's configuration and reads the training stream exactly as the loader
// delivers it, step by step, rank by rank; only what that stream delivers counts (dropped file tails, the cropped
// last batch of an epoch and steps after --steps never do). Every holdout document (EOS-delimited) is matched
// against each delivered instance by seed-and-extend (data/leak_match.h) and judged on four levels:
//
//   exact            the whole document lies inside a delivered instance
//   verbatim         a verbatim span of at least verbatim_tokens (32) tokens was delivered
//   ngram_fraction   at least ngram_fraction (0.5) of the document's n-grams (n = 13) were delivered
//   near_duplicate   at least near_duplicate (0.8) of the document's tokens were delivered inside verbatim
//                    spans of at least seed_ngram (8) tokens: survives a token changed, inserted or deleted
//                    every 9 or more tokens
//
// A document over any level is contaminated, with a cause: `data` when the configured training data, as a correct
// loader delivers it over the same steps, holds the delivered text; `loader` when it does not (the loader put it
// there); `both`. Contamination makes the status `contaminated` (exit 1) unless its cause is `data` and the user
// accepted it (allow_data_overlap, or the document listed in accept_file). The other checks:
//
//   shared_files       a training file that is also a holdout file (same path, or same size and XXH3)
//   exact_instances    a training instance whose XXH3 equals a holdout instance's, verified token by token
//   audit_partition    the ranks' micro-batches partition each global batch (data/audit_check.h), for
//                      the scanned layout and every layout of the invariance check
//   audit_exactly_once each instance at most once per epoch, no step or instance skipped
//   audit_resume       stopping after step k (loader state through its JSON form) and continuing in a
//                      fresh loader gives the uninterrupted stream, for several k
//   audit_layout       W = 2, 4, 8 ranks (each rank its own loader and audit log) give the W = 1 stream
//   external_audit     audit logs of a real run (--audit, any mix of layouts and resumes): the same audit
//                      checks, equality with the configured stream, their XXH3s against the holdout instances
//
// The report (JSON, docs/formats/leakcheck.md) lists every contaminated document with its first delivery (step,
// micro-batch, rank, instance, training file and offset), deliveries, longest span, fractions, cause; counts per
// level and cause; the evaluations the contamination affects; the first offence of each check.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"

namespace olmoref::data {

// A training stream olmoref's loader does not produce: another framework's run, reconstructed from that framework's
// own files (interop/megatron_data.h). Step s (1-based, the framework's numbering) trains on pieces
// [(s - 1) * pieces_per_step, s * pieces_per_step), each piece_tokens long.
struct ExternalStream {
  std::string framework;          // "megatron"
  std::string source;             // the token file positions name
  int64_t piece_tokens = 0;
  int64_t pieces_per_step = 0;
  int64_t pieces_per_microbatch = 0;  // 0: not known
  int64_t steps = 0;              // steps available (the checked steps are min(this, LeakCheckOptions::steps))
  int64_t steps_per_epoch = 0;    // 0: the framework's epochs are not reported
  std::function<void(int64_t piece, std::span<uint32_t> out)> read;  // called from several threads at once
  // Optional: the token file and first token of a piece, when it is one contiguous range of a file of the
  // loader configuration's dataset (OLMo-core's instances; Megatron's samples span documents, so they have none).
  std::function<std::pair<std::string, int64_t>(int64_t piece)> locate;
  nlohmann::json info;            // framework-specific fields for the report's "run"
};

// The levels over which a holdout document counts as contaminated (docs/formats/leakcheck.md "Levels" gives the
// rationale and the measured precision and recall of the defaults).
struct LeakLevels {
  int64_t verbatim_tokens = 32;  // a delivered verbatim span this long
  int ngram = 13;                // n of the n-gram fraction
  double ngram_fraction = 0.5;   // this share of the document's n-grams delivered
  int seed_ngram = 8;            // k: verbatim pieces shorter than this are not seen at all
  double near_duplicate = 0.8;   // this share of the document's tokens delivered in pieces of >= k tokens
};

struct LeakCheckOptions {
  int64_t steps = 0;             // steps of the stream to check, from step 1
  bool whole_epoch = false;      // check every batch of the first epoch (overrides steps)
  LeakLevels levels;
  // The seed probe's prefilter: a Bloom filter (4 B per holdout n-gram, cache-friendly) or the exact open-addressing
  // set (16 B). Every positive is verified against the postings token by token either way, so the report is the
  // same; the Bloom filter is faster on a holdout whose set outgrows the caches.
  bool bloom = true;
  double bloom_bits_per_ngram = 32.0;
  int64_t min_doc_tokens = 8;    // the exact-document check ignores shorter documents (EOS included)
  std::optional<uint32_t> eos_id;  // default: the dataset's; unknown -> holdout instances act as documents
  int world_size = 1;            // the layout the scanned stream uses (ranks in the report)
  std::vector<int> layouts;      // layout check: world sizes compared with W = 1 (empty: 2, 4, 8 where they divide)
  std::vector<int64_t> resume_at;  // resume check: stop after these steps (empty: mid-run and around epoch ends)
  bool attribute = true;         // find the cause (data vs loader) of each contaminated document
  bool allow_data_overlap = false;  // accept every document whose cause is `data` (listed, not failed)
  std::string accept_file;       // accept these documents when their cause is `data` (lines "HOLDOUT_FILE TOKEN_START")
  int64_t since = 0;             // only deliveries after this step count (0: all)
  int64_t eval_interval = 0;     // the run's [eval] interval: which evaluations the contamination affects
  bool audit_checks = true;      // partition / exactly-once / resume / layout
  bool content_check = true;     // partition check re-reads every instance to compare its XXH3
  std::vector<std::string> audit_logs;  // audit logs of a run to check as well (all ranks' files)
  int threads = 0;               // scan threads (<= 0: hardware)
  std::string work_dir;          // where generated audit logs go (empty: a temporary directory, removed)
  int64_t chunk_tokens = int64_t{1} << 22;  // tokens handed to the scan threads at once
  std::string config_path;       // for the report only
  // Check this stream instead of the loader's: the overlap levels only (no audit checks, no shared-file check);
  // the loader configuration then only says how to read the holdout.
  const ExternalStream* external = nullptr;
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

// The accept file (--accept): holdout documents known to be in the training data, one "HOLDOUT_FILE TOKEN_START"
// per line ('#' comments). Empty path: none. Throws naming the file and line.
std::set<std::pair<std::string, int64_t>> read_leak_accept_file(const std::string& path);

}  // namespace olmoref::data
