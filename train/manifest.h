// train/manifest.h — the run manifest: what ran, how, built how, on what.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "train/config.h"

namespace olmoref {

nlohmann::json build_facts();    // version, compiler, flags, ISA, GEMM path
nlohmann::json machine_facts();  // CPU model, cores, OS
// gpus: each rank's GPU ([{rank, host, device, id, name}], dist/gpu_map.h; null when the executor drives none) and
// whether ranks were allowed to share one. transport: how the ranks' exchanges moved ("mpi" or "nccl", train
// --transport; recorded when there are several ranks).
void write_run_manifest(const std::string& path, const TrainConfig& cfg, int threads, int dp_shard = 1,
                        int dp_replicate = 1, int ep = 1, const nlohmann::json& gpus = nullptr,
                        bool allow_shared_gpu = false, const std::string& transport = "mpi");

}  // namespace olmoref
