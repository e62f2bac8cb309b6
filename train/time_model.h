// train/time_model.h — one model of a training step's time per rank, beside the memory model (docs/memory.md,
// "Step time"): what `olmoref config --layout SxR --time` prints. Two halves:
//   - the step's work on each rank, counted from the same plans the trainer runs (BatchSplit, the FSDP units, the
//     instance tree's subtrees, the optimizer ranges): GEMM and attention FLOPs as `train --profile-ops` counts them,
//     the bytes the memory-bound ops stream, and the bytes each collective sends and receives, split into peers on
//     this node and on others. The bytes of the collectives that carry parameters and gradients are exact (each is
//     what `train --report-comm` measures under the same `what`: tests/train/time_model.sh); the expert all-to-all
//     depends on the routing and is estimated at balanced routing;
//   - the time of that work at stated rates (DeviceRates: data-sheet figures, a gemm_bench bench.json from a device
//     run, --rate overrides), for three transports: today's MPI through page-locked host memory with nothing overlapped,
//     NCCL on NVLink and the network, and NCCL with the next FSDP unit gathered under this one's compute.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/memory_model.h"

namespace olmoref {

// Rates in bytes or FLOPs per second; each per GPU and, for links, per direction.
struct DeviceRates {
  std::string name;
  double gemm_flops = 0;       // the exact GEMM (kernels::gemm_exact_device)
  double attention_flops = 0;  // the exact attention kernels
  double hbm_bytes = 0;        // device memory, for the memory-bound ops
  double nvlink_bytes = 0;     // GPU to GPU on one node
  double pcie_bytes = 0;       // device to host and back (MPI transport's staging)
  double host_copy_bytes = 0;  // MPI between the processes of one node (shared memory)
  double network_bytes = 0;    // GPU to GPU across nodes (one NIC per GPU)
  std::vector<std::string> notes;  // where the rates come from, one line each
};

// "h100" (H100 SXM) or "h200" (H200 SXM): data-sheet figures; throws std::invalid_argument otherwise.
DeviceRates device_rates(const std::string& gpu);
// --rate KEY=VALUE: gemm_tflops, attention_tflops, hbm_gbps, nvlink_gbps, pcie_gbps, host_copy_gbps, network_gbps
// (GB = 1e9 bytes). Throws std::invalid_argument naming the key and the keys there are.
void set_rate(DeviceRates& rates, const std::string& key_value);
// Rates measured on a device, from tools/gpu_check.sh's bench.json (a JSON array): the exact GEMM's from
// bench/gemm_bench.cu's rows (FLOPs over exact_seconds, so each shape weighs by its time), the exact attention's from
// bench/attention_bench.cu's rows at the attention shapes of `model` (when given, and every window its layers use has
// a row at seq_len: its forward and backward as launched, each row weighed by the layers with its window), else from
// bench/gpu_bench.sh's profile rows (its --profile-ops runs' attention FLOPs over their seconds). A rate without rows
// stays as it was. Throws std::runtime_error naming the file when it has neither a GEMM nor an attention row.
void rates_from_bench(DeviceRates& rates, const std::string& bench_json, const ModelConfig* model = nullptr,
                      int64_t seq_len = 0);

// One collective's bytes per step on one rank. `what` is the name the trainer gives it (dist::Comm's `what`).
struct CollectiveWork {
  std::string what;
  int64_t sent_on_node = 0, sent_off_node = 0;          // to ranks on this node / on other nodes
  int64_t received_on_node = 0, received_off_node = 0;  // from them
  bool exact = true;   // false: an estimate (the expert all-to-all at balanced routing)
  bool gather = false;  // an FSDP unit gather (what a prefetch can put under compute)
  int64_t sent() const { return sent_on_node + sent_off_node; }
  int64_t received() const { return received_on_node + received_off_node; }
};

struct StepWork {
  int rank = 0;
  int64_t tokens = 0;          // this rank's tokens per step
  double gemm_flops = 0;       // forward, backward and recompute, as ProfiledExecutor counts them (2·M·N·K)
  double attention_flops = 0;  // ProfiledExecutor's attention_forward and attention_backward
  double hbm_bytes = 0;        // the memory-bound ops' bytes: AdamW, the instance tree's adds, the step digest
  std::vector<CollectiveWork> collectives;
};

// Every rank's work per step, in rank order. ranks_per_node: rank r lives on node r / ranks_per_node.
std::vector<StepWork> predict_step_work(const TrainConfig& cfg, const MemoryPlacement& where, int ranks_per_node);

struct TimePart {
  std::string name;
  double seconds = 0;
};
// One transport's step.
struct StepTime {
  std::string transport;  // kTransports
  std::vector<TimePart> parts;
  double seconds = 0;     // the step: the parts in sequence, except what a prefetch hides
  std::string dominant;   // the largest part
};
// mpi: every unit gathered on the spot (`train --no-prefetch`); mpi+prefetch: the next unit's all-to-all on a thread
// of its own under this unit's work (train's default, dist::UnitGather), its staging copies still on the main thread;
// nccl, nccl+prefetch: issue 46's device-resident transport, without and with the prefetch.
inline const char* const kTransports[] = {"mpi", "mpi+prefetch", "nccl", "nccl+prefetch"};
StepTime predict_step_time(const StepWork& work, const DeviceRates& rates, const std::string& transport);

// The table `olmoref config --time` prints: the slowest rank's work (or rank `rank` when >= 0), then its step under
// each transport, and what dominates.
std::string time_table(const TrainConfig& cfg, const MemoryPlacement& where, int ranks_per_node,
                       const DeviceRates& rates, int rank = -1);

// What activation recompute costs and saves at this layout (`config --time`): for full, selected_blocks at a few
// block_intervals (each recomputing a different number of blocks) and none, the fullest rank's peak (memory_table's)
// and the step of the slowest rank over the run's transport with the prefetch. Every row trains the same bits.
std::string recompute_table(const TrainConfig& cfg, const MemoryPlacement& where, int ranks_per_node,
                            const DeviceRates& rates);

}  // namespace olmoref
