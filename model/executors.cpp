#include "model/executors.h"

#include <stdexcept>

#include "kernels/executor.h"
#include "ref/cpu_executor.h"
#if OLMOREF_HAVE_CUDA
#include "kernels/device_memory.h"
#endif

namespace olmoref {

std::string executor_unavailable(const std::string& name) {
  if (name == "cpu" || name == "cuda-host") return "";
  if (name != "cuda") return "unknown executor \"" + name + "\" (choose cpu, cuda or cuda-host)";
#if OLMOREF_HAVE_CUDA
  return kernels::device_unavailable_reason();
#else
  return "this olmoref was built without CUDA (no nvcc when it was configured); rebuild on a machine with the CUDA "
         "toolkit, or use --executor cpu";
#endif
}

int cuda_device_count() {
#if OLMOREF_HAVE_CUDA
  return kernels::visible_device_count();
#else
  return 0;
#endif
}

void use_cuda_device(int d, std::string* id, std::string* name) {
#if OLMOREF_HAVE_CUDA
  kernels::select_device(d, id, name);
#else
  (void)d, (void)id, (void)name;
  throw std::runtime_error("this olmoref was built without CUDA: no device to select");
#endif
}

std::unique_ptr<Executor> make_executor(const std::string& name, ThreadPool* pool) {
  const std::string why = executor_unavailable(name);
  if (!why.empty()) throw std::runtime_error("executor " + name + ": " + why);
  if (name == "cpu") return std::make_unique<CpuExecutor>(pool);
  return std::make_unique<kernels::KernelExecutor>(name == "cuda");
}

int64_t cuda_attention_workspace_bytes(int64_t B, int64_t H, int64_t T, int64_t hd) {
  return kernels::attention_workspace_bytes(B, H, T, hd);
}

}  // namespace olmoref
