// train/memory_model.h — one model of a run's peak memory per rank, by component (docs/memory.md): what
// `olmoref config --layout` prints and what check_run_fits (train/trainer.h) refuses a run with. It describes the
// code as it is: the instance tree's full-length slots, the FSDP view of the whole vector on a device, every
// buffer the trainer and the model allocate. tests/train/memory.sh measures it against VmHWM.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/params.h"
#include "dist/expert_placement.h"
#include "train/config.h"

namespace olmoref {

// Where the run runs: dp_shard x dp_replicate ranks, an expert-parallel group size and the executor.
struct MemoryPlacement {
  int dp_shard = 1, dp_replicate = 1, ep = 1;
  std::string executor;  // "": the config's train.executor
  // "mpi" or "nccl" (train --transport): under nccl the owners' exchange blocks and the parameter all-gather live in
  // the executor's memory and an FSDP gather stages nothing on the host.
  std::string transport = "mpi";
  // train's default (--no-prefetch): on the kernel executors a second FSDP unit buffer and the owners' exchange's
  // second set of send blocks (its unit in flight under the next unit's backward)
  bool prefetch = true;
  int threads = 0;       // worker threads per rank (train --threads); 0: this machine's cores, as train's default
  int64_t dataset_instances = -1;  // -1: counted from the config's data files (none when they cannot be read)
};

// NCCL's own device memory per communicator (its channels' buffers, proxy state): an estimate until a device run
// measures it. NCCL's issue tracker reports 0.5-0.7 GB per communicator on 4-GPU NVLink nodes (issue 964; more with
// its collective algorithms, which olmoref never calls: it sends and receives only).
inline constexpr int64_t kNcclCommEstimateBytes = int64_t{512} << 20;

struct MemoryPart {
  std::string name;
  int64_t bytes = 0;
  std::string why;  // what it holds and what it grows with (one line)
};

// The fullest rank's peak. On `cuda` it is the GPU's memory (the host's are predict_host_memory's); on `cpu` and
// `cuda-host` the process's, including the constant baseline (binary, libraries, MPI, threads: measured), at the
// largest of its phases (the step, the checkpoint write, a resume).
struct RankMemory {
  int rank = 0;        // the rank with the largest peak (the first of them)
  bool device = false;  // the parts are GPU memory
  std::vector<MemoryPart> parts;
  int64_t peak() const;
  const MemoryPart& largest() const;
};

// The process's own resident memory besides the run's buffers (binary, libraries, the MPI runtime, the thread
// pool), measured: the VmHWM of configs/tiny.toml runs under mpirun (1, 2 and 4 ranks, one step) less the 11.5 MiB
// this model predicts for their buffers was 20-24 MiB on a 2-core x86-64 VM; 11 MiB without mpirun (docs/memory.md).
inline constexpr int64_t kProcessBaselineBytes = int64_t{22} << 20;

// Throws std::invalid_argument (naming the flag or key) for a placement the trainer would refuse.
RankMemory predict_rank_memory(const TrainConfig& cfg, const MemoryPlacement& where);

// The table `olmoref config --layout` prints: one line per part, then the peak.
std::string memory_table(const TrainConfig& cfg, const MemoryPlacement& where, const RankMemory& m);

// What would bring the peak under `available` bytes, each tried with predict_rank_memory: a smaller micro-batch,
// recompute ("full"), more ranks (dp_shard); "" when none of them does.
std::string memory_alternatives(const TrainConfig& cfg, const MemoryPlacement& where, int64_t available);

std::string gib_text(double bytes);  // "12.34 GiB"

// Host memory of the fullest rank in each phase of a run, by part: the step, the checkpoint write after it, and a
// resume (a fresh process reading its part of a checkpoint). On cpu and cuda-host the step is the RankMemory table;
// on cuda the host holds the exchange's staging, the digest's blocks, the data order and the batch. What every rank
// keeps whatever the model (the data order: 4 bytes per dataset instance) is counted on every rank.
struct HostPhase {
  std::string name;
  std::vector<MemoryPart> parts;
  int64_t peak() const;
};
struct HostMemory {
  int rank = 0;
  std::vector<HostPhase> phases;  // step, checkpoint write, resume
  const HostPhase& fullest() const;
};
HostMemory predict_host_memory(const TrainConfig& cfg, const MemoryPlacement& where);
// The three phases side by side, part by part, with the peak per rank and per node (ranks_per_node x the fullest).
std::string host_memory_table(const TrainConfig& cfg, const MemoryPlacement& where, const HostMemory& h,
                              int ranks_per_node);
// Instances of seq_len in the config's training data (each file cut into whole instances), -1 when a file cannot
// be read.
int64_t dataset_instances_of(const TrainConfig& cfg);

// Every expert's rows of each MoE weight tensor (w1, w2, w3: [E·h, d] per layer): what expert-resident state may
// leave out (dist::StatePlacement), for the trainer and this model alike.
std::vector<dist::ExpertSpan> expert_spans(const ParamLayout& layout, const ModelConfig& m);

}  // namespace olmoref
