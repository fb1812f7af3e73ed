// HostBuffer (see host_buffer.h): an anonymous mapping trimmed to a 2 MiB boundary, madvise'd for THP.
#include "core/host_buffer.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <utility>

namespace tandem {

namespace {
constexpr size_t kHuge = size_t(2) << 20;
}  // namespace

HostBuffer::HostBuffer(size_t bytes, bool huge_pages) : size_(bytes) {
  if (bytes == 0) return;
  mapped_ = (bytes + kHuge - 1) / kHuge * kHuge;
  // Map one huge page more than needed, then unmap the misaligned head and the tail.
  const size_t span = mapped_ + kHuge;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  if (aligned > base) munmap(p, aligned - base);
  const uintptr_t end = base + span, want_end = aligned + mapped_;
  if (end > want_end) munmap(reinterpret_cast<void*>(want_end), end - want_end);
  data_ = reinterpret_cast<uint8_t*>(aligned);
  // Advice only: EINVAL where THP is compiled out, and the memory is then ordinary pages.
  (void)madvise(data_, mapped_, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
}

HostBuffer::~HostBuffer() {
  if (data_ != nullptr) munmap(data_, mapped_);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), mapped_(std::exchange(o.mapped_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) munmap(data_, mapped_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

int64_t HostBuffer::huge_bytes() const {
  if (data_ == nullptr) return 0;
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data_), hi = lo + mapped_;
  std::string line;
  bool inside = false;
  int64_t kib = 0;
  while (std::getline(smaps, line)) {
    unsigned long a = 0, b = 0;
    // A mapping's header line: "start-end perms ...".
    if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2) {
      inside = a < hi && b > lo;
      continue;
    }
    long v = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %ld kB", &v) == 1) kib += v;
  }
  return kib * 1024;
}

}  // namespace tandem
