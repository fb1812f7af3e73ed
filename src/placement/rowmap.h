// Rowmap (`tandem.rowmap/1`): per MoE layer, which routed experts the primary keeps (hot) and which
// the peer computes (cold). Carries the model fingerprint it was planned for, its own rowmap
// fingerprint (model fingerprint + lists, what the peer protocol carries) and a summary of the stats
// it came from. Invariant after validate(): every expert of every MoE layer appears exactly once.
// Lists are kept sorted by expert id; position in the cold list is the peer's slot for that expert.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/config.h"

namespace tandem {

inline constexpr std::string_view kRowmapSchema = "tandem.rowmap/1";

struct RowmapLayer {
  int64_t layer = 0;          // model layer index (a MoE layer)
  std::vector<int32_t> hot;   // expert ids kept on the primary, ascending
  std::vector<int32_t> cold;  // expert ids computed by the peer, ascending
};

// What the map was planned from and what it expects: copied from the stats and the planner.
struct RowmapSource {
  std::string mode;                                  // the stats' profile mode
  std::map<std::string, int64_t> tokens;             // decode steps per kind in the stats
  std::string policy;                                // "uniform" or "global"
  std::string budget;                                // the budget as the operator gave it
  int64_t kv_tokens = -1;                            // KV capacity the memory model gives (-1: no memory budget)
  double expected_cold_share = 0;                    // share of routed rows that go to cold experts
  std::map<std::string, double> expected_cold_share_by_kind;
};

struct Rowmap {
  std::string fingerprint;         // model fingerprint
  std::string rowmap_fingerprint;  // = compute_rowmap_fingerprint(*this); set by finalize()/from_json
  RowmapSource source;
  std::vector<RowmapLayer> layers;  // one per MoE layer, by increasing layer index

  // nullptr when the layer is not in the map.
  const RowmapLayer* find_layer(int64_t layer) const;
  // True when `expert` of model layer `layer` is cold. The layer must be in the map (asserted).
  bool is_cold(int64_t layer, int32_t expert) const;
  int64_t n_hot() const;   // over all layers
  int64_t n_cold() const;
  // Sorts every list and sets rowmap_fingerprint.
  void finalize();

  nlohmann::json to_json() const;
  // Checks the syntax (schema, types, ids fit int32) and the stored rowmap_fingerprint against the
  // contents; does not check against a model: call validate() for that. Errors name `source`.
  static Rowmap from_json(const nlohmann::json& j, std::string_view source);
  static Rowmap load(const std::string& path);
  void save(const std::string& path) const;
};

// "fp1:<16 hex>" over the model fingerprint and, per layer, its index and sorted hot and cold lists.
std::string compute_rowmap_fingerprint(const Rowmap& rm);

// The one check every consumer runs (plan --check, the peer, the primary): the rowmap's fingerprint
// equals model_fingerprint (the error names both), every MoE layer of cfg appears exactly once and no
// other layer, and per layer every expert id in [0, n_expert) appears exactly once across hot and
// cold. `source` names the rowmap in errors. Throws InputError.
void validate(const Rowmap& rm, const ModelConfig& cfg, std::string_view model_fingerprint,
              std::string_view source = "rowmap");

// The model-independent part of validate(): layers = exactly the `moe_layers`, per layer each id in
// [0, n_expert) exactly once. Used where only stats describe the model (plan --evaluate).
void validate_lists(const Rowmap& rm, const std::vector<int64_t>& moe_layers, int64_t n_expert,
                    std::string_view source = "rowmap");

// Per model layer expert -> slot table for fast lookups: table[e] = position in hot (>= 0) or
// -(1 + position in cold) when cold. Requires a validated map.
std::vector<int32_t> expert_slot_table(const RowmapLayer& layer, int64_t n_expert);

}  // namespace tandem
