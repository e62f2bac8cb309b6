// data/leakcheck_stages.h — the stages of `run_leakcheck` (data/leakcheck.cpp) and what they hand each other, in
// the order they run:
//
//   prepare_run                 the run's shape, the loader under test, the holdout dataset, the steps, the work dir
//   build_holdout_index         the holdout's tokens and documents, and the seed n-gram index over them
//   stream_training_instances   the stream as the loader delivers it, and the reference that decides the cause
//   classify_documents          every holdout document with something delivered, on every level; cause; accepted
//   check_shared_files, check_exact_instances   the file-level and instance-level findings
//   audit_loader                partition, exactly-once, resume and layout checks of the loader; a run's own logs
//   write_report                the JSON report, and the lines for people read from it
//
// Internal to the leak check: its report (docs/formats/leakcheck.md) is the interface.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/leakcheck_scan.h"

namespace olmoref::data::leak {

using AcceptList = std::set<std::pair<std::string, int64_t>>;  // (holdout file, first token) of a document

// The run under check, fixed once prepared: every later stage reads it.
struct LeakRun {
  explicit LeakRun(const LeakCheckOptions& options) : o(options) {}
  const LeakCheckOptions& o;
  LoaderConfig base;                        // the run's loader configuration, without audit log, prefetching
  const ExternalStream* ext = nullptr;      // another framework's stream instead of the loader's
  int64_t G = 0, mb = 0, M = 0;             // instances per step, per micro-batch; micro-batches per step
  int64_t L = 0, bpe = 0;                   // sequence length; batches per epoch
  int W = 1;                                // ranks of the scanned stream
  int64_t steps = 0;                        // steps checked, from step 1
  std::unique_ptr<Loader> probe;            // the loader under test, for the dataset it serves (none for ext)
  std::shared_ptr<const FslDataset> holdout_ds;
  std::optional<uint32_t> eos;
  std::vector<AuditRecord> external;        // --audit: a real run's logs
  TempDir work;
  const FslDataset& configured() const { return *base.dataset; }
};

// Throws, naming the option, for what cannot be checked.
void prepare_run(const LoaderConfig& loader_config, LeakRun& run);

struct HoldoutIndex {
  std::unique_ptr<Holdout> hold;
  HoldoutText text;                   // views hold->tokens
  std::unique_ptr<const SeedIndex> index;  // over text
  double seconds = 0.0;
};

void build_holdout_index(const LeakRun& run, HoldoutIndex& out);

struct Streams {
  StreamScan scanned;
  StreamScan reference_owned;
  bool separate_reference = false;  // a planted loader bug: a correct loader's stream decides the cause
  const StreamScan& reference() const { return separate_reference ? reference_owned : scanned; }
};

void stream_training_instances(const LeakRun& run, const HoldoutIndex& holdout, ThreadPool& pool, Streams& out);

// One overlap level's check and counts (exact, verbatim, ngram_fraction, near_duplicate).
struct LevelCheck {
  CheckResult check;
  int64_t documents = 0, accepted = 0;
  std::map<std::string, int64_t> by_cause;
};

inline constexpr const char* kLevelNames[] = {"exact", "verbatim", "ngram_fraction", "near_duplicate"};
inline constexpr const char* kLevelChecks[] = {"exact_documents", "verbatim_spans", "ngram_fraction", "near_duplicates"};

struct DocumentFindings {
  LevelCheck levels[4];
  std::map<std::string, int64_t> cause_counts;
  int64_t judged = 0, contaminated_count = 0, accepted_count = 0, since_count = 0;
  AcceptList accept_used;
  nlohmann::json contaminated = nlohmann::json::array(), partial = nlohmann::json::array();
  std::vector<int64_t> first_steps;  // per contaminated document: its first delivery's step
};

DocumentFindings classify_documents(const LeakRun& run, const HoldoutIndex& holdout, const Streams& streams,
                                    const AcceptList& accept_list);

nlohmann::json check_shared_files(const LeakRun& run);
nlohmann::json check_exact_instances(const LeakRun& run, const Streams& streams);

// Adds audit_partition, audit_exactly_once, audit_resume, audit_layout (and external_audit) to `checks`.
void audit_loader(const LeakRun& run, const Holdout& hold, const StreamScan& reference, nlohmann::json& checks);

struct ReportInputs {
  const LeakRun& run;
  const HoldoutIndex& holdout;
  const Streams& streams;
  const DocumentFindings& docs;
  const AcceptList& accept_list;
  const nlohmann::json& checks;
  int threads = 0;
  double seconds = 0.0;  // the whole check
};

// Fills rep.json, rep.contaminated, rep.audit_failed and rep.summary.
void write_report(const ReportInputs& in, LeakReport& rep);

}  // namespace olmoref::data::leak
