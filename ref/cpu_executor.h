// ref/cpu_executor.h — the CPU executor: core/executor.h's ops as the canonical-order CPU kernels of ref/,
// threaded over non-reduction dimensions by a ThreadPool. Its memory is host memory.
#pragma once

#include "core/executor.h"

namespace olmoref {

class CpuExecutor final : public Executor {
 public:
  explicit CpuExecutor(ThreadPool* pool = nullptr) : pool_(pool) {}
  void set_pool(ThreadPool* pool) { pool_ = pool; }
  ThreadPool* pool() const { return pool_; }

  std::string name() const override { return "cpu"; }
  bool host_memory() const override { return true; }
  OLMOREF_EXECUTOR_OPS(, override)

 private:
  ThreadPool* pool_;
};

}  // namespace olmoref
