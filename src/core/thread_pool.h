// A fixed pool of worker threads for data-parallel loops. The calling thread takes part, so a pool
// of N threads runs N-1 workers. Workers spin briefly after a job (200 µs unless told otherwise), then
// sleep, so back-to-back decode kernels don't pay a wake-up each; the caller never waits for a sleeping
// worker to wake up before it starts on the chunks itself. A process that owns its cores (the peer) may
// let its workers spin longer: waking a sleeping thread costs tens of µs on a VM, more than a pass's
// share of the step at a few rows. One caller at a time: parallel_for and run_on_all must not be
// called concurrently on one pool, nor re-entrantly from a task (both are asserted).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  static constexpr int64_t kDefaultSpinUs = 200;
  // n_threads <= 0: hardware concurrency. spin_us: how long an idle worker polls before it sleeps.
  explicit ThreadPool(int n_threads, int64_t spin_us = kDefaultSpinUs);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items.
  // Returns when every chunk is done. fn must not throw.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
  // Same without the type erasure of std::function (no allocation for any callable).
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, std::function<void(int64_t, int64_t)>>)
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    parallel_for_raw(n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
                     const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Calls fn(thread_index) once on each of the pool's threads (index 0 is the caller).
  void run_on_all(const std::function<void(int)>& fn);

 private:
  using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
  enum class JobKind : uint8_t { kRange, kAll };

  void parallel_for_raw(int64_t n, int64_t grain, RangeFn fn, void* ctx);
  void run(JobKind kind, int64_t n_chunks);  // publishes the job in the fields below, joins, closes
  void worker_loop(int index);
  void run_chunks();  // claims chunks of the open range job until none is left
  void wake_sleepers();

  int n_threads_;
  std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;

  // Job fields: written by the caller only while no job is open and no worker is inside one; read by
  // workers only inside an open job (see run() and worker_loop() for the protocol).
  JobKind kind_ = JobKind::kRange;
  RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  const std::function<void(int)>* all_fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t n_chunks_ = 0;

  // Each hot counter on its own cache line so spinning readers don't slow down the claimers.
  // generation_: odd = a job is open, even = closed; bumped twice per job.
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int64_t> next_{0};  // next chunk to claim
  alignas(64) std::atomic<int64_t> done_{0};  // chunks (range job) or workers (all job) finished
  alignas(64) std::atomic<int> active_{0};    // workers inside the open job
  alignas(64) std::atomic<int> sleepers_{0};  // workers blocked (or about to block) on wake_
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};  // a caller is inside parallel_for / run_on_all
  std::mutex mutex_;
  std::condition_variable wake_;
};

// The process-wide pool used by the CPU backend. Created on first use with set_global_threads' count
// (default: hardware concurrency) and worker spin (default ThreadPool::kDefaultSpinUs).
ThreadPool& global_pool();
void set_global_threads(int n_threads, int64_t spin_us = ThreadPool::kDefaultSpinUs);

}  // namespace tandem
