// A wrong peer behind a right handshake, for the check gate's tests on every primary: it computes the
// rowmap's cold experts with the model's own weights and negates every output row, and it announces the
// same rowmap and weights fingerprints the primary expects, so only the check gate can catch it.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "engine/generate.h"
#include "models/model.h"
#include "moe/experts.h"
#include "moe/peer_lane.h"
#include "peer/compute.h"
#include "peer/server.h"
#include "placement/rowmap.h"

namespace tandem::test {

class NegatedCompute final : public peer::PeerCompute {
 public:
  NegatedCompute(const Model& m, const Rowmap& rm) : model_(m), rm_(rm) {}
  int n_layers() const override { return int(model_.cfg.n_layer); }
  int n_experts() const override { return int(model_.cfg.n_expert); }
  bool is_cold(int layer, int expert) const override { return rm_.is_cold(layer, expert); }
  void compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* w, int64_t k,
               float* out) override {
    const int64_t H = model_.cfg.hidden_size;
    run_experts_cpu(model_.layers[size_t(layer)].experts, x, n_rows, H, ids, w, k, out, pool_);
    for (int64_t i = 0; i < n_rows * H; ++i) out[i] = -out[i];
  }

 private:
  const Model& model_;
  const Rowmap& rm_;
  ThreadPool pool_{1};  // its own: the primary computes at the same time
};

// Serves NegatedCompute on `lane` (whole experts) from a thread until the lane ends; join() says how.
class NegatedPeer {
 public:
  NegatedPeer(const Model& model, const Rowmap& rm, const std::string& lane) : compute_(model, rm) {
    peer::Geometry g;
    g.max_rows = 64;
    g.hidden = uint32_t(model.cfg.hidden_size);
    g.max_k = uint32_t(model.cfg.n_expert_used);
    const uint64_t weights = cold_weights_fingerprint(model, rm);
    server_ = peer::PeerServer::create(lane, lane_fingerprint(rm, 0, weights), g, compute_, {},
                                       peer::fp1_value(rm.rowmap_fingerprint), weights);
    thread_ = std::thread([this] { end_ = server_->serve(); });
  }
  ~NegatedPeer() {
    if (thread_.joinable()) {
      server_->request_stop();
      thread_.join();
    }
  }
  peer::ServeEnd join() {
    thread_.join();
    return end_;
  }

 private:
  NegatedCompute compute_;
  std::unique_ptr<peer::PeerServer> server_;
  std::thread thread_;
  peer::ServeEnd end_{};
};

// Generates from `engine`, whose lane is a NegatedPeer's, with the check gate on every handoff: the lane
// must trip at the gate (cause check_failed, the default bar 0.999 named) before any token.
inline void expect_check_gate_trips(Engine& engine) {
  GenerateRequest req;
  req.prompt = {5, 17, 99, 3};
  req.max_tokens = 4;
  int tokens = 0;
  GenerateOptions go;
  go.on_token = [&](size_t, int32_t) { ++tokens; };
  try {
    generate(engine, std::span<const GenerateRequest>(&req, 1), go);
    ADD_FAILURE() << "generation with a wrong peer returned";
  } catch (const peer::LaneTripped& e) {
    EXPECT_EQ(e.cause(), peer::TripCause::kCheck) << e.what();
    EXPECT_NE(std::string(e.what()).find("below the bar 0.999"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tokens, 0);
}

}  // namespace tandem::test
