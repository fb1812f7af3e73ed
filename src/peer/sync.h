// OS helpers of the lane: the monotonic clock every lane process shares, futex waits on words in the
// shared segment (process-shared, so no FUTEX_PRIVATE), and whether a pid still names a live process.
// Futex waits always carry a short timeout: they bound a lost wake-up, never the wait itself.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

namespace tandem::peer {

uint64_t now_ns();  // CLOCK_MONOTONIC, comparable across processes of one machine

// One spin-wait pause (x86 `pause`, Arm `yield`): a spinning thread yields the core's pipeline to its
// sibling and eases the memory traffic of its polling.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Sleeps while *word == expected, at most timeout_ns (or until woken / a signal). Returns at once
// when the value differs. For a 64-bit counter pass its low 32 bits (little-endian: the first word).
void futex_wait(const std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns);
void futex_wait_low(const std::atomic<uint64_t>* counter, uint64_t expected, uint64_t timeout_ns);
void futex_wake_all(const std::atomic<uint32_t>* word);
void futex_wake_all_low(const std::atomic<uint64_t>* counter);

enum class ProcessState { kAlive, kGone };
// kGone when kill(pid, 0) fails with ESRCH, or the process is a zombie (exited, not yet reaped).
// pid must be > 0 (callers validate pids read from shared memory first).
ProcessState process_state(pid_t pid);

// True for a pid that may be signalled: > 1 and not this process.
bool signallable_pid(int64_t pid);

// One process, pinned at the moment it is taken: a pidfd where the kernel has one (Linux >= 5.3),
// else the pid plus its start time from /proc/<pid>/stat. alive() and signal() act on that process
// only: a pid reused by an unrelated process later reads as gone and is never signalled.
class ProcessHandle {
 public:
  ProcessHandle() = default;
  // Pins `pid` as it is now. An invalid handle (valid() false) when the pid is not signallable or gone.
  static ProcessHandle take(pid_t pid);
  ProcessHandle(ProcessHandle&& o) noexcept { *this = std::move(o); }
  ProcessHandle& operator=(ProcessHandle&& o) noexcept;
  ProcessHandle(const ProcessHandle&) = delete;
  ProcessHandle& operator=(const ProcessHandle&) = delete;
  ~ProcessHandle();

  bool valid() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // False once the pinned process exited (a zombie counts as gone).
  bool alive() const;
  // Sends sig to the pinned process only; false when it is gone (nothing sent).
  bool signal(int sig) const;

 private:
  pid_t pid_ = 0;
  int pidfd_ = -1;
  uint64_t start_ticks_ = 0;  // field 22 of /proc/<pid>/stat when taken (0: unknown)
};

// True when process `pid` maps the shared-memory object named `shm_name` ("/tandem-<lane>"), read
// from /proc/<pid>/maps: how the watchdog verifies that a pid named by a header is the lane's own.
bool process_maps_segment(pid_t pid, const std::string& shm_name);

}  // namespace tandem::peer
