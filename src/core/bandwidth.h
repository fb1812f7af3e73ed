// The host's DRAM read bandwidth, measured: the bound of a path the CPU streams (`tandem bench`'s
// peer lane reads its cold experts from DRAM; on --device cpu every weight comes from there).
#pragma once

#include <cstddef>

namespace tandem {

class ThreadPool;

// GB/s (1e9 bytes) of `bytes` of huge-page backed memory read once by every thread of `pool`, each its
// own contiguous slice (first touched by that thread): the best of five passes after a warm-up pass.
// Throws std::bad_alloc when the memory cannot be mapped.
double dram_read_bandwidth_gbps(ThreadPool& pool, size_t bytes = size_t(2) << 30);

}  // namespace tandem
