// OS helpers of the lane (see sync.h).
#include "peer/sync.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace tandem::peer {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "futex_wait_low assumes the low word comes first");

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec);
}

namespace {
void futex_wait_raw(const void* addr, uint32_t expected, uint64_t timeout_ns) {
  timespec ts{};
  ts.tv_sec = time_t(timeout_ns / 1'000'000'000ULL);
  ts.tv_nsec = long(timeout_ns % 1'000'000'000ULL);
  // EAGAIN (value changed), ETIMEDOUT and EINTR all mean "look again"; the caller loops.
  syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake_raw(const void* addr) { syscall(SYS_futex, addr, FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0); }
}  // namespace

void futex_wait(const std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) {
  futex_wait_raw(word, expected, timeout_ns);
}
void futex_wait_low(const std::atomic<uint64_t>* counter, uint64_t expected, uint64_t timeout_ns) {
  futex_wait_raw(counter, uint32_t(expected), timeout_ns);
}
void futex_wake_all(const std::atomic<uint32_t>* word) { futex_wake_raw(word); }
void futex_wake_all_low(const std::atomic<uint64_t>* counter) { futex_wake_raw(counter); }

ProcessState process_state(pid_t pid) {
  TANDEM_ASSERT(pid > 0, "process_state needs a positive pid, got {}", pid);
  if (kill(pid, 0) != 0 && errno == ESRCH) return ProcessState::kGone;
  // A zombie still answers kill(pid, 0); its state letter in /proc/<pid>/stat is 'Z'.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return ProcessState::kAlive;  // no /proc entry but kill succeeded (EPERM): assume alive
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');  // the command name may hold spaces and parens
  if (close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X'))
    return ProcessState::kGone;
  return ProcessState::kAlive;
}

bool signallable_pid(int64_t pid) { return pid > 1 && pid <= 0x3fffffff && pid != int64_t(getpid()); }

}  // namespace tandem::peer
