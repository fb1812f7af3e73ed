// Lane, device and host-wait parsing (see lane.h).
#include "runtime/lane.h"

#include <fmt/format.h>

#include "core/error.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"
#endif

namespace tandem {

Lane parse_lane(std::string_view name, std::string_view flag) {
  for (Lane l : {Lane::kLocal, Lane::kHost, Lane::kPeer, Lane::kSplit})
    if (name == lane_name(l)) return l;
  fail("{}: unknown lane '{}' (local, host, peer, split)", flag, name);
}

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::kLocal: return "local";
    case Lane::kHost: return "host";
    case Lane::kPeer: return "peer";
    case Lane::kSplit: return "split";
  }
  return "unknown";
}

bool lane_has_peer(Lane lane) { return lane == Lane::kPeer || lane == Lane::kSplit; }

bool lane_has_cold(Lane lane) { return lane != Lane::kLocal; }

std::string Device::name() const { return cuda ? fmt::format("cuda:{}", index) : std::string("cpu"); }

std::optional<int> parse_cuda_index(std::string_view text) {
  if (text == "cuda") return 0;
  if (text.substr(0, 5) != "cuda:" || text.size() == 5 || text.size() > 8) return std::nullopt;
  int v = 0;
  for (char ch : text.substr(5)) {
    if (ch < '0' || ch > '9') return std::nullopt;
    v = v * 10 + (ch - '0');
  }
  return v;
}

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device{};
#ifdef TANDEM_HAVE_CUDA
  const std::optional<int> gpu = parse_cuda_index(text);
  if (!gpu) fail("--device {}: unknown device (cpu, cuda, cuda:N)", text);
  const int n = cuda_device_count();
  if (*gpu >= n) fail("--device {}: no such device ({} CUDA device(s) found)", text, n);
  return Device{true, *gpu};
#else
  fail("--device {}: this build has no CUDA backend (cpu only)", text);
#endif
}

HostWait parse_host_wait(std::string_view text) {
  for (HostWait w : {HostWait::kAuto, HostWait::kSpin, HostWait::kSleep})
    if (text == host_wait_name(w)) return w;
  fail("--host-wait {}: give auto, spin or sleep", text);
}

const char* host_wait_name(HostWait wait) {
  switch (wait) {
    case HostWait::kAuto: return "auto";
    case HostWait::kSpin: return "spin";
    case HostWait::kSleep: return "sleep";
  }
  return "unknown";
}

bool host_wait_sleeps(HostWait wait, Lane lane) {
  switch (wait) {
    case HostWait::kAuto: return lane_has_peer(lane);
    case HostWait::kSpin: return false;
    case HostWait::kSleep: return true;
  }
  return false;
}

}  // namespace tandem
