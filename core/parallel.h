// core/parallel.h — a small fixed-size thread pool.
//
// Determinism rule: work is only ever split over *non-reduction* dimensions (rows of an output,
// heads, tokens), so how many threads run and which thread takes which range never changes a bit
// of any result. Nothing here reduces floating-point values across threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace olmoref {

class ThreadPool {
 public:
  // n_threads <= 0 means "hardware concurrency".
  explicit ThreadPool(int n_threads = 1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), blocking until all are done.
  // `grain` is the smallest range worth handing to a thread. The ranges are contiguous and
  // statically assigned; callers must not depend on which thread runs which range.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // A hand-off is a generation bump; workers (and the caller, for completion) spin on the atomics for a few tens
  // of microseconds before sleeping on the condition variables, since a training step hands off ~1,000 small ops
  // and a futex wake-up costs about as much as one of them. The job fields are written before the release
  // increment of generation_ and read after its acquire load.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_parts_ = 0;
  std::atomic<int64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
};

// A process-wide default pool, sized by set_default_threads() (the CLI's --threads).
ThreadPool& default_pool();
void set_default_threads(int n_threads);

}  // namespace olmoref
