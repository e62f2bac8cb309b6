#include "core/parallel.h"

#include <algorithm>
#include <chrono>
#include <memory>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace olmoref {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  n_threads_ = n_threads;
  // The calling thread runs part 0 itself, so only n-1 workers are started.
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

static inline void part_range(int64_t n, int parts, int index, int64_t* begin, int64_t* end) {
  const int64_t base = n / parts, extra = n % parts;
  *begin = index * base + std::min<int64_t>(index, extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until done() or about kSpin has passed; true if done() held.
template <class F>
bool spin_until(F&& done) {
  constexpr auto kSpin = std::chrono::microseconds(50);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > kSpin) return done();
  }
}

}  // namespace

void ThreadPool::worker_loop(int index) {
  int64_t seen_generation = 0;
  for (;;) {
    auto ready = [&] {
      return stopping_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen_generation;
    };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, ready);
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    seen_generation = generation_.load(std::memory_order_acquire);
    const std::function<void(int64_t, int64_t)>* job = job_;
    const int64_t n = job_n_;
    const int parts = job_parts_;
    if (index < parts) {
      int64_t b, e;
      part_range(n, parts, index, &b, &e);
      if (b < e) (*job)(b, e);
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int parts = static_cast<int>(std::min<int64_t>(n_threads_, (n + grain - 1) / grain));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_parts_ = parts;
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  int64_t b, e;
  part_range(n, parts, 0, &b, &e);
  fn(b, e);
  auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, finished);
  }
  job_ = nullptr;
}

static std::unique_ptr<ThreadPool>& default_pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}

ThreadPool& default_pool() {
  auto& slot = default_pool_slot();
  if (!slot) slot = std::make_unique<ThreadPool>(1);
  return *slot;
}

void set_default_threads(int n_threads) { default_pool_slot() = std::make_unique<ThreadPool>(n_threads); }

}  // namespace olmoref
