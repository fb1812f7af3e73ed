// The sidecar lane's shared-memory wire format: one POSIX segment "/tandem-<lane>" per lane, created
// by the peer (0600), attached by the primary, read by the watchdog. Plain standard-layout structs with
// compile-time size/offset checks; every counter is a lock-free, address-free std::atomic. Invariant:
// a payload is written before its 64-bit sequence counter (release) and read after it (acquire).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace tandem::peer {

// Segment layout (docs/protocol.md explains each field and the handshake):
//
//   offset 0                    1024              1024 + slot_bytes        1024 + n_slots * slot_bytes
//   +---------------------------+-----------------+-----------------+ ... +
//   | Header (1024 B)           | slot 0          | slot 1          |     |
//   +---------------------------+-----------------+-----------------+ ... +
//
//   Header: line 0   identity: magic, version, fingerprint, sizes, Geometry (immutable once magic set)
//           line 1   lane state, trip cause, pids, attach handshake (primary fingerprint, seq, ack)
//           line 2   doorbell + peer_sleeping (the peer's futex word)
//           line 3   peer heartbeat / last progress            (written by the peer)
//           line 4   primary heartbeat / progress / counters   (written by the primary)
//           320      wait-time histogram [kWaitBuckets] u64    (written by the primary)
//           576      trip_reason  char[192]                    (written by the watchdog, then state)
//           768      refuse_reason char[192]                   (written by the peer, then state)
//           960      identity: rowmap and weights fingerprints of each side (peer before magic,
//                    primary before attach_seq)
//
//   Slot (slot_bytes, a multiple of 4096; each array starts on a 64-byte boundary):
//     0    RequestHead  (64 B)   seq | layer | n_rows | k | submit_ns       (primary writes)
//     64   ResponseHead (256 B)  seq | status | n_rows | primary_waiting | detail[224] (peer writes)
//     320  x       [max_rows, hidden] f32   input rows                     (primary writes)
//          ids     [max_rows, max_k]  i32   expert ids, -1 = empty        (primary writes)
//          weights [max_rows, max_k]  f32   gate weights                   (primary writes)
//          out     [max_rows, hidden] f32   Σ_j weights[r,j]·expert_ids[r,j](x[r])  (peer writes)
//   Arrays use the slot's row stride (hidden resp. max_k), whatever n_rows and k the request carries.

inline constexpr uint64_t kMagic = 0x314E414C4D444E54ULL;  // "TNDMLAN1" little-endian
inline constexpr uint32_t kProtocolVersion = 2;  // 2: the identity line at 960 (rowmap + weights fingerprints)
inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kHeaderBytes = 1024;
inline constexpr size_t kSlotAlign = 4096;
inline constexpr int kWaitBuckets = 32;  // bucket i: wait in [2^(i-1), 2^i) µs; bucket 0: < 1 µs
inline constexpr size_t kReasonBytes = 192;
inline constexpr size_t kDetailBytes = 224;

// Limits a valid segment respects (so a malicious header cannot make a reader map or index past the end).
inline constexpr uint32_t kMaxSlots = 64;
inline constexpr uint32_t kMaxRows = 1u << 16;
inline constexpr uint32_t kMaxHidden = 1u << 16;
inline constexpr uint32_t kMaxK = 64;
inline constexpr uint64_t kMaxSegmentBytes = 16ULL << 30;
inline constexpr uint32_t kMaxSplitColumn = 1u << 20;
inline constexpr size_t kMaxLaneName = 64;

enum class Dtype : uint32_t { kF32 = 1 };

enum class LaneState : uint32_t {
  kStarting = 0,  // the peer is loading; the primary waits
  kServing = 1,   // requests are served
  kTripped = 2,   // the watchdog ended the lane; trip_cause/trip_reason say why; nothing proceeds
  kRefused = 3,   // the peer refused the attached primary; refuse_reason says why
  kStopped = 4,   // normal shutdown (primary detached or peer stopped)
};

enum class TripCause : uint32_t {
  kNone = 0,
  kStall = 1,        // work pending and the response counter did not move for the stall time
  kPeerGone = 2,     // the peer's pid no longer exists
  kPrimaryGone = 3,  // the primary's pid no longer exists
  kProtocol = 4,     // counters inconsistent (response ahead of request, counters going backwards)
  kCheck = 5,        // the primary's check gate saw a cosine below its bar: the peer's answers are wrong
  kCorrupt = 6,      // a header field the protocol keeps fixed changed (a writer outside the protocol)
  kShrunk = 7,       // the segment file shrank below its size (truncated) while mapped
};
inline constexpr uint32_t kTripCauseCount = 8;

// The status of every response. Anything but kOk fails the request.
enum class Status : uint32_t {
  kOk = 0,
  kBadLayer = 1,      // layer outside [0, n_layers)
  kBadRows = 2,       // n_rows > max_rows
  kBadK = 3,          // k outside [1, max_k]
  kBadExpert = 4,     // an expert id outside [-1, n_experts)
  kHotExpert = 5,     // an expert id that is not cold on this peer
  kBadWeight = 6,     // a gate weight that is NaN or infinite
  kBadSequence = 7,   // request seq is not previous response seq + 1
  kComputeError = 8,  // the compute backend threw; detail holds its message
};
inline constexpr uint32_t kStatusCount = 9;

// Fixed at creation. dtype is always kF32.
struct Geometry {
  uint32_t n_slots = 1;
  uint32_t max_rows = 0;  // rows per request
  uint32_t hidden = 0;    // floats per row
  uint32_t max_k = 0;     // expert slots per row
  uint32_t dtype = static_cast<uint32_t>(Dtype::kF32);
  // The split lane: 0 when the peer computes whole cold experts; otherwise the intermediate feature at
  // which it cuts each of them (a multiple of 8): it computes [split_column, inter), the primary reads
  // [0, split_column) over its link. Published here so that a primary can take the peer's cut.
  uint32_t split_column = 0;
};
static_assert(sizeof(Geometry) == 24);

struct alignas(kCacheLine) Header {
  // line 0: identity. Written by the peer before magic (release); immutable afterwards.
  std::atomic<uint64_t> magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t fingerprint;  // model + rowmap fingerprint the peer serves
  uint64_t total_bytes;
  uint64_t slot_bytes;
  Geometry geometry;
  // line 1: lane state and the attach handshake.
  std::atomic<uint32_t> state;       // LaneState
  std::atomic<uint32_t> trip_cause;  // TripCause, written before state = kTripped
  std::atomic<int32_t> peer_pid;
  std::atomic<int32_t> primary_pid;  // 0 until a primary claims the lane (CAS 0 -> pid)
  std::atomic<uint64_t> primary_fingerprint;  // written by the primary before attach_seq
  std::atomic<uint32_t> attach_seq;  // primary: +1 (release) after writing pid and fingerprint
  std::atomic<uint32_t> attach_ack;  // peer: = attach_seq (release) once the primary is accepted
  std::atomic<uint32_t> trip_claim;  // 0 -> 1 by whoever writes trip_reason (one writer only)
  uint32_t reserved1;
  uint64_t reserved2[3];
  // line 2: the peer's wake-up word. The primary bumps doorbell after each request and wakes the
  // futex when peer_sleeping is set.
  std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> peer_sleeping;
  uint8_t pad2[56];
  // line 3: peer-written times (CLOCK_MONOTONIC ns).
  std::atomic<uint64_t> peer_heartbeat_ns;
  std::atomic<uint64_t> peer_progress_ns;  // last response written
  std::atomic<uint64_t> peer_served;       // responses written (all slots)
  std::atomic<uint64_t> peer_errors;       // responses with a status other than kOk
  uint8_t pad3[32];
  // line 4: primary-written times and counters.
  std::atomic<uint64_t> primary_heartbeat_ns;
  std::atomic<uint64_t> primary_progress_ns;  // last request submitted
  std::atomic<uint64_t> handoffs;             // completed waits
  std::atomic<uint64_t> overruns;             // waits that exceeded the spin limit and blocked
  std::atomic<uint64_t> wait_ns_total;
  std::atomic<uint64_t> wait_ns_max;
  uint8_t pad4[16];
  std::atomic<uint64_t> wait_hist[kWaitBuckets];
  char trip_reason[kReasonBytes];    // NUL-terminated; valid once state == kTripped (acquire)
  char refuse_reason[kReasonBytes];  // NUL-terminated; valid once state == kRefused (acquire)
  // line 15: what each side's lane fingerprint is made of, so that a mismatch can say which part
  // differs, in the "fp1:<16 hex>" form users find in their rowmap and logs. The lane fingerprint
  // (line 0 and primary_fingerprint) stays the one compared.
  uint64_t peer_rowmap_fingerprint;                 // the rowmap's fp1 value (peer, before magic)
  uint64_t peer_weights_fingerprint;                // cold experts' sampled content (peer, before magic)
  std::atomic<uint64_t> primary_rowmap_fingerprint;   // (primary, before attach_seq)
  std::atomic<uint64_t> primary_weights_fingerprint;  // (primary, before attach_seq)
  uint8_t pad5[kHeaderBytes - 992];
};

struct alignas(kCacheLine) RequestHead {
  std::atomic<uint64_t> seq;  // per slot: 1, 2, 3, ... Written last (release).
  int32_t layer;
  uint32_t n_rows;
  uint32_t k;
  uint32_t reserved;
  uint64_t submit_ns;
  uint8_t pad[32];
};

struct alignas(kCacheLine) ResponseHead {
  std::atomic<uint64_t> seq;  // = the request seq answered. Written last (release, seq_cst).
  uint32_t status;            // Status
  uint32_t n_rows;            // echo of the request
  std::atomic<uint32_t> primary_waiting;  // the primary blocks on seq's low 32 bits when set
  uint32_t reserved;
  uint64_t reserved2;
  char detail[kDetailBytes];  // NUL-terminated message when status != kOk
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "shared-memory counters must be lock-free (hence address-free)");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<uint32_t>) == 4);
static_assert(std::is_standard_layout_v<Header> && std::is_standard_layout_v<RequestHead> &&
              std::is_standard_layout_v<ResponseHead>);
static_assert(sizeof(Header) == kHeaderBytes);
static_assert(offsetof(Header, geometry) == 40);
static_assert(offsetof(Header, state) == 64);
static_assert(offsetof(Header, attach_seq) == 88);
static_assert(offsetof(Header, doorbell) == 128);
static_assert(offsetof(Header, peer_heartbeat_ns) == 192);
static_assert(offsetof(Header, primary_heartbeat_ns) == 256);
static_assert(offsetof(Header, wait_hist) == 320);
static_assert(offsetof(Header, trip_reason) == 576);
static_assert(offsetof(Header, refuse_reason) == 768);
static_assert(offsetof(Header, peer_rowmap_fingerprint) == 960);
static_assert(sizeof(RequestHead) == 64);
static_assert(sizeof(ResponseHead) == 256);
static_assert(offsetof(ResponseHead, detail) == 32);

// Byte offsets of one slot's parts, derived from the geometry alone.
struct SlotLayout {
  uint64_t request = 0;   // RequestHead
  uint64_t response = 0;  // ResponseHead
  uint64_t x = 0;         // [max_rows, hidden] f32
  uint64_t ids = 0;       // [max_rows, max_k] i32
  uint64_t weights = 0;   // [max_rows, max_k] f32
  uint64_t out = 0;       // [max_rows, hidden] f32
  uint64_t slot_bytes = 0;
};

// Throws InputError naming the field when the geometry is outside the limits above.
void validate_geometry(const Geometry& g, std::string_view what);
SlotLayout slot_layout(const Geometry& g);  // g must be valid
uint64_t segment_bytes(const Geometry& g);  // header + n_slots * slot_bytes

// Lane names: [A-Za-z0-9_-], 1..64 chars. Throws InputError otherwise.
void validate_lane_name(std::string_view lane);
std::string shm_name(std::string_view lane);  // "/tandem-<lane>"

const char* to_string(LaneState s);
const char* to_string(TripCause c);
const char* to_string(Status s);
// Names a raw value read from shared memory, including out-of-range ones ("unknown(17)").
std::string state_name(uint32_t raw);
std::string cause_name(uint32_t raw);
std::string status_name(uint32_t raw);

// Copies a NUL-terminated string of at most n bytes out of shared memory (never reads past n), with
// every byte outside printable ASCII escaped as \xNN: text from shared memory is never printed raw
// (a scribbled header must not reach a terminal as escape sequences).
std::string read_bounded(const char* src, size_t n);
// s with every byte outside printable ASCII (0x20..0x7e) written as \xNN.
std::string sanitize(std::string_view s);
// A TripCause from a raw header value; kNone for an unknown value.
TripCause trip_cause_of(uint32_t raw);
// The fp1 value of a "fp1:<16 hex>" text (0 when it is not one), and back.
uint64_t fp1_value(std::string_view text);
std::string fp1_text(uint64_t value);
// Why two lane fingerprints (a_lane, b_lane) differ, from each side's identity line (rowmap and
// weights fingerprints; 0 is unknown and not compared), naming side a and side b: "the peer holds
// cold-expert weights fp1:..., this primary fp1:... (...)"; the lane fingerprints when nothing else.
std::string describe_mismatch(uint64_t a_lane, uint64_t a_rowmap, uint64_t a_weights, uint64_t b_lane,
                              uint64_t b_rowmap, uint64_t b_weights, const char* a, const char* b);
// Writes s into dst[n], truncated, always NUL-terminated.
void write_bounded(char* dst, size_t n, std::string_view s);

}  // namespace tandem::peer
