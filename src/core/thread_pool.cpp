// Thread pool (see thread_pool.h). A job is published by making generation_ odd; workers join it by
// bumping active_ and re-reading generation_ (seq_cst on both sides, so either the caller sees the
// worker as active or the worker sees the job closed), claim chunks through an atomic cursor, and the
// caller closes the job (generation_ even) and waits for active_ == 0 before touching the job fields.
#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() ((void)0)
#endif

namespace tandem {

namespace {
// Spins of the caller waiting for the last chunks before it starts yielding its core.
constexpr int kCallerSpins = 4096;
}  // namespace

ThreadPool::ThreadPool(int n_threads, int64_t spin_us) : spin_(std::max<int64_t>(0, spin_us)) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  { std::lock_guard<std::mutex> lock(mutex_); }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::wake_sleepers() {
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  // Taking the mutex orders this notify after any sleeper's last check of generation_.
  { std::lock_guard<std::mutex> lock(mutex_); }
  wake_.notify_all();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_chunks_) return;
    int64_t begin = i * chunk_;
    fn_(ctx_, begin, std::min(n_, begin + chunk_));
    done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;  // the last job this worker joined or saw closed
  for (;;) {
    uint64_t gen = 0;
    auto ready = [&] {
      gen = generation_.load(std::memory_order_seq_cst);
      return ((gen & 1) != 0 && gen != seen) || stop_.load(std::memory_order_relaxed);
    };
    if (!ready()) {
      auto deadline = std::chrono::steady_clock::now() + spin_;
      for (int spin = 1; !ready(); ++spin) {
        TANDEM_CPU_RELAX();
        if (spin % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
      }
      if (!ready()) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        {
          std::unique_lock<std::mutex> lock(mutex_);
          wake_.wait(lock, ready);
        }
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    active_.fetch_add(1, std::memory_order_seq_cst);
    uint64_t now = generation_.load(std::memory_order_seq_cst);
    if ((now & 1) != 0) {
      // Joined an open job (possibly newer than `gen`); the caller waits for us before it changes
      // the job fields. An all-job cannot close without us, so we never miss one.
      seen = now;
      switch (kind_) {
        case JobKind::kRange:
          run_chunks();
          break;
        case JobKind::kAll:
          (*all_fn_)(index);
          done_.fetch_add(1, std::memory_order_release);
          break;
      }
    } else {
      seen = gen;  // closed before we got in; the caller did the chunks
    }
    active_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::run(JobKind kind, int64_t n_chunks) {
  kind_ = kind;
  n_chunks_ = n_chunks;
  next_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;  // odd: open
  generation_.store(gen, std::memory_order_seq_cst);
  wake_sleepers();
  int64_t target = 0;
  switch (kind) {
    case JobKind::kRange:
      run_chunks();
      target = n_chunks;
      break;
    case JobKind::kAll:
      (*all_fn_)(0);
      target = n_threads_ - 1;
      break;
  }
  for (int spin = 0; done_.load(std::memory_order_acquire) < target; ++spin) {
    if (spin < kCallerSpins) {
      TANDEM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  generation_.store(gen + 1, std::memory_order_seq_cst);  // even: closed
  for (int spin = 0; active_.load(std::memory_order_seq_cst) != 0; ++spin) {
    if (spin < kCallerSpins) {
      TANDEM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_for_raw(
      n, grain,
      [](void* ctx, int64_t b, int64_t e) { (*static_cast<const std::function<void(int64_t, int64_t)>*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

void ThreadPool::parallel_for_raw(int64_t n, int64_t grain, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  // About 4 chunks per thread so a slow thread does not hold up the rest.
  const int64_t chunk = std::max(grain, (n + 4 * n_threads_ - 1) / (4 * n_threads_));
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  if (n_threads_ == 1 || n_chunks == 1) {
    fn(ctx, 0, n);
    return;
  }
  TANDEM_ASSERT(!busy_.exchange(true, std::memory_order_acquire),
                "ThreadPool::parallel_for called concurrently or from inside a task");
  fn_ = fn;
  ctx_ = ctx;
  all_fn_ = nullptr;
  n_ = n;
  chunk_ = chunk;
  run(JobKind::kRange, n_chunks);
  busy_.store(false, std::memory_order_release);
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  TANDEM_ASSERT(!busy_.exchange(true, std::memory_order_acquire),
                "ThreadPool::run_on_all called concurrently or from inside a task");
  fn_ = nullptr;
  ctx_ = nullptr;
  all_fn_ = &fn;
  run(JobKind::kAll, 0);
  busy_.store(false, std::memory_order_release);
}

namespace {
int g_threads = 0;
int64_t g_spin_us = ThreadPool::kDefaultSpinUs;
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mutex;
}  // namespace

ThreadPool& global_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(g_threads, g_spin_us);
  return *g_pool;
}

void set_global_threads(int n_threads, int64_t spin_us) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (g_pool && g_pool->size() == n_threads && g_spin_us == spin_us) return;
  g_threads = n_threads;
  g_spin_us = spin_us;
  g_pool.reset();
}

}  // namespace tandem
