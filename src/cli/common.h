// The flags shared by the commands that run a model (generate, verify, profile, check, bench) and
// their conversion to the library's RuntimeOptions (runtime/runtime.h), which does the rest: devices,
// lanes, the split cut, loading the model and building the engine.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "runtime/runtime.h"

namespace tandem::cli {

// The flags as given (text); runtime_options() parses them.
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

// Which of the options a command offers: kDevice for a command that runs the model on its own (profile:
// no lane, nothing to wait for), kLanes for one that may run it through a lane.
enum class ModelOptionSet { kDevice, kLanes };

// kDevice: --model (required), --threads, --ctx, --device, --weights. kLanes adds, in help groups of
// their own, --lane, --peer, --rowmap, --peer-spin-limit, --peer-check, --check-min, --peer-wait (group
// "Lane") and --split-share, --split-peer, --host-wait (group "CUDA primary").
void add_model_options(CLI::App& app, ModelOptions& o, ModelOptionSet set = ModelOptionSet::kLanes);
// --weights checkpoint|fp8 (apply_weights_option), for commands that load a model without the options above.
void add_weights_option(CLI::App& app, std::string& weights);

// The flags parsed into the library's options, in the order they were always checked: --device, then
// --split-share (an error on every lane), --lane, --host-wait. InputError naming the flag at fault.
RuntimeOptions runtime_options(const ModelOptions& o, int64_t max_seqs = 64);

}  // namespace tandem::cli
