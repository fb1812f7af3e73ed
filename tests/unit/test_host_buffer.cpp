// HostBuffer: the peer's expert arena. Aligned to 2 MiB, zeroed, writable end to end, movable, and
// honest about its huge pages (none when asked for none).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "core/host_buffer.h"

namespace tandem {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

TEST(HostBuffer, EmptyHoldsNothing) {
  HostBuffer b(0);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.huge_bytes(), 0);
}

TEST(HostBuffer, AlignedZeroedAndWritableEndToEnd) {
  const size_t n = 5 * kMiB + 123;
  HostBuffer b(n);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.size(), n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (2 * kMiB), 0u);
  for (size_t i = 0; i < n; i += 4096) ASSERT_EQ(b.data()[i], 0) << i;
  EXPECT_EQ(b.data()[n - 1], 0);
  std::memset(b.data(), 0x5a, n);
  EXPECT_EQ(b.data()[0], 0x5a);
  EXPECT_EQ(b.data()[n - 1], 0x5a);
  const int64_t huge = b.huge_bytes();  // -1 where /proc/self/smaps is unreadable
  EXPECT_GE(huge, -1);
  EXPECT_LE(huge, int64_t(6 * kMiB));
  EXPECT_EQ(huge % int64_t(2 * kMiB), huge < 0 ? -1 : 0);
}

TEST(HostBuffer, OrdinaryPagesWhenAskedForThem) {
  HostBuffer b(8 * kMiB, /*huge_pages=*/false);
  std::memset(b.data(), 1, b.size());
  const int64_t huge = b.huge_bytes();
  EXPECT_TRUE(huge == 0 || huge == -1) << huge;
}

TEST(HostBuffer, MoreThanTheAddressSpaceIsBadAlloc) {
  EXPECT_THROW(HostBuffer(size_t(1) << 62), std::bad_alloc);
}

TEST(HostBuffer, MovesOwnership) {
  HostBuffer a(3 * kMiB);
  a.data()[7] = 42;
  uint8_t* p = a.data();
  HostBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[7], 42);
  HostBuffer c(kMiB);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 3 * kMiB);
  EXPECT_EQ(b.data(), nullptr);
}

}  // namespace
}  // namespace tandem
