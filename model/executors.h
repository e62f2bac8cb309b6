// model/executors.h — the executors by name: the one place that knows both twins, ref/ (the CPU reference) and
// kernels/ (the CUDA exact kernels), which implement core/executor.h's op table without knowing each other.
#pragma once

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

}  // namespace olmoref
