#include "dist/side_stream.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/delayed_worker.h"
#include "dist/nccl_comm.h"

#if OLMOREF_HAVE_NCCL
#include "kernels/device_memory.h"
#endif

namespace olmoref::dist {

namespace {

#if OLMOREF_HAVE_NCCL
class DeviceSide final : public SideStream {
 public:
  DeviceSide() : device_(kernels::current_device()) {}
  void wait_for_default() override { s_.wait_for_default(); }
  void default_waits() override { s_.default_waits(); }
  void copy(void* dst, const void* src, size_t bytes) override { s_.copy(dst, src, bytes); }
  void run(std::function<void()> ops) override {
    const kernels::StreamScope on_this(s_.stream());
    ops();
  }
  void synchronize() override { s_.synchronize(); }
  void enter_thread() override { kernels::use_device(device_); }  // a new thread starts on device 0
  void* stream() override { return s_.stream(); }

 private:
  kernels::SideStream s_;
  int device_;
};
#endif

// The host execution's copies: the executor's work has run by the time a copy is queued, so nothing here waits for it;
// the copies run in order on a worker thread, each after the pause.
class HostSide final : public SideStream {
 public:
  void wait_for_default() override {}
  void default_waits() override { synchronize(); }
  void copy(void* dst, const void* src, size_t bytes) override {
    worker_.queue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  void run(std::function<void()> ops) override { worker_.queue(std::move(ops)); }
  void synchronize() override { worker_.synchronize(); }

 private:
  DelayedWorker worker_;
};

// The host execution under the tests' stand-in NCCL: groups queued on the stand-in's stream run later on its worker
// thread, as a device's side stream would run them.
class StandinSide final : public SideStream {
 public:
  StandinSide() : s_(standin_stream_create()) {
    if (!s_) throw std::logic_error("side stream: NCCL on cuda-host without the stand-in NCCL's streams");
  }
  ~StandinSide() override { standin_stream_destroy(s_); }
  void wait_for_default() override {}
  void default_waits() override { synchronize(); }
  void copy(void*, const void*, size_t) override { throw std::logic_error("side stream: NCCL's groups only"); }
  void run(std::function<void()> ops) override {
    standin_stream_queue(s_, [](void* task) {
      const std::unique_ptr<std::function<void()>> owned(static_cast<std::function<void()>*>(task));
      (*owned)();
    }, new std::function<void()>(std::move(ops)));
  }
  void synchronize() override { standin_stream_synchronize(s_); }
  void* stream() override { return s_; }

 private:
  void* s_;
};

}  // namespace

std::unique_ptr<SideStream> make_side_stream(const Executor& ex, SideWork work) {
#if OLMOREF_HAVE_NCCL
  if (ex.name() == "cuda") return std::make_unique<DeviceSide>();
#endif
  if (ex.name() == "cuda-host") {
    if (work == SideWork::nccl_groups) return std::make_unique<StandinSide>();
    return std::make_unique<HostSide>();
  }
  throw std::logic_error("side stream: executor " + ex.name() + " has none");
}

}  // namespace olmoref::dist
