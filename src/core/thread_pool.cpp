// Thread pool (see thread_pool.h). Chunks are handed out through an atomic cursor so uneven work
// balances itself; the job is published by bumping `generation_`.
#include "core/thread_pool.h"

#include <algorithm>
#include <memory>

#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() ((void)0)
#endif

namespace tandem {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_job(int index) {
  if (all_fn_) {
    (*all_fn_)(index);
    return;
  }
  for (;;) {
    int64_t begin = next_.fetch_add(chunk_);
    if (begin >= n_) break;
    (*fn_)(begin, std::min(n_, begin + chunk_));
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < 20000; ++spin) {
      TANDEM_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    run_job(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  // About 4 chunks per thread so a slow thread does not hold up the rest.
  int64_t chunk = std::max(grain, (n + 4 * n_threads_ - 1) / (4 * n_threads_));
  fn_ = &fn;
  all_fn_ = nullptr;
  n_ = n;
  chunk_ = chunk;
  next_.store(0);
  pending_.store(n_threads_ - 1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  run_job(0);
  while (pending_.load(std::memory_order_acquire) != 0) TANDEM_CPU_RELAX();
  fn_ = nullptr;
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  all_fn_ = &fn;
  fn_ = nullptr;
  pending_.store(n_threads_ - 1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  run_job(0);
  while (pending_.load(std::memory_order_acquire) != 0) TANDEM_CPU_RELAX();
  all_fn_ = nullptr;
}

namespace {
int g_threads = 0;
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mutex;
}  // namespace

ThreadPool& global_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(g_threads);
  return *g_pool;
}

void set_global_threads(int n_threads) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (g_pool && g_pool->size() == n_threads) return;
  g_threads = n_threads;
  g_pool.reset();
}

}  // namespace tandem
