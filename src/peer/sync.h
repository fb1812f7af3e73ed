// OS helpers of the lane: the monotonic clock every lane process shares, futex waits on words in the
// shared segment (process-shared, so no FUTEX_PRIVATE), and whether a pid still names a live process.
// Futex waits always carry a short timeout: they bound a lost wake-up, never the wait itself.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

namespace tandem::peer {

uint64_t now_ns();  // CLOCK_MONOTONIC, comparable across processes of one machine

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

}  // namespace tandem::peer
