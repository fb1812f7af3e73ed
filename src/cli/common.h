// Options shared by the commands that run a model (generate, verify, profile, check, bench) and the
// set-up they share: load the model, pick the lane, build the engine.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "engine/engine.h"
#include "models/model.h"

namespace tandem::cli {

struct ModelOptions {
  std::string model_dir;
  int threads = 0;  // 0: all hardware threads
  int64_t max_ctx = 0;
  std::string device = "cpu";
  std::string lane = "local";
};

// --model (required), --threads, --ctx, --device, --lane.
void add_model_options(CLI::App& app, ModelOptions& o);

// A model with its engine on the chosen device and lane.
struct Runtime {
  std::unique_ptr<Model> model;
  std::unique_ptr<ExpertExecutor> experts;  // null: local lane
  std::unique_ptr<Engine> engine;
};
Runtime make_runtime(const ModelOptions& o, int64_t max_seqs = 64);

}  // namespace tandem::cli
