// The peer side of a lane (`tandem peer`): the cold experts of a rowmap as the peer holds and computes
// them, in host memory (the CPU's cores) or one GPU's HBM (the CUDA backend's expert kernels), and the
// page-locking of the lane's segment that lets a GPU peer copy rows with one DMA each way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "models/model.h"
#include "peer/compute.h"
#include "placement/rowmap.h"
#include "runtime/lane.h"

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

}  // namespace tandem
