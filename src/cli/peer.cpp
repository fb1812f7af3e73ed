// `tandem peer`: the sidecar process. Loads only the cold experts of a rowmap into host memory (the
// CPU computes them) or one GPU's HBM (`--device cuda[:N]`: the CUDA backend's expert kernels), creates
// the lane's shared-memory segment (owner-only) once they are in place, logs `serving`, and computes
// requests until the lane stops, trips, the primary goes away, or SIGTERM/SIGINT. Exit: 0 normal stop,
// 1 tripped, 2 bad input/refused (a bad --device among them: then no segment is created), 4 the segment
// was damaged under the lane (corrupt header or truncated file; the lane is tripped with that cause).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <memory>

#include "cli/command.h"
#include "cli/common.h"
#include "peer/protocol.h"
#include "peer/server.h"
#include "runtime/exit_codes.h"
#include "runtime/lane.h"
#include "runtime/peer_side.h"

namespace tandem::cli {
namespace {

// What `tandem peer` was asked (its flags, as text where the library parses them).
struct Opts {
  PeerSideOptions side;
  std::string device = "cpu";
  uint64_t spin_us = 100;
};

RunFn setup(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->side.model_dir, "Model folder")->required();
  add_weights_option(app, o->side.weights);
  app.add_option("--rowmap", o->side.rowmap, "Rowmap (tandem plan): the cold experts this peer serves")->required();
  app.add_option("--lane", o->side.lane, "Lane name (shared memory /tandem-NAME)")->required();
  app.add_option("--device", o->device,
                 "Where the cold experts live and run: cpu (default: host memory, the CPU's cores), cuda or cuda:N "
                 "(that GPU's HBM, the CUDA backend's expert kernels; needs a build with the CUDA backend)");
  app.add_option("--threads", o->side.threads, "CPU threads for expert compute (default: all; unused with --device cuda)");
  app.add_option("--max-rows", o->side.max_rows, "Rows per request the segment holds (default 256)");
  app.add_option("--primary-stall", o->side.server.primary_stall_s,
                 "Seconds without a primary heartbeat after which the peer exits (default 2)");
  CLI::Option* spin = app.add_option(
      "--spin-us", o->spin_us,
      "Microseconds to keep polling the slots after the last request before napping on the doorbell "
      "(default 100; with --device cuda 1000000000, i.e. always polling on one core). A GPU primary rings the "
      "doorbell once per step, not per request: give such a peer more than the gaps between the requests of one "
      "step, e.g. 50000 (or 1000000000: a dedicated core); with less, its first requests wait for naps of up to "
      "10 ms, after which the peer polls 50000 on its own");
  app.add_option("--worker-spin-us", o->side.worker_spin_us,
                 "Microseconds a compute thread keeps polling for the next pass before it sleeps (default 200). "
                 "Waking sleeping threads costs tens of microseconds (more on a VM); when the gaps between "
                 "passes are longer than this (a GPU primary, many rows: ~1 ms), a larger value keeps the "
                 "--threads cores busy while the lane is active and lets them sleep only after this long idle")
      ->check(CLI::Range(int64_t(0), int64_t(10'000'000)));
  app.add_option("--split-share", o->side.split.share,
                 "Serve the split lane: hold and compute only the last (1 - F) of each cold expert's intermediate "
                 "features; a primary started with `--lane split` reads the first F over PCIe (it takes this cut; "
                 "see the header's split_column). auto: F = link / (link + DRAM) from the link's bandwidth (the "
                 "GPU of --link-device reading pinned host memory, or --link-gbps) and this host's DRAM "
                 "(measured with --threads, or --dram-gbps), where both parts take equally long: near the best at "
                 "one user; with many users a lower F can be faster (the GPU's part adds to its hot experts' time; "
                 "measure with `tandem bench`). 0 (default): whole experts, for the peer lane");
  app.add_option("--link-gbps", o->side.split.link_gbps,
                 "--split-share auto: the link's bandwidth in GB/s instead of measuring it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dram-gbps", o->side.split.dram_gbps,
                 "--split-share auto: this host's DRAM read bandwidth in GB/s instead of measuring it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--link-device", o->side.split.link_device,
                 "--split-share auto: the primary's GPU, whose reads of pinned host memory measure the link "
                 "(cuda or cuda:N; default cuda)");
  app.add_option("--delay-us", o->side.delay_us, "Testing aid: answer each request this many microseconds late");
  return [o, spin] {
    peer::validate_lane_name(o->side.lane);  // before the device is asked
    o->side.device = parse_device(o->device);
    o->side.server.spin_us = o->side.device.cuda && spin->count() == 0 ? 1'000'000'000 : o->spin_us;
    PeerSide side = open_peer_side(o->side);
    peer::install_stop_signals(*side.server);
    spdlog::info("peer: lane {} serving (rowmap {}, rowmap fingerprint {}, cold-expert weights {})", o->side.lane,
                 o->side.rowmap, side.rowmap_fingerprint, peer::fp1_text(side.weights_fp));
    const peer::ServeEnd end = side.server->serve();
    spdlog::info("peer: lane {} ended: {} after {} requests", o->side.lane, peer::to_string(end), side.server->served());
    return exit_code(end);
  };
}

}  // namespace
TANDEM_COMMAND(peer, "peer", "Run the sidecar: serve a rowmap's cold experts over shared memory", setup);
}  // namespace tandem::cli
