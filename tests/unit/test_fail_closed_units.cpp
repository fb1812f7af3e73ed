// Issue 29's pure parts: text read from shared memory is never raw, fp1 values print as users see them,
// a mismatch names the part that differs, a pinned process handle never follows a pid to another
// process, and only a process that maps a lane's segment counts as that lane's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "peer/protocol.h"
#include "peer/sync.h"

namespace tandem::peer {
namespace {

TEST(FailClosedUnits, SharedMemoryTextIsEscaped) {
  char buf[16] = "ok\x1b]0;x\x07\xff\\";
  EXPECT_EQ(read_bounded(buf, sizeof buf), "ok\\x1b]0;x\\x07\\xff\\x5c");
  EXPECT_EQ(sanitize("plain text 1.0"), "plain text 1.0");
}

TEST(FailClosedUnits, Fp1RoundTrip) {
  EXPECT_EQ(fp1_text(0x0123456789abcdefULL), "fp1:0123456789abcdef");
  EXPECT_EQ(fp1_value("fp1:0123456789abcdef"), 0x0123456789abcdefULL);
  EXPECT_EQ(fp1_value("fp2:0123456789abcdef"), 0u);
  EXPECT_EQ(fp1_value("fp1:0123"), 0u);
}

TEST(FailClosedUnits, MismatchNamesThePartThatDiffers) {
  const std::string w = describe_mismatch(1, 0xa, 0xb, 2, 0xa, 0xc, "the peer", "this primary");
  EXPECT_NE(w.find("the peer holds cold-expert weights fp1:000000000000000b, this primary fp1:000000000000000c"),
            std::string::npos)
      << w;
  EXPECT_EQ(w.find("rowmap"), std::string::npos) << w;
  const std::string r = describe_mismatch(1, 0xa, 0xb, 2, 0xd, 0xb, "the peer", "this primary");
  EXPECT_NE(r.find("serves rowmap fp1:000000000000000a, this primary fp1:000000000000000d"), std::string::npos) << r;
  const std::string unknown = describe_mismatch(0x1111, 0, 0, 0x2222, 0, 0, "the peer", "this primary");
  EXPECT_NE(unknown.find("the peer serves lane 0000000000001111, this primary expects 0000000000002222"),
            std::string::npos)
      << unknown;
}

TEST(FailClosedUnits, ProcessHandleFollowsOneProcess) {
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  ProcessHandle h = ProcessHandle::take(child);
  ASSERT_TRUE(h.valid());
  EXPECT_TRUE(h.alive());
  EXPECT_TRUE(h.signal(SIGKILL));
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_FALSE(h.alive());
  EXPECT_FALSE(h.signal(SIGTERM));  // never sent to whatever has the pid now
  EXPECT_FALSE(ProcessHandle::take(getpid()).valid());  // never this process
  EXPECT_FALSE(ProcessHandle::take(1).valid());
}

TEST(FailClosedUnits, OnlyAProcessMappingTheSegmentIsTheLanes) {
  EXPECT_FALSE(process_maps_segment(getpid(), "/tandem-no-such-lane-here"));
  EXPECT_FALSE(process_maps_segment(1 << 30, "/tandem-x"));
}

}  // namespace
}  // namespace tandem::peer
