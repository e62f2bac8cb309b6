#include "train/manifest.h"

#include "data/dataset.h"
#include "interop/olmo_core_data.h"
#include "train/batch_source.h"

#include <sys/utsname.h>

#include <fstream>
#include <thread>

#include "golden/trace.h"
#include "ref/gemm.h"

#ifndef OLMOREF_ISA
#define OLMOREF_ISA "unknown"
#endif

namespace olmoref {

nlohmann::json build_facts() {
  return {{"olmoref_version", "0.1.0"},
          {"compiler", std::string("gcc ") + __VERSION__},
          {"cpu_isa_build", OLMOREF_ISA},
          {"fp_flags", "-ffp-contract=off -fno-fast-math"},
          {"gemm_path", gemm_isa_name(active_gemm_isa())},
          {"gpu_archs", OLMOREF_GPU_ARCHS}};  // sm_XX the CUDA kernels are built for (when nvcc was found)
}

nlohmann::json machine_facts() {
  nlohmann::json j;
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line))
    if (line.rfind("model name", 0) == 0) {
      j["cpu"] = line.substr(line.find(':') + 2);
      break;
    }
  j["hardware_threads"] = std::thread::hardware_concurrency();
  struct utsname u{};
  if (uname(&u) == 0) j["os"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  return j;
}

void write_run_manifest(const std::string& path, const TrainConfig& cfg, int threads, int dp_shard, int dp_replicate,
                        int ep, const nlohmann::json& gpus, bool allow_shared_gpu, const std::string& transport) {
  nlohmann::json j;
  j["format"] = "olmoref-run/1";
  j["trace_format"] = kTraceFormat;
  j["config_toml"] = cfg.to_toml();
  j["config_source"] = cfg.source_path;
  j["overrides"] = cfg.overrides;
  j["precision"] = cfg.train.precision;
  j["executor"] = cfg.train.executor;
  j["threads"] = threads;
  j["dp_shard"] = dp_shard;
  j["dp_replicate"] = dp_replicate;
  j["ep"] = ep;
  if (dp_shard * dp_replicate > 1) j["transport"] = transport;
  if (!gpus.is_null()) {
    j["gpus"] = gpus;
    j["allow_shared_gpu"] = allow_shared_gpu;
  }
  j["n_params"] = cfg.model.n_params();
  j["flops_per_token"] = cfg.model.flops_per_token(cfg.train.seq_len);
  // The dataset both ways: olmoref's fingerprint (checkpoints check it) and OLMo-core's (what an OLMo-core run over
  // the same files records; it hashes the pad and bos ids too), so the two runs can be matched by their manifests.
  try {
    const data::FslDataset ds(train_mix(cfg.data), dataset_options(cfg));
    nlohmann::json d = {{"fingerprint", ds.fingerprint()}, {"instances", ds.size()}};
    if (ds.eos_id() && cfg.data.pad_id >= 0)
      d["olmo_core_fingerprint"] = interop::olmo_core_fingerprint_of(ds, cfg.data.pad_id, cfg.data.bos_id);
    else
      d["olmo_core_fingerprint"] = nullptr, d["olmo_core_fingerprint_needs"] = "data.eos_id and data.pad_id";
    j["data"] = d;
  } catch (const std::exception& e) {
    j["data"] = {{"error", e.what()}};
  }
  j["build"] = build_facts();
  j["machine"] = machine_facts();
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error(path + ": cannot write manifest");
}

}  // namespace olmoref
