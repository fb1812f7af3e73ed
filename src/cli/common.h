// Options shared by the commands that run a model (generate, verify, profile, check, bench) and the
// set-up they share: load the model, pick the device and the lane, build the engine.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/model.h"
#include "moe/peer_lane.h"
#include "placement/rowmap.h"

namespace tandem::cli {

struct ModelOptions {
  std::string model_dir;
  int threads = 0;  // 0: all hardware threads
  int64_t max_ctx = 0;
  std::string device = "cpu";
  std::string lane = "local";
  std::string peer;     // --peer NAME (lanes peer and split)
  std::string split_peer;  // --split-peer NAME (lane split; default: --peer)
  std::string split = "auto";  // --split-share F|auto (lane split: share of each cold expert's features read
                               // over PCIe; auto: the cut its peer publishes)
  std::string rowmap;   // --rowmap R (lanes peer, host and split)
  uint64_t peer_spin_limit_us = 50;
  int64_t peer_check = 0;
  double check_min = 0.999;   // --check-min: a checked row below it trips the lane (-2: record only)
  double peer_wait_s = 30;    // --peer-wait: how long to wait for the lane's peer to appear and accept
  std::string host_wait = "auto";  // --host-wait (cuda): auto, spin or sleep
  std::string weights = "checkpoint";  // --weights checkpoint|fp8 (apply_weights_option)
};

// --device: nullopt for "cpu", the GPU index for "cuda" / "cuda:N". InputError (naming the value) for
// anything else, for a GPU in a build without the CUDA backend, and for an index with no such device.
std::optional<int> parse_device(const std::string& device);

// --split-share: a share in (0, 1), or nullopt for "auto". InputError naming the flag otherwise.
std::optional<double> parse_split_share(const std::string& value);

// The split lane's cut (intermediate feature) for a model of `inter` features: split_column of the share,
// or with "auto" the cut lane `lane`'s peer published (waiting up to timeout_s for the peer to come up).
// InputError when that peer serves whole experts or a cut outside the model's experts.
int64_t resolve_split_column(const std::string& share, const std::string& lane, int64_t inter, double timeout_s);

// Whether a GPU primary on `lane` sleeps on a blocking-sync event for each step (--host-wait
// `host_wait`): sleep always, spin never, auto on the lanes with a peer (peer, split), whose CPU peer
// on the same host can use the freed core.
inline bool host_wait_sleeps(const std::string& host_wait, const std::string& lane) {
  if (host_wait == "auto") return lane == "peer" || lane == "split";
  return host_wait == "sleep";
}

// Which of the options a command offers: kDevice for a command that runs the model on its own (profile:
// no lane, nothing to wait for), kLanes for one that may run it through a lane.
enum class ModelOptionSet { kDevice, kLanes };

// kDevice: --model (required), --threads, --ctx, --device, --weights. kLanes adds, in help groups of
// their own, --lane, --peer, --rowmap, --peer-spin-limit, --peer-check, --check-min, --peer-wait (group
// "Lane") and
// --split-share, --split-peer, --host-wait (group "CUDA primary").
void add_model_options(CLI::App& app, ModelOptions& o, ModelOptionSet set = ModelOptionSet::kLanes);
// --weights checkpoint|fp8 (apply_weights_option), for commands that load a model without the options above.
void add_weights_option(CLI::App& app, std::string& weights);

// A model with its engine on the chosen device and lane.
struct Runtime {
  std::string lane;                          // --lane
  std::unique_ptr<Model> model;
  std::unique_ptr<Rowmap> rowmap;            // lanes that split experts
  std::unique_ptr<PeerExperts> peer;         // lane peer on the CPU
  std::unique_ptr<Engine> engine;
  int64_t split_column = 0;                  // lane split: the cut both sides use (features [0, it) on the GPU)
  // Counters of the lane, for the closing summary ("" for the local and host lanes); the CPU peer
  // lane and the CUDA engine's peer lane alike.
  std::string lane_summary() const;
  // The check gate's per-layer results of a peer lane (CPU or GPU primary); null for other lanes.
  const std::vector<LayerCheck>* lane_checks() const;

 private:
  mutable std::vector<LayerCheck> gpu_checks_;
};
// Checks the options that need no model first (device, split share, lane names), then loads the model
// and checks --ctx against it (warns above max_position_embeddings).
Runtime make_runtime(const ModelOptions& o, int64_t max_seqs = 64);

// The context limit per sequence a runtime made from `o` enforces: --ctx, else what the engine takes
// by default for `cfg` (the CPU engine: max_position_embeddings, or 4096 when the config has none).
int64_t context_limit(const ModelOptions& o, const ModelConfig& cfg);

}  // namespace tandem::cli
