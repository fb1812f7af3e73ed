// The peer side of a lane (`tandem peer`): open_peer_side loads a rowmap's cold experts (only them) into
// host memory (the CPU's cores) or one GPU's HBM (the CUDA backend's expert kernels), takes the split
// cut, and creates the lane's shared-memory segment once they are in place, page-locked for a GPU peer
// so that rows move with one DMA each way. The caller then serves it and maps the end to an exit code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "models/model.h"
#include "peer/compute.h"
#include "peer/server.h"
#include "placement/rowmap.h"
#include "runtime/lane.h"
#include "runtime/split.h"

namespace tandem {

struct ColdHolding {
  std::unique_ptr<peer::PeerCompute> compute;
  int64_t n_cold = 0;  // cold experts held
  size_t bytes = 0;    // bytes they take
  std::string where;   // "in host memory (..% on huge pages), N threads" / "in the HBM of cuda:N"
};

// Copies the cold experts of `rm` (validated against `model`, which may have bound only them) onto
// `device`: features [split_begin, inter) of each when split_begin > 0 (the split lane). A GPU reserves
// buffers for requests of up to max_rows rows; the CPU computes with `pool`. InputError as the holders
// say (device memory, dtypes, a cut outside the experts). The model may be released afterwards.
ColdHolding load_cold(const Model& model, const Rowmap& rm, const Device& device, int64_t max_rows,
                      int64_t split_begin, ThreadPool& pool);

// Page-locks [base, base + bytes) for a GPU peer's copies while the returned handle lives (nothing on
// the CPU; best effort: a refusal is logged and the copies stage through the driver). Release it
// before the range is unmapped.
std::shared_ptr<void> pin_for_device(const Device& device, void* base, size_t bytes);

// What `tandem peer` was asked.
struct PeerSideOptions {
  std::string model_dir, rowmap;
  std::string lane;                   // the lane name (shared memory /tandem-NAME)
  std::string weights = "checkpoint";  // apply_weights_option
  Device device;                      // parse_device
  int threads = 0;                    // CPU threads for expert compute (0: all; one on a GPU)
  int64_t worker_spin_us = ThreadPool::kDefaultSpinUs;
  uint32_t max_rows = 256;            // rows per request the segment holds
  uint32_t slots = 1;
  PeerSplitOptions split;             // the cut (choose_peer_split)
  peer::ServerOptions server;         // spin, primary stall
  uint64_t delay_us = 0;              // testing aid: answer every request this many microseconds late
};

// A lane's peer, created and ready to serve. Members in destruction order (last first): the pinning
// goes before the segment is unmapped, the server before the computation it calls.
struct PeerSide {
  ColdHolding cold;
  std::unique_ptr<peer::PeerCompute> delayed;  // delay_us > 0: wraps cold.compute
  int64_t split_column = 0;                    // 0: whole experts (the peer lane)
  std::string rowmap_fingerprint;
  uint64_t weights_fp = 0;                     // cold_weights_fingerprint
  std::unique_ptr<peer::PeerServer> server;
  std::shared_ptr<void> pinned;                // pin_for_device of the segment
};

// Validates the lane name, then loads and checks what the options name (model, rowmap for this model,
// the cut), copies the cold experts onto the device and creates the segment (nothing is created when
// any of it fails). Logs what it holds. InputError naming what was wrong; OutOfMemoryError where the
// device says so.
PeerSide open_peer_side(const PeerSideOptions& o);

}  // namespace tandem
