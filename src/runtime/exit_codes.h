// The one map from how a process ended to its exit code, for every tandem process (commands, the
// peer, the watchdog, the server):
//   0 ok (a normal stop included)        1 failure: a check or gate failed, a lane tripped, a run-time error
//   2 bad input: flags, files, a refused primary (kExitBadInput, core/error.h)
//   4 the lane's shared memory was damaged under it: a corrupt header or a truncated segment
//     (kExitLaneDamaged, peer/server.h)
//   5 a device ran out of memory (kExitOutOfMemory, core/error.h)
#pragma once

#include <exception>

#include "core/error.h"
#include "peer/server.h"

namespace tandem {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;

// An exception that ended a command: InputError -> 2, OutOfMemoryError -> 5, a LaneTripped whose
// cause is a corrupt or shrunk segment -> 4, anything else -> 1.
int exit_code(const std::exception& e);
// Why a peer's serve() returned: a normal stop (SIGTERM, the primary stopped the lane or went away)
// -> 0, tripped -> 1, refused a primary -> 2, a damaged segment -> 4.
int exit_code(peer::ServeEnd end);

}  // namespace tandem
