// Exit codes (see exit_codes.h).
#include "runtime/exit_codes.h"

#include "peer/client.h"

namespace tandem {

int exit_code(const std::exception& e) {
  if (dynamic_cast<const InputError*>(&e)) return kExitBadInput;
  if (dynamic_cast<const OutOfMemoryError*>(&e)) return kExitOutOfMemory;
  if (const auto* t = dynamic_cast<const peer::LaneTripped*>(&e))
    if (t->cause() == peer::TripCause::kCorrupt || t->cause() == peer::TripCause::kShrunk) return peer::kExitLaneDamaged;
  return kExitFailure;
}

int exit_code(peer::ServeEnd end) {
  switch (end) {
    case peer::ServeEnd::kStopped:
    case peer::ServeEnd::kLaneStopped:
    case peer::ServeEnd::kPrimaryGone: return kExitOk;
    case peer::ServeEnd::kTripped: return kExitFailure;
    case peer::ServeEnd::kRefused: return kExitBadInput;
    case peer::ServeEnd::kCorrupt:
    case peer::ServeEnd::kShrunk: return peer::kExitLaneDamaged;
  }
  return kExitFailure;
}

}  // namespace tandem
