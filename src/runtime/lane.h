// Where a model's cold experts run (the lane), the device the primary runs on, and how the primary's
// host thread waits: the typed values every command, benchmark and the server build a runtime from.
// Each is parsed from its text once, at the edge (flags, a request), with an InputError that lists the
// valid names; nothing past the parse compares strings.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tandem {

// local: every expert on the primary. host (CUDA primary): cold experts in pinned host memory, read
// over PCIe by the GPU. peer: cold experts computed by a `tandem peer` over shared memory. split (CUDA
// primary): a share of each cold expert's features over PCIe, the rest computed by a split peer.
enum class Lane { kLocal, kHost, kPeer, kSplit };

// "local", "host", "peer", "split". InputError "<flag>: unknown lane '<name>' (local, host, peer,
// split)" for anything else; `flag` names where the text came from (--lane, --lanes).
Lane parse_lane(std::string_view name, std::string_view flag = "--lane");
const char* lane_name(Lane lane);
// The lanes with a peer process (peer, split): they need a peer lane name and a rowmap.
bool lane_has_peer(Lane lane);
// The lanes with cold experts (host, peer, split): they need a placement (a rowmap or a stand-in).
bool lane_has_cold(Lane lane);

// The primary's device: the CPU, or CUDA device `index`.
struct Device {
  bool cuda = false;
  int index = 0;  // the CUDA device (cuda only)
  bool is_cpu() const { return !cuda; }
  std::string name() const;  // "cpu" or "cuda:N"
};
// "cpu", "cuda" (device 0) or "cuda:N". InputError naming the value for anything else, for a GPU in
// a build without the CUDA backend, and for an index with no such device (the count is asked of the
// driver: this is the only part that touches the GPU).
Device parse_device(std::string_view text);
// The syntax alone ("cuda" -> 0, "cuda:N" -> N, nullopt otherwise, "cpu" included): for flags that
// name a GPU to measure from rather than to run on.
std::optional<int> parse_cuda_index(std::string_view text);

// How a CUDA primary's host thread waits for each step (--host-wait): spin (lowest latency, holds a
// core), sleep (on a blocking-sync event; the core is free meanwhile, e.g. for a CPU peer on the same
// host), or auto: sleep on the lanes with a peer, spin on the others.
enum class HostWait { kAuto, kSpin, kSleep };
// "auto", "spin", "sleep"; InputError naming --host-wait otherwise.
HostWait parse_host_wait(std::string_view text);
const char* host_wait_name(HostWait wait);
// Whether the host thread sleeps on `lane` with `wait`.
bool host_wait_sleeps(HostWait wait, Lane lane);

}  // namespace tandem
