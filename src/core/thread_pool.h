// A fixed pool of worker threads for data-parallel loops. The calling thread takes part, so a pool
// of N threads runs N-1 workers. Workers spin briefly after a job, then sleep, so back-to-back
// decode kernels don't pay a wake-up each. parallel_for must not be called re-entrantly from a task.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items.
  // Returns when every chunk is done. fn must not throw.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // Calls fn(thread_index) once on each of the pool's threads (index 0 is the caller).
  void run_on_all(const std::function<void(int)>& fn);

 private:
  void worker_loop(int index);
  void run_job(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  // The current job.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  const std::function<void(int)>* all_fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  std::atomic<int64_t> next_{0};
};

// The process-wide pool used by the CPU backend. Created on first use with set_global_threads' count
// (default: hardware concurrency).
ThreadPool& global_pool();
void set_global_threads(int n_threads);

}  // namespace tandem
