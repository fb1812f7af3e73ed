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
    case TripCause::kCheck: return "check_failed";
    case TripCause::kCorrupt: return "corrupt";
    case TripCause::kShrunk: return "shrunk";
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
  if (raw >= kTripCauseCount) return fmt::format("unknown({})", raw);
  return to_string(static_cast<TripCause>(raw));
}

std::string status_name(uint32_t raw) {
  if (raw >= kStatusCount) return fmt::format("unknown({})", raw);
  return to_string(static_cast<Status>(raw));
}

std::string read_bounded(const char* src, size_t n) { return sanitize(std::string_view(src, strnlen(src, n))); }

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += char(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

TripCause trip_cause_of(uint32_t raw) { return raw < kTripCauseCount ? TripCause(raw) : TripCause::kNone; }

uint64_t fp1_value(std::string_view text) {
  if (text.size() != 20 || text.substr(0, 4) != "fp1:") return 0;
  uint64_t v = 0;
  for (char c : text.substr(4)) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return 0;
    v = v << 4 | uint64_t(d);
  }
  return v;
}

std::string fp1_text(uint64_t value) { return fmt::format("fp1:{:016x}", value); }

std::string describe_mismatch(uint64_t a_lane, uint64_t a_rowmap, uint64_t a_weights, uint64_t b_lane,
                              uint64_t b_rowmap, uint64_t b_weights, const char* a, const char* b) {
  std::string parts;
  auto part = [&](const char* what, uint64_t x, uint64_t y, const char* hint) {
    if (x == y || x == 0 || y == 0) return;
    if (!parts.empty()) parts += "; ";
    parts += fmt::format("{} {} {}, {} {} ({})", a, what, fp1_text(x), b, fp1_text(y), hint);
  };
  part("serves rowmap", a_rowmap, b_rowmap, "another rowmap or model");
  part("holds cold-expert weights", a_weights, b_weights, "same shapes, other weights: another checkpoint");
  if (parts.empty())
    parts = a_rowmap && b_rowmap && a_weights && b_weights
                ? fmt::format("{} and {} hold rowmap {} and weights {} but split the experts differently", a, b,
                              fp1_text(a_rowmap), fp1_text(a_weights))
                : fmt::format("{} serves lane {:016x}, {} expects {:016x} (model, rowmap, weights or cut differ)", a,
                              a_lane, b, b_lane);
  return parts;
}

void write_bounded(char* dst, size_t n, std::string_view s) {
  size_t len = std::min(s.size(), n - 1);
  std::memcpy(dst, s.data(), len);
  dst[len] = '\0';
}

}  // namespace tandem::peer
