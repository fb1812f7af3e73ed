// A deterministic mock of the peer's expert computation, for transport tests and benches: expert e of
// layer l maps x to tanh(x · 0.25 · (e + 1) + 0.01 · l); expert e is cold in layer l when (e + l) % 3 == 0.
// The reference is the same function, compiled with FP contraction off, so results compare exactly.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>
#include <random>
#include <vector>

#include "peer/compute.h"

namespace tandem::test {

inline bool mock_is_cold(int layer, int expert) { return (expert + layer) % 3 == 0; }

// out[r] = Σ_j w[r, j] · tanh(x[r] · 0.25 · (id + 1) + 0.01 · layer) over ids != -1.
//   x [n_rows, hidden], ids/w [n_rows, k], out [n_rows, hidden]
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
__attribute__((noinline))
#else
__attribute__((noinline, optimize("fp-contract=off")))
#endif
inline void mock_expert_reference(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* w,
                                  int64_t k, int64_t hidden, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* o = out + r * hidden;
    for (int64_t c = 0; c < hidden; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = ids[r * k + j];
      if (id < 0) continue;
      const float scale = 0.25f * float(id + 1);
      const float shift = 0.01f * float(layer);
      const float wj = w[r * k + j];
      for (int64_t c = 0; c < hidden; ++c) {
        const float y = std::tanh(x[r * hidden + c] * scale + shift);
        o[c] += wj * y;
      }
    }
  }
}

class MockCompute : public peer::PeerCompute {
 public:
  MockCompute(int n_layers, int n_experts, int hidden, uint64_t sleep_us = 0)
      : n_layers_(n_layers), n_experts_(n_experts), hidden_(hidden), sleep_us_(sleep_us) {}
  int n_layers() const override { return n_layers_; }
  int n_experts() const override { return n_experts_; }
  bool is_cold(int layer, int expert) const override { return mock_is_cold(layer, expert); }
  void compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* weights, int64_t k,
               float* out) override {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    mock_expert_reference(layer, x, n_rows, ids, weights, k, hidden_, out);
  }

 private:
  int n_layers_, n_experts_, hidden_;
  uint64_t sleep_us_;
};

// A random valid request: rows in [1, max_rows] (or exactly n_rows when > 0), ids cold or -1.
struct MockRequest {
  int layer = 0;
  int64_t n_rows = 0;
  int64_t k = 0;
  std::vector<float> x;        // [n_rows, hidden]
  std::vector<int32_t> ids;    // [n_rows, k]
  std::vector<float> weights;  // [n_rows, k]
  std::vector<float> expected; // [n_rows, hidden]
};

inline MockRequest make_mock_request(std::mt19937_64& rng, int n_layers, int n_experts, int64_t hidden,
                                     int64_t max_rows, int64_t k, int64_t n_rows = 0) {
  MockRequest q;
  q.layer = int(rng() % uint64_t(n_layers));
  q.n_rows = n_rows > 0 ? n_rows : int64_t(1 + rng() % uint64_t(max_rows));
  q.k = k;
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  q.x.resize(size_t(q.n_rows * hidden));
  for (float& v : q.x) v = u(rng);
  q.ids.resize(size_t(q.n_rows * k));
  q.weights.resize(size_t(q.n_rows * k));
  for (int64_t i = 0; i < q.n_rows * k; ++i) {
    int32_t id = -1;
    if (rng() % 5 != 0) {
      // A cold expert of this layer: (e + layer) % 3 == 0.
      int first = (3 - q.layer % 3) % 3;
      int n_cold = (n_experts - first + 2) / 3;
      id = n_cold > 0 ? int32_t(first + 3 * int(rng() % uint64_t(n_cold))) : -1;
    }
    q.ids[size_t(i)] = id;
    q.weights[size_t(i)] = std::abs(u(rng)) * 0.5f;
  }
  q.expected.resize(size_t(q.n_rows * hidden));
  mock_expert_reference(q.layer, q.x.data(), q.n_rows, q.ids.data(), q.weights.data(), k, hidden, q.expected.data());
  return q;
}

}  // namespace tandem::test
