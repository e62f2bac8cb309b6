// dist/side_stream.h — a stream beside the executor's, for data movement that runs under its work: the next FSDP
// unit's gather (dist::UnitGather) and, over NCCL, a unit's gradient exchange to its owners (dist::OwnerReduction).
//
// On a device it is a CUDA stream (kernels::SideStream), ordered against the executor's (the legacy default stream)
// only by the two waits below. The host execution (cuda-host) runs the executor's work on the calling thread as it is
// queued, so what a device would run later on a side stream runs later here too, in order on a worker thread
// (core/delayed_worker.h, each task OLMOREF_TEST_HOST_STREAM_DELAY_US late): a wait the device needs and the code
// lacks then shows in cuda-host's bits, which CI compares.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "core/executor.h"

namespace olmoref::dist {

class SideStream {
 public:
  virtual ~SideStream() = default;
  // Work queued here from now on waits for everything the executor has queued so far.
  virtual void wait_for_default() = 0;
  // The executor's work from now on waits for everything queued here so far.
  virtual void default_waits() = 0;
  // A copy queued here (either direction; host memory page-locked on a device, or the copy is not asynchronous).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Executor ops queued here, in order with the rest: on a device `ops` runs now, its kernels and device copies
  // launched onto this stream (kernels::StreamScope); in the host execution it runs later on the worker, on the
  // executor's host execution (whose ops share no state between threads). What `ops` reads must outlive it.
  virtual void run(std::function<void()> ops) = 0;
  virtual void synchronize() = 0;             // the host waits for everything queued here
  virtual void enter_thread() {}              // on another thread, before its first call (a device's: made current)
  virtual void* stream() { return nullptr; }  // a cudaStream_t, or the stand-in NCCL's stream, for NCCL's groups
};

// What runs on the side stream: the executor's copies (the MPI transport's staged prefetch), or NCCL's groups.
enum class SideWork { copies, nccl_groups };

// The side stream for executor `ex` ("cuda": a CUDA stream on the current device; "cuda-host": a worker thread for
// copies, or for NCCL's groups the tests' stand-in NCCL's stream, refused without the stand-in). Other executors
// have none: logic_error.
std::unique_ptr<SideStream> make_side_stream(const Executor& ex, SideWork work);

}  // namespace olmoref::dist
