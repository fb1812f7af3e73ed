// Geometry limits, slot layout, lane names and enum names of the shared-memory protocol (protocol.h).
#include "peer/protocol.h"

#include <fmt/format.h>

#include <cstring>

#include "core/error.h"

namespace tandem::peer {

namespace {
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

void validate_geometry(const Geometry& g, std::string_view what) {
  auto check = [&](uint32_t v, uint32_t lo, uint32_t hi, const char* field) {
    if (v < lo || v > hi) fail("{}: geometry field {} = {} is outside [{}, {}]", what, field, v, lo, hi);
  };
  check(g.n_slots, 1, kMaxSlots, "n_slots");
  check(g.max_rows, 1, kMaxRows, "max_rows");
  check(g.hidden, 1, kMaxHidden, "hidden");
  check(g.max_k, 1, kMaxK, "max_k");
  if (g.dtype != static_cast<uint32_t>(Dtype::kF32))
    fail("{}: geometry field dtype = {} is not f32 ({})", what, g.dtype, static_cast<uint32_t>(Dtype::kF32));
  if (g.split_column > kMaxSplitColumn || g.split_column % 8 != 0)
    fail("{}: geometry field split_column = {} is not a multiple of 8 in [0, {}]", what, g.split_column,
         kMaxSplitColumn);
  if (segment_bytes(g) > kMaxSegmentBytes)
    fail("{}: segment of {} bytes exceeds the limit of {} bytes", what, segment_bytes(g), kMaxSegmentBytes);
}

SlotLayout slot_layout(const Geometry& g) {
  // Every factor is bounded by the limits (< 2^16 each), so no product overflows 64 bits.
  SlotLayout l;
  l.request = 0;
  l.response = sizeof(RequestHead);
  l.x = round_up(l.response + sizeof(ResponseHead), kCacheLine);
  const uint64_t rows_bytes = uint64_t{g.max_rows} * g.hidden * sizeof(float);
  const uint64_t k_bytes = uint64_t{g.max_rows} * g.max_k * sizeof(int32_t);
  l.ids = round_up(l.x + rows_bytes, kCacheLine);
  l.weights = round_up(l.ids + k_bytes, kCacheLine);
  l.out = round_up(l.weights + k_bytes, kCacheLine);
  l.slot_bytes = round_up(l.out + rows_bytes, kSlotAlign);
  return l;
}

uint64_t segment_bytes(const Geometry& g) { return kHeaderBytes + uint64_t{g.n_slots} * slot_layout(g).slot_bytes; }

void validate_lane_name(std::string_view lane) {
  if (lane.empty() || lane.size() > kMaxLaneName)
    fail("lane name '{}' must have 1 to {} characters (has {})", lane, kMaxLaneName, lane.size());
  for (char c : lane) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) fail("lane name '{}' may only hold A-Z a-z 0-9 _ - (found '{}')", lane, c);
  }
}

std::string shm_name(std::string_view lane) {
  validate_lane_name(lane);
  return fmt::format("/tandem-{}", lane);
}

const char* to_string(LaneState s) {
  switch (s) {
    case LaneState::kStarting: return "starting";
    case LaneState::kServing: return "serving";
    case LaneState::kTripped: return "tripped";
    case LaneState::kRefused: return "refused";
    case LaneState::kStopped: return "stopped";
  }
  return "unknown";
}

const char* to_string(TripCause c) {
  switch (c) {
    case TripCause::kNone: return "none";
    case TripCause::kStall: return "stall";
    case TripCause::kPeerGone: return "peer_gone";
    case TripCause::kPrimaryGone: return "primary_gone";
    case TripCause::kProtocol: return "protocol";
  }
  return "unknown";
}

const char* to_string(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kBadLayer: return "bad_layer";
    case Status::kBadRows: return "bad_rows";
    case Status::kBadK: return "bad_k";
    case Status::kBadExpert: return "bad_expert";
    case Status::kHotExpert: return "hot_expert";
    case Status::kBadWeight: return "bad_weight";
    case Status::kBadSequence: return "bad_sequence";
    case Status::kComputeError: return "compute_error";
  }
  return "unknown";
}

std::string state_name(uint32_t raw) {
  if (raw > static_cast<uint32_t>(LaneState::kStopped)) return fmt::format("unknown({})", raw);
  return to_string(static_cast<LaneState>(raw));
}

std::string cause_name(uint32_t raw) {
  if (raw > static_cast<uint32_t>(TripCause::kProtocol)) return fmt::format("unknown({})", raw);
  return to_string(static_cast<TripCause>(raw));
}

std::string status_name(uint32_t raw) {
  if (raw >= kStatusCount) return fmt::format("unknown({})", raw);
  return to_string(static_cast<Status>(raw));
}

std::string read_bounded(const char* src, size_t n) { return std::string(src, strnlen(src, n)); }

void write_bounded(char* dst, size_t n, std::string_view s) {
  size_t len = std::min(s.size(), n - 1);
  std::memcpy(dst, s.data(), len);
  dst[len] = '\0';
}

}  // namespace tandem::peer
