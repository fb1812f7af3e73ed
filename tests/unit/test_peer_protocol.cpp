// Protocol pieces without a running lane: lane names, geometry limits, slot layout, enum names, bounded
// strings, and Segment::open refusing every kind of malformed segment with a clear error.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "peer/protocol.h"
#include "peer/segment.h"

namespace tandem::peer {
namespace {

std::string unique_lane(const char* what) { return fmt::format("ut-{}-{}", getpid(), what); }

Geometry small_geometry() {
  Geometry g;
  g.n_slots = 2;
  g.max_rows = 8;
  g.hidden = 16;
  g.max_k = 4;
  return g;
}

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(PeerProtocol, LaneNames) {
  EXPECT_NO_THROW(validate_lane_name("a"));
  EXPECT_NO_THROW(validate_lane_name("Lane_0-b"));
  EXPECT_NO_THROW(validate_lane_name(std::string(64, 'x')));
  EXPECT_EQ(shm_name("gpu1"), "/tandem-gpu1");
  EXPECT_NE(error_of([] { validate_lane_name(""); }).find("1 to 64"), std::string::npos);
  EXPECT_NE(error_of([] { validate_lane_name(std::string(65, 'x')); }).find("has 65"), std::string::npos);
  for (const char* bad : {"a/b", "../x", "a b", "a.b", "x\n", "é"})
    EXPECT_NE(error_of([&] { validate_lane_name(bad); }).find("may only hold"), std::string::npos) << bad;
}

TEST(PeerProtocol, GeometryLimits) {
  EXPECT_NO_THROW(validate_geometry(small_geometry(), "t"));
  struct Case {
    void (*mutate)(Geometry&);
    const char* field;
  };
  const Case cases[] = {
      {[](Geometry& g) { g.n_slots = 0; }, "n_slots"},   {[](Geometry& g) { g.n_slots = kMaxSlots + 1; }, "n_slots"},
      {[](Geometry& g) { g.max_rows = 0; }, "max_rows"}, {[](Geometry& g) { g.max_rows = kMaxRows + 1; }, "max_rows"},
      {[](Geometry& g) { g.hidden = 0; }, "hidden"},     {[](Geometry& g) { g.max_k = kMaxK + 1; }, "max_k"},
      {[](Geometry& g) { g.dtype = 2; }, "dtype"},
      {[](Geometry& g) { g.split_column = 12; }, "split_column"},
      {[](Geometry& g) { g.split_column = kMaxSplitColumn + 8; }, "split_column"},
  };
  for (const Case& c : cases) {
    Geometry g = small_geometry();
    c.mutate(g);
    EXPECT_NE(error_of([&] { validate_geometry(g, "t"); }).find(c.field), std::string::npos) << c.field;
  }
  Geometry cut = small_geometry();
  cut.split_column = 16;
  EXPECT_NO_THROW(validate_geometry(cut, "t"));
  Geometry huge = small_geometry();
  huge.n_slots = kMaxSlots;
  huge.max_rows = kMaxRows;
  huge.hidden = kMaxHidden;
  EXPECT_NE(error_of([&] { validate_geometry(huge, "t"); }).find("exceeds the limit"), std::string::npos);
}

TEST(PeerProtocol, SlotLayoutIsAlignedAndDisjoint) {
  for (uint32_t rows : {1u, 7u, 64u}) {
    for (uint32_t hidden : {1u, 3u, 2048u}) {
      Geometry g = small_geometry();
      g.max_rows = rows;
      g.hidden = hidden;
      g.max_k = 6;
      SlotLayout l = slot_layout(g);
      EXPECT_EQ(l.response, sizeof(RequestHead));
      for (uint64_t off : {l.x, l.ids, l.weights, l.out}) EXPECT_EQ(off % kCacheLine, 0u);
      EXPECT_GE(l.x, l.response + sizeof(ResponseHead));
      EXPECT_GE(l.ids, l.x + uint64_t{rows} * hidden * 4);
      EXPECT_GE(l.weights, l.ids + uint64_t{rows} * 6 * 4);
      EXPECT_GE(l.out, l.weights + uint64_t{rows} * 6 * 4);
      EXPECT_GE(l.slot_bytes, l.out + uint64_t{rows} * hidden * 4);
      EXPECT_EQ(l.slot_bytes % kSlotAlign, 0u);
      EXPECT_EQ(segment_bytes(g), kHeaderBytes + g.n_slots * l.slot_bytes);
    }
  }
}

TEST(PeerProtocol, NamesOfRawValues) {
  EXPECT_EQ(status_name(uint32_t(Status::kHotExpert)), "hot_expert");
  EXPECT_EQ(status_name(999), "unknown(999)");
  EXPECT_EQ(state_name(uint32_t(LaneState::kTripped)), "tripped");
  EXPECT_EQ(state_name(77), "unknown(77)");
  EXPECT_EQ(cause_name(uint32_t(TripCause::kPeerGone)), "peer_gone");
  EXPECT_EQ(cause_name(5), "check_failed");
  EXPECT_EQ(cause_name(8), "unknown(8)");
}

TEST(PeerProtocol, BoundedStrings) {
  char buf[8];
  std::memset(buf, 'z', sizeof buf);  // no NUL anywhere: must not read past the end
  EXPECT_EQ(read_bounded(buf, sizeof buf), "zzzzzzzz");
  write_bounded(buf, sizeof buf, "a long message");
  EXPECT_EQ(read_bounded(buf, sizeof buf), "a long ");
  write_bounded(buf, sizeof buf, "ok");
  EXPECT_EQ(read_bounded(buf, sizeof buf), "ok");
}

TEST(PeerSegment, CreateOpenAndOwnerOnly) {
  std::string lane = unique_lane("create");
  auto seg = Segment::create(lane, 0xabcdef, small_geometry());
  struct stat st {};
  int fd = shm_open(shm_name(lane).c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  fstat(fd, &st);
  close(fd);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto other = Segment::open(lane, 0.0);
  EXPECT_EQ(other->fingerprint(), 0xabcdefu);
  EXPECT_EQ(other->geometry().hidden, 16u);
  EXPECT_EQ(other->header().peer_pid.load(), getpid());
  EXPECT_EQ(other->header().state.load(), uint32_t(LaneState::kStarting));
  // A second peer on the same lane is refused while the first (this process) lives.
  EXPECT_NE(error_of([&] { Segment::create(lane, 1, small_geometry()); }).find("in use by a live peer"),
            std::string::npos);
  EXPECT_TRUE(other->still_linked());
  EXPECT_TRUE(seg->unlink_if_ours());
  EXPECT_FALSE(Segment::exists(lane));
  EXPECT_FALSE(other->still_linked());
  EXPECT_NE(error_of([&] { Segment::open(lane, 0.0); }).find("does not exist"), std::string::npos);
}

TEST(PeerSegment, LeftoverOfDeadPeerIsReplaced) {
  std::string lane = unique_lane("leftover");
  auto seg = Segment::create(lane, 1, small_geometry());
  pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  seg->header().peer_pid.store(child);  // a pid that is gone
  auto fresh = Segment::create(lane, 2, small_geometry());
  EXPECT_EQ(Segment::open(lane, 0.0)->fingerprint(), 2u);
  fresh->unlink_if_ours();
}

// Writes a segment by hand: a valid one, then breaks one field per case.
class GarbledSegment : public ::testing::Test {
 protected:
  void SetUp() override {
    lane_ = unique_lane("garbled");
    auto seg = Segment::create(lane_, 7, small_geometry());
    seg.reset();
  }
  void TearDown() override { shm_unlink(shm_name(lane_).c_str()); }
  Header* map_header() {
    int fd = shm_open(shm_name(lane_).c_str(), O_RDWR, 0);
    void* p = mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    mapped_ = p;
    return static_cast<Header*>(p);
  }
  void unmap() { munmap(mapped_, kHeaderBytes); }
  std::string open_error() { return error_of([&] { Segment::open(lane_, 0.0); }); }
  std::string lane_;
  void* mapped_ = nullptr;
};

TEST_F(GarbledSegment, BadMagic) {
  map_header()->magic.store(0x1234);
  unmap();
  EXPECT_NE(open_error().find("not a tandem lane"), std::string::npos);
}

TEST_F(GarbledSegment, UninitialisedIsNotReady) {
  map_header()->magic.store(0);
  unmap();
  EXPECT_NE(open_error().find("not initialised"), std::string::npos);
}

TEST_F(GarbledSegment, BadVersion) {
  map_header()->version = 99;
  unmap();
  EXPECT_NE(open_error().find("protocol version 99"), std::string::npos);
}

TEST_F(GarbledSegment, BadGeometry) {
  map_header()->geometry.max_k = 1000;
  unmap();
  EXPECT_NE(open_error().find("max_k"), std::string::npos);
}

TEST_F(GarbledSegment, GeometryBiggerThanTheFile) {
  Header* h = map_header();
  h->geometry.max_rows = 4096;  // valid limits, but the file is far smaller
  h->slot_bytes = slot_layout(h->geometry).slot_bytes;
  unmap();
  EXPECT_NE(open_error().find("size mismatch"), std::string::npos);
}

TEST_F(GarbledSegment, SlotBytesDisagree) {
  map_header()->slot_bytes += 4096;
  unmap();
  EXPECT_NE(open_error().find("slot_bytes"), std::string::npos);
}

TEST_F(GarbledSegment, TooSmallFile) {
  int fd = shm_open(shm_name(lane_).c_str(), O_RDWR, 0);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  close(fd);
  EXPECT_NE(open_error().find("less than its 1024-byte header"), std::string::npos);
}

TEST_F(GarbledSegment, GroupReadableIsRefused) {
  int fd = shm_open(shm_name(lane_).c_str(), O_RDWR, 0);
  fchmod(fd, 0640);
  close(fd);
  EXPECT_NE(open_error().find("mode 0600"), std::string::npos);
}

}  // namespace
}  // namespace tandem::peer
