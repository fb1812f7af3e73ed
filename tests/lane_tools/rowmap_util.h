// Test rowmaps: a hand-made hot/cold split of a model folder's MoE layers (no profiling needed), with
// the model's real fingerprint, as `tandem plan` would write it.
#pragma once

#include <functional>
#include <string>

#include "io/config.h"
#include "io/safetensors.h"
#include "placement/fingerprint.h"
#include "placement/rowmap.h"

namespace tandem::test {

// cold(layer, expert) decides the split.
inline Rowmap make_rowmap(const std::string& dir, const std::function<bool(int64_t, int64_t)>& cold) {
  ModelConfig cfg = load_config(dir);
  TensorStore store = TensorStore::open_dir(dir);
  Rowmap rm;
  rm.fingerprint = model_fingerprint(cfg, store);
  rm.source.mode = "test";
  rm.source.policy = "uniform";
  rm.source.budget = "test";
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    if (!cfg.layer_is_moe[size_t(l)]) continue;
    RowmapLayer layer;
    layer.layer = l;
    for (int64_t e = 0; e < cfg.n_expert; ++e) (cold(l, e) ? layer.cold : layer.hot).push_back(int32_t(e));
    rm.layers.push_back(layer);
  }
  rm.finalize();
  return rm;
}

inline void write_rowmap(const std::string& dir, const std::string& path,
                         const std::function<bool(int64_t, int64_t)>& cold) {
  make_rowmap(dir, cold).save(path);
}

}  // namespace tandem::test
