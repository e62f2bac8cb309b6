// train/resume_check.h — `olmoref resume-check`: proves that resuming changes nothing.
//
// Runs the configured run for N steps uninterrupted and, for each K, in fresh processes: runs to K
// (checkpointing at K), stops, resumes from that checkpoint and finishes. Every step's trace record
// (loss bits, grad-norm bits, data digest, parameter digest, LR bits) and the final state digests
// (parameters, Adam m and v from the last checkpoint) must be identical. The resumed part may run at another
// data-parallel layout (--resume-layout, through mpirun) and with other settings that must not change the bits
// (--resume-set, e.g. train.micro_batch_instances): tiers T3 and T6 across a restart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace olmoref {

struct ResumeCheckOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 0;
  std::vector<int64_t> at;
  int threads = 0;
  std::string work_dir;                 // default: a fresh temporary directory, removed on success
  std::vector<std::string> extra_resume_args;  // e.g. --debug-skip-restore moments (negative controls)
  std::vector<std::string> resume_overrides;   // --set for the resumed runs only
  int dp_shard = 1, dp_replicate = 1;               // the uninterrupted run and the runs up to K
  int resume_dp_shard = 0, resume_dp_replicate = 0;  // the resumed runs (0: as above)
  int ep = 1, resume_ep = 0;                        // expert parallelism (--ep) of the two parts (0: as above)
  bool quiet = false;
  bool allow_shared_gpu = false;  // every run's `train --allow-shared-gpu` (executor cuda, ranks on one card)
};

// 0: every step identical; 1: a difference; 2: could not verify (a run failed, a trace is missing).
int resume_check(const ResumeCheckOptions& opts);

}  // namespace olmoref
