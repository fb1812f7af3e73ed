// Shared model-running flags (see common.h).
#include "cli/common.h"

#include <string>

#include "runtime/split.h"

namespace tandem::cli {

void add_model_options(CLI::App& app, ModelOptions& o, ModelOptionSet set) {
  app.add_option("--model", o.model_dir, "Model folder (config.json + safetensors)")->required();
  app.add_option("--threads", o.threads, "CPU threads (default: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--ctx", o.max_ctx, "Context limit per sequence (default: the model's max_position_embeddings)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
#ifdef TANDEM_HAVE_CUDA
  app.add_option("--device", o.device, "cpu (default), cuda or cuda:N");
#else
  app.add_option("--device", o.device, "cpu (this build has no CUDA backend: -DTANDEM_CUDA=ON adds cuda, cuda:N)");
#endif
  add_weights_option(app, o.weights);
  if (set == ModelOptionSet::kDevice) return;
  const std::string lane_group = "Lane (cold experts elsewhere; see docs/lanes.md)";
  const std::string cuda_group = "CUDA primary (--device cuda)";
  app.add_option("--lane", o.lane,
                 "Where the rowmap's cold experts run: local (every expert on the device, default), peer (a sidecar "
                 "process started with `tandem peer`), host (cuda: cold experts in pinned host memory, read "
                 "over PCIe by the GPU), split (cuda: the --split-share of each cold expert's features read over "
                 "PCIe, the rest computed by a `tandem peer --split-share F|auto`)")
      ->group(lane_group);
  app.add_option("--peer", o.peer, "Lane name of the peer (lanes peer and split)")->group(lane_group);
  app.add_option("--rowmap", o.rowmap, "Rowmap of the cold experts (lanes peer, host and split)")->group(lane_group);
  app.add_option("--peer-spin-limit", o.peer_spin_limit_us,
                 "Microseconds to spin on the peer's answer before blocking (no deadline; counted as an overrun)")
      ->group(lane_group);
  app.add_option("--peer-check", o.peer_check,
                 "Check gate: recompute every Nth handoff per layer here and compare (0 = off); a row below "
                 "--check-min trips the lane: the request fails, no further token")
      ->check(CLI::NonNegativeNumber)
      ->group(lane_group);
  app.add_option("--check-min", o.check_min, "Check gate bar: the lowest cosine a checked row may have (default 0.999)")
      ->check(CLI::Range(-1.0, 1.0))
      ->group(lane_group);
  app.add_option("--peer-wait", o.peer_wait_s,
                 "Seconds to wait for the lane's peer to appear and accept this primary (default 30)")
      ->check(CLI::NonNegativeNumber)
      ->group(lane_group);
  app.add_option("--split-share", o.split,
                 "Lane split: share of each cold expert's intermediate features the GPU reads over PCIe, or auto "
                 "(default): the cut the lane's `tandem peer --split-share F|auto` chose. A share given here must "
                 "be the peer's")
      ->group(cuda_group);
  app.add_option("--split-peer", o.split_peer, "Lane split: lane name of its peer when it differs from --peer")
      ->group(cuda_group);
  app.add_option("--host-wait", o.host_wait,
                 "cuda: how the host thread waits for each step: spin (lowest latency, holds a core), sleep (on a "
                 "blocking-sync event: woken a little later, and the core is free meanwhile, e.g. for a CPU peer "
                 "on this host) or auto (default: sleep on lanes peer and split, spin on local and host)")
      ->check(CLI::IsMember({"auto", "spin", "sleep"}))
      ->group(cuda_group);
}

void add_weights_option(CLI::App& app, std::string& weights) {
  app.add_option("--weights", weights,
                 "checkpoint (default: as stored) or fp8: routed experts stored in bf16/f16/f32 are quantized as "
                 "they load to FP8 e4m3 with 128x128 block scales (half the bytes of bf16; the model fingerprint "
                 "says so, so the peer, the primary and the rowmap must all use it)")
      ->check(CLI::IsMember({"checkpoint", "fp8"}));
}

RuntimeOptions runtime_options(const ModelOptions& o, int64_t max_seqs) {
  RuntimeOptions r;
  r.device = parse_device(o.device);
  r.split_share = parse_split_share(o.split);
  r.lane = parse_lane(o.lane);
  r.host_wait = parse_host_wait(o.host_wait);
  r.model_dir = o.model_dir;
  r.threads = o.threads;
  r.max_ctx = o.max_ctx;
  r.peer = o.peer;
  r.split_peer = o.split_peer;
  r.rowmap = o.rowmap;
  r.peer_spin_limit_us = o.peer_spin_limit_us;
  r.peer_check = o.peer_check;
  r.check_min = o.check_min;
  r.peer_wait_s = o.peer_wait_s;
  r.weights = o.weights;
  r.max_seqs = max_seqs;
  return r;
}

}  // namespace tandem::cli
