// OS helpers of the lane (see sync.h).
#include "peer/sync.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
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

namespace {

// Field 22 (starttime, clock ticks since boot) of /proc/<pid>/stat; 0 when it cannot be read.
uint64_t start_ticks(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parens
  if (!p) return 0;
  // After ") " come fields 3 (state), 4, ...: starttime is field 22, the 20th after the parenthesis.
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p + 1, ' ');
    if (!p) return 0;
  }
  return std::strtoull(p + 1, nullptr, 10);
}

int pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return int(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

ProcessHandle ProcessHandle::take(pid_t pid) {
  ProcessHandle h;
  if (!signallable_pid(pid) || process_state(pid) == ProcessState::kGone) return h;
  h.pid_ = pid;
  h.pidfd_ = pidfd_open(pid);
  h.start_ticks_ = start_ticks(pid);
  return h;
}

ProcessHandle& ProcessHandle::operator=(ProcessHandle&& o) noexcept {
  if (this != &o) {
    if (pidfd_ >= 0) close(pidfd_);
    pid_ = std::exchange(o.pid_, 0);
    pidfd_ = std::exchange(o.pidfd_, -1);
    start_ticks_ = std::exchange(o.start_ticks_, 0);
  }
  return *this;
}

ProcessHandle::~ProcessHandle() {
  if (pidfd_ >= 0) close(pidfd_);
}

bool ProcessHandle::alive() const {
  if (pid_ <= 0) return false;
  if (pidfd_ >= 0) {
    // A pidfd polls readable once its process exited; it never refers to a later process of that pid.
    pollfd p{pidfd_, POLLIN, 0};
    if (poll(&p, 1, 0) > 0) return false;
    return process_state(pid_) == ProcessState::kAlive;  // the pidfd pins the process, so the pid is still its
  }
  if (process_state(pid_) == ProcessState::kGone) return false;
  return start_ticks_ == 0 || start_ticks(pid_) == start_ticks_;
}

bool ProcessHandle::signal(int sig) const {
  if (!alive()) return false;
#ifdef SYS_pidfd_send_signal
  if (pidfd_ >= 0) return syscall(SYS_pidfd_send_signal, pidfd_, sig, nullptr, 0) == 0;
#endif
  return kill(pid_, sig) == 0;
}

bool process_maps_segment(pid_t pid, const std::string& shm_name) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/maps", int(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  const std::string want = "/dev/shm" + shm_name;  // "/dev/shm/tandem-<lane>", maybe " (deleted)" after it
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) {
    const char* at = std::strstr(line, want.c_str());
    if (!at) continue;
    const char end = at[want.size()];
    found = end == '\n' || end == ' ' || end == '\0';
  }
  std::fclose(f);
  return found;
}

}  // namespace tandem::peer
