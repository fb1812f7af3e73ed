// The peer's view of the model: which experts are cold here and how to run them. The transport
// (server.h) validates every request against this before calling compute(); the integrator implements
// it over the real rowmap and expert weights, tests over a mock.
#pragma once

#include <cstdint>

namespace tandem::peer {

class PeerCompute {
 public:
  virtual ~PeerCompute() = default;
  virtual int n_layers() const = 0;   // layers a request may name: [0, n_layers)
  virtual int n_experts() const = 0;  // expert ids per layer: [0, n_experts)
  // True when this peer holds and serves `expert` of `layer`. Called only with ids in range.
  virtual bool is_cold(int layer, int expert) const = 0;
  // out[r] = Σ_j weights[r, j] · expert_{ids[r, j]}(x[r]) over the row's non-empty slots (id -1 = empty;
  // a row with no cold expert gets zeros). Every id is -1 or cold and every weight finite (validated).
  // Must write all of out. May throw std::exception: the request then fails with kComputeError.
  //   x       [n_rows, hidden] f32 (in shared memory: read it, never keep a pointer)
  //   ids     [n_rows, k] i32, weights [n_rows, k] f32 (private copies)
  //   out     [n_rows, hidden] f32
  virtual void compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* weights,
                       int64_t k, float* out) = 0;
};

}  // namespace tandem::peer
