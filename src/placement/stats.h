// Expert traffic statistics (`tandem.stats/1`): per MoE layer and routed expert, the token rows routed
// to it and the sum of their gate weights, split by corpus kind, plus the decode steps (tokens)
// counted per kind. `tandem profile` fills it through record(); `tandem plan` ranks experts by it.
// Invariant (checked on load): per layer and kind, rows summed over experts <= tokens × n_expert_used.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/config.h"

namespace tandem {

inline constexpr std::string_view kStatsSchema = "tandem.stats/1";

// teacher: every position of the text is one decode step; generate: the steps the model generated
// from corpus prompts.
enum class ProfileMode { kTeacher, kGenerate };
std::string_view profile_mode_name(ProfileMode m);
std::optional<ProfileMode> profile_mode_from_name(std::string_view s);

// The counts of one kind of traffic.
struct KindCounts {
  int64_t tokens = 0;               // decode steps counted
  std::vector<int64_t> rows;        // [n_moe_layer, n_expert] token rows routed to each expert
  std::vector<double> gate_weight;  // [n_moe_layer, n_expert] sum of those rows' gate weights
};

class ExpertStats {
 public:
  // moe_layers: the model layer index of each MoE layer, strictly increasing, >= 0.
  ExpertStats(std::string fingerprint, std::string model_type, ProfileMode mode, std::vector<int64_t> moe_layers,
              int64_t n_expert, int64_t n_expert_used);
  // Empty stats shaped for cfg (its MoE layers, n_expert, n_expert_used). Does not call config.cpp.
  static ExpertStats for_model(const ModelConfig& cfg, std::string fingerprint, ProfileMode mode);

  // Counts one layer's routing of n_rows token rows: ids [n_rows, k] (−1 = empty slot, skipped),
  // weights [n_rows, k] (the gate weights the MoE block applies; nullptr counts rows only).
  // `layer` is a model layer index and must be a MoE layer; k must equal n_expert_used; ids must be
  // -1 or in [0, n_expert) — violations are caller bugs (asserted). Not thread-safe.
  void record(int64_t layer, const int32_t* ids, const float* weights, int64_t n_rows, int64_t k,
              std::string_view kind);
  // Adds n decode steps of `kind` (call once per counted token, not per layer).
  void add_tokens(std::string_view kind, int64_t n);
  // Adds other's counts. Fails (InputError) when other comes from another model (fingerprints named)
  // or has another shape or mode.
  void merge(const ExpertStats& other);

  const std::string& fingerprint() const { return fingerprint_; }
  const std::string& model_type() const { return model_type_; }
  ProfileMode mode() const { return mode_; }
  const std::vector<int64_t>& moe_layers() const { return moe_layers_; }
  int64_t n_moe_layer() const { return int64_t(moe_layers_.size()); }
  int64_t n_expert() const { return n_expert_; }
  int64_t n_expert_used() const { return n_expert_used_; }
  // Position of a model layer among the MoE layers, or -1 when it is not one.
  int64_t layer_slot(int64_t layer) const;

  // Kinds seen, sorted by name.
  std::vector<std::string> kinds() const;
  // nullptr when the kind was never recorded.
  const KindCounts* counts(std::string_view kind) const;
  int64_t tokens(std::string_view kind) const;
  int64_t total_tokens() const;
  // Summed over every kind (or one kind when given): rows / gate weights of (MoE slot, expert).
  int64_t rows(int64_t slot, int64_t expert) const;
  double gate_weight(int64_t slot, int64_t expert) const;
  // [n_moe_layer, n_expert] rows summed over kinds.
  std::vector<int64_t> total_rows() const;
  std::vector<double> total_gate_weight() const;

  // Free-form provenance written by profile (corpus path, kinds, max tokens...). Strings only.
  std::map<std::string, std::string>& meta() { return meta_; }
  const std::map<std::string, std::string>& meta() const { return meta_; }

  nlohmann::json to_json() const;
  // Validates everything (schema, types, shapes, ranges, the rows <= tokens × k invariant); errors
  // name `source` and the field.
  static ExpertStats from_json(const nlohmann::json& j, std::string_view source);
  static ExpertStats load(const std::string& path);
  void save(const std::string& path) const;

 private:
  KindCounts& kind_counts(std::string_view kind);

  std::string fingerprint_;
  std::string model_type_;
  ProfileMode mode_;
  std::vector<int64_t> moe_layers_;
  int64_t n_expert_;
  int64_t n_expert_used_;
  std::map<std::string, KindCounts, std::less<>> kinds_;
  std::map<std::string, std::string> meta_;
};

// Checks that stats belong to this model: the fingerprint equals model_fingerprint (the error names
// both), the MoE layers and n_expert match the config. `source` names the stats file in errors.
void validate_stats(const ExpertStats& stats, const ModelConfig& cfg, std::string_view model_fingerprint,
                    std::string_view source);

// The model layer index of every MoE layer of cfg (layer_is_moe), in order.
std::vector<int64_t> moe_layer_indices(const ModelConfig& cfg);

}  // namespace tandem
