// model/executors.h — the executors by name: the one place that knows both twins, ref/ (the CPU reference) and
// kernels/ (the CUDA exact kernels), which implement core/executor.h's op table without knowing each other.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/executor.h"

namespace olmoref {

class ThreadPool;
// "cpu" (pool: its threads), "cuda" (the device; fails with one line naming the reason when there is none, or the
// build has no CUDA), "cuda-host" (the CUDA kernels' decompositions executed on the host).
std::unique_ptr<Executor> make_executor(const std::string& name, ThreadPool* pool);
// Why `name` cannot run here ("" when it can): checked at start, before any work.
std::string executor_unavailable(const std::string& name);
// The CUDA devices visible to this process (0 without CUDA in the build, a driver or a device).
int cuda_device_count();
// Drives CUDA device d from now on (before anything is allocated on it); its identity ("GPU-<uuid>") and name.
void use_cuda_device(int d, std::string* id, std::string* name);
// The CUDA executors' attention workspace for B instances of T tokens, H heads of hd (kernels/executor.h), for the
// memory model.
int64_t cuda_attention_workspace_bytes(int64_t B, int64_t H, int64_t T, int64_t hd);

}  // namespace olmoref
