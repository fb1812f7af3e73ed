// Large host memory owned by one object, asked to be backed by transparent huge pages (2 MiB) where the
// kernel allows it (THP "madvise" or "always"). For weights streamed by the CPU every step (the peer's
// cold experts): with 4 KiB pages a 6 MB expert spans ~1,500 pages, each a TLB miss and a stop for the
// hardware prefetcher, which does not cross a page boundary. Huge pages are a request, never required:
// where the kernel refuses, the memory is ordinary pages and everything still works.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

class HostBuffer {
 public:
  HostBuffer() = default;
  // `bytes` of zeroed memory, 2 MiB aligned. huge_pages = false: ordinary pages (for A/B benchmarks).
  // Throws std::bad_alloc when the memory cannot be mapped.
  explicit HostBuffer(size_t bytes, bool huge_pages = true);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Bytes of this buffer the kernel reports as huge-page backed (from /proc/self/smaps; -1 when that
  // cannot be read). Touch the memory first: pages are allocated on first write. Counted per mapping:
  // when the kernel merged a neighbouring mapping with the same flags into ours, its pages count too.
  int64_t huge_bytes() const;

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;     // as asked
  size_t mapped_ = 0;   // rounded up to whole 2 MiB pages
};

}  // namespace tandem
