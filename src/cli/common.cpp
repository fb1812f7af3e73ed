// Shared model-running options (see common.h).
#include "cli/common.h"

#include "core/thread_pool.h"

namespace tandem::cli {

void add_model_options(CLI::App& app, ModelOptions& o) {
  app.add_option("--model", o.model_dir, "Model folder (config.json + safetensors)")->required();
  app.add_option("--threads", o.threads, "CPU threads (default: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--ctx", o.max_ctx, "Context limit per sequence (default: the model's max_position_embeddings)");
  app.add_option("--device", o.device, "cpu (cuda when built with the CUDA backend)");
  app.add_option("--lane", o.lane, "Where cold experts run: local");
}

Runtime make_runtime(const ModelOptions& o, int64_t max_seqs) {
  if (o.device != "cpu") fail("--device {}: this build runs on the cpu only", o.device);
  if (o.lane != "local") fail("--lane {}: unknown lane (supported: local)", o.lane);
  set_global_threads(o.threads);
  Runtime rt;
  rt.model = Model::load(o.model_dir);
  EngineOptions eo;
  eo.max_seqs = max_seqs;
  eo.max_ctx = o.max_ctx;
  rt.engine = std::make_unique<CpuEngine>(*rt.model, eo, rt.experts.get());
  return rt;
}

}  // namespace tandem::cli
