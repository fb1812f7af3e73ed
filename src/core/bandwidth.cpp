// dram_read_bandwidth_gbps (see bandwidth.h).
#include "core/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/host_buffer.h"
#include "core/thread_pool.h"

namespace tandem {

double dram_read_bandwidth_gbps(ThreadPool& pool, size_t bytes) {
  const int n = pool.size();
  const size_t words = std::max<size_t>(bytes / 64, size_t(n)) * 8;  // whole cache lines, one at least per thread
  HostBuffer buf(words * 8);
  auto* w = reinterpret_cast<uint64_t*>(buf.data());
  const auto slice = [&](int t) { return std::pair<size_t, size_t>(words / 8 * t / n * 8, words / 8 * (t + 1) / n * 8); };
  pool.run_on_all([&](int t) {  // first touch by the thread that reads the slice (its NUMA node)
    const auto [b, e] = slice(t);
    std::memset(w + b, 0x5a, (e - b) * 8);
  });
  std::vector<uint64_t> folds(size_t(n) * 8);  // one cache line per thread
  double best = 0;
  for (int pass = 0; pass < 6; ++pass) {  // the first pass warms up
    const auto t0 = std::chrono::steady_clock::now();
    pool.run_on_all([&](int t) {
      const auto [b, e] = slice(t);
      uint64_t acc[8] = {};
      for (size_t i = b; i < e; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] ^= w[i + k];
      uint64_t f = 0;
      for (uint64_t a : acc) f ^= a;
      folds[size_t(t) * 8] = f;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (pass > 0) best = std::max(best, double(words * 8) / s / 1e9);
  }
  // The folds are used, so the reads cannot be dropped: a sentinel that memset's pattern never gives.
  uint64_t all = 0;
  for (int t = 0; t < n; ++t) all ^= folds[size_t(t) * 8];
  if (all == 0x9e3779b97f4a7c15ull) best = -best;
  return best;
}

}  // namespace tandem
