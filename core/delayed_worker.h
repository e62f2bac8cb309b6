// core/delayed_worker.h — a stream of the host execution: tasks queued from one thread run in order on a worker
// thread, each after a pause, and synchronize() waits for everything queued so far.
//
// Where a device would run work later on a stream of its own (an asynchronous copy, an NCCL group), the host execution
// (executor cuda-host) runs it here instead, so that the waits the device needs run on the CPU too; the pause
// (OLMOREF_TEST_HOST_STREAM_DELAY_US, default 0) widens the window a missing wait would leave open, so that it shows in
// the bits. Used by dist::UnitGather's staged prefetch and by the tests' stand-in NCCL (tests/dist/nccl_standin.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace olmoref {

class DelayedWorker {
 public:
  DelayedWorker() : delay_us_(delay_from_env()), worker_([this] { run(); }) {}
  // Runs what is queued, then stops.
  ~DelayedWorker() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }
  DelayedWorker(const DelayedWorker&) = delete;
  DelayedWorker& operator=(const DelayedWorker&) = delete;

  void queue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(m_);
      tasks_.push_back(std::move(task));
      ++queued_;
    }
    wake_.notify_all();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(m_);
    const uint64_t target = queued_;
    done_cv_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  static int delay_from_env() {
    const char* v = std::getenv("OLMOREF_TEST_HOST_STREAM_DELAY_US");
    return v ? std::atoi(v) : 0;
  }
  void run() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopped, nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
      task();
      lock.lock();
      ++done_;
      done_cv_.notify_all();
    }
  }

  const int delay_us_;
  std::mutex m_;
  std::condition_variable wake_, done_cv_;
  std::deque<std::function<void()>> tasks_;
  uint64_t queued_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread worker_;  // last: started once the rest is made
};

}  // namespace olmoref
