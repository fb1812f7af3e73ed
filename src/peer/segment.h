// One mapping of a lane's shared-memory segment "/tandem-<lane>" (see protocol.h for the layout).
// create() is the peer's (owner-only 0600, O_EXCL); open() is the primary's and the watchdog's and
// validates everything before any index is used. After open the geometry and layout are private copies:
// the header is never re-read for sizes, so a writer changing it later cannot move an access out of bounds.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "peer/protocol.h"

namespace tandem::peer {

struct SlotView {
  RequestHead* request = nullptr;
  ResponseHead* response = nullptr;
  float* x = nullptr;        // [max_rows, hidden]
  int32_t* ids = nullptr;    // [max_rows, max_k], -1 = empty
  float* weights = nullptr;  // [max_rows, max_k]
  float* out = nullptr;      // [max_rows, hidden]
};

class Segment {
 public:
  // Creates the lane's segment, sized for g, state kStarting, this process as the peer, magic last
  // (release). A leftover segment whose peer pid is gone is replaced (logged); one with a live peer is
  // refused. Throws InputError (bad lane name or geometry, lane in use, OS errors with errno text).
  // rowmap_fp / weights_fp fill the identity line (Header::peer_rowmap_fingerprint, ...) for messages.
  static std::shared_ptr<Segment> create(const std::string& lane, uint64_t fingerprint, const Geometry& g,
                                         uint64_t rowmap_fp = 0, uint64_t weights_fp = 0);

  // Opens an existing lane and validates owner, permissions, magic, version, header size, geometry
  // limits and the file size against the geometry. Retries for up to timeout_s while the segment does
  // not exist yet or is still being initialised by the peer (logging once what it waits for). Throws
  // InputError naming what is wrong; a missing lane's message says how to start its peer.
  static std::shared_ptr<Segment> open(const std::string& lane, double timeout_s);

  // True when "/tandem-<lane>" exists (lane must be valid).
  static bool exists(const std::string& lane);

  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();  // unmaps; never unlinks

  Header& header() { return *header_; }
  const Geometry& geometry() const { return geometry_; }
  const SlotLayout& layout() const { return layout_; }
  uint64_t fingerprint() const { return fingerprint_; }
  const std::string& lane() const { return lane_; }
  SlotView slot(uint32_t i);  // i < geometry().n_slots

  // Removes the name when it still refers to this segment (same inode), so a restarted lane's new
  // segment survives. Returns true when it removed it.
  bool unlink_if_ours();
  // True while the lane's name still refers to this segment (false once removed or replaced).
  bool still_linked() const;

  // True once the segment's file is smaller than this mapping (someone truncated it), seen by fstat
  // or by a SIGBUS on an access past the new end. Such a SIGBUS does not kill the process: the
  // handler (installed by the first mapping) maps zero pages over the rest of the mapping, so the
  // access reads zeros and every loop that checks shrunk() stops the lane instead (cause kShrunk).
  bool shrunk() const;
  // Only the SIGBUS half of shrunk() (an atomic load, no system call): for per-request checks.
  bool faulted() const;

  // Ends the lane with `cause`: writes trip_reason (when no one claimed it first), trip_cause and
  // state = tripped (release), then wakes every waiter. For faults that a lane process itself sees
  // (a dead peer, a failed check gate, a corrupt or shrunk segment); the watchdog does the same.
  void trip(TripCause cause, const std::string& reason);

 private:
  Segment() = default;
  void map(int fd, uint64_t bytes);

  std::string lane_;
  std::string name_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  Header* header_ = nullptr;
  Geometry geometry_{};
  SlotLayout layout_{};
  uint64_t fingerprint_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  int bus_slot_ = -1;  // this mapping's entry in the SIGBUS handler's table
};

}  // namespace tandem::peer
