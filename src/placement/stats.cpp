// Expert traffic statistics and their JSON form (see stats.h and docs/placement.md "Stats").
#include "placement/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/ranges.h>

#include "core/error.h"
#include "placement/json_fields.h"

namespace tandem {

using nlohmann::json;
namespace pj = placement_json;

std::string_view profile_mode_name(ProfileMode m) {
  switch (m) {
    case ProfileMode::kTeacher:
      return "teacher";
    case ProfileMode::kGenerate:
      return "generate";
  }
  TANDEM_ASSERT(false, "unknown profile mode {}", int(m));
}

std::optional<ProfileMode> profile_mode_from_name(std::string_view s) {
  if (s == "teacher") return ProfileMode::kTeacher;
  if (s == "generate") return ProfileMode::kGenerate;
  return std::nullopt;
}

std::vector<int64_t> moe_layer_indices(const ModelConfig& cfg) {
  std::vector<int64_t> out;
  for (size_t l = 0; l < cfg.layer_is_moe.size(); ++l)
    if (cfg.layer_is_moe[l]) out.push_back(int64_t(l));
  return out;
}

ExpertStats::ExpertStats(std::string fingerprint, std::string model_type, ProfileMode mode,
                         std::vector<int64_t> moe_layers, int64_t n_expert, int64_t n_expert_used)
    : fingerprint_(std::move(fingerprint)),
      model_type_(std::move(model_type)),
      mode_(mode),
      moe_layers_(std::move(moe_layers)),
      n_expert_(n_expert),
      n_expert_used_(n_expert_used) {
  TANDEM_ASSERT(n_expert > 0 && n_expert_used > 0 && n_expert_used <= n_expert, "bad expert counts {} / {}",
                n_expert_used, n_expert);
  for (size_t i = 0; i < moe_layers_.size(); ++i)
    TANDEM_ASSERT(moe_layers_[i] >= 0 && (i == 0 || moe_layers_[i] > moe_layers_[i - 1]),
                  "MoE layer indices must be increasing");
}

ExpertStats ExpertStats::for_model(const ModelConfig& cfg, std::string fingerprint, ProfileMode mode) {
  return ExpertStats(std::move(fingerprint), cfg.model_type, mode, moe_layer_indices(cfg), cfg.n_expert,
                     cfg.n_expert_used);
}

int64_t ExpertStats::layer_slot(int64_t layer) const {
  auto it = std::lower_bound(moe_layers_.begin(), moe_layers_.end(), layer);
  if (it == moe_layers_.end() || *it != layer) return -1;
  return int64_t(it - moe_layers_.begin());
}

KindCounts& ExpertStats::kind_counts(std::string_view kind) {
  auto it = kinds_.find(kind);
  if (it != kinds_.end()) return it->second;
  KindCounts& c = kinds_[std::string(kind)];
  c.rows.assign(size_t(n_moe_layer() * n_expert_), 0);
  c.gate_weight.assign(size_t(n_moe_layer() * n_expert_), 0.0);
  return c;
}

void ExpertStats::record(int64_t layer, const int32_t* ids, const float* weights, int64_t n_rows, int64_t k,
                         std::string_view kind) {
  int64_t slot = layer_slot(layer);
  TANDEM_ASSERT(slot >= 0, "record: layer {} is not a MoE layer", layer);
  TANDEM_ASSERT(k == n_expert_used_, "record: k = {}, the model routes to {}", k, n_expert_used_);
  TANDEM_ASSERT(n_rows >= 0, "record: n_rows = {}", n_rows);
  KindCounts& c = kind_counts(kind);
  int64_t* rows = c.rows.data() + slot * n_expert_;
  double* gw = c.gate_weight.data() + slot * n_expert_;
  for (int64_t i = 0; i < n_rows * k; ++i) {
    int32_t e = ids[i];
    if (e < 0) continue;
    TANDEM_ASSERT(e < n_expert_, "record: expert id {} of layer {} out of range [0, {})", e, layer, n_expert_);
    rows[e] += 1;
    if (weights) gw[e] += double(weights[i]);
  }
}

void ExpertStats::add_tokens(std::string_view kind, int64_t n) {
  TANDEM_ASSERT(n >= 0, "add_tokens: n = {}", n);
  kind_counts(kind).tokens += n;
}

void ExpertStats::merge(const ExpertStats& other) {
  if (other.fingerprint_ != fingerprint_)
    fail("cannot merge stats of model {} into stats of model {}", other.fingerprint_, fingerprint_);
  if (other.moe_layers_ != moe_layers_ || other.n_expert_ != n_expert_ || other.n_expert_used_ != n_expert_used_)
    fail("cannot merge stats: MoE layers or expert counts differ");
  if (other.mode_ != mode_)
    fail("cannot merge {} stats into {} stats", profile_mode_name(other.mode_), profile_mode_name(mode_));
  for (const auto& [kind, oc] : other.kinds_) {
    KindCounts& c = kind_counts(kind);
    c.tokens += oc.tokens;
    for (size_t i = 0; i < c.rows.size(); ++i) {
      c.rows[i] += oc.rows[i];
      c.gate_weight[i] += oc.gate_weight[i];
    }
  }
}

std::vector<std::string> ExpertStats::kinds() const {
  std::vector<std::string> out;
  for (const auto& [kind, c] : kinds_) out.push_back(kind);
  return out;
}

const KindCounts* ExpertStats::counts(std::string_view kind) const {
  auto it = kinds_.find(kind);
  return it == kinds_.end() ? nullptr : &it->second;
}

int64_t ExpertStats::tokens(std::string_view kind) const {
  const KindCounts* c = counts(kind);
  return c ? c->tokens : 0;
}

int64_t ExpertStats::total_tokens() const {
  int64_t n = 0;
  for (const auto& [kind, c] : kinds_) n += c.tokens;
  return n;
}

int64_t ExpertStats::rows(int64_t slot, int64_t expert) const {
  TANDEM_ASSERT(slot >= 0 && slot < n_moe_layer() && expert >= 0 && expert < n_expert_, "rows({}, {})", slot,
                expert);
  int64_t n = 0;
  for (const auto& [kind, c] : kinds_) n += c.rows[size_t(slot * n_expert_ + expert)];
  return n;
}

double ExpertStats::gate_weight(int64_t slot, int64_t expert) const {
  TANDEM_ASSERT(slot >= 0 && slot < n_moe_layer() && expert >= 0 && expert < n_expert_, "gate_weight({}, {})", slot,
                expert);
  double w = 0;
  for (const auto& [kind, c] : kinds_) w += c.gate_weight[size_t(slot * n_expert_ + expert)];
  return w;
}

std::vector<int64_t> ExpertStats::total_rows() const {
  std::vector<int64_t> out(size_t(n_moe_layer() * n_expert_), 0);
  for (const auto& [kind, c] : kinds_)
    for (size_t i = 0; i < out.size(); ++i) out[i] += c.rows[i];
  return out;
}

std::vector<double> ExpertStats::total_gate_weight() const {
  std::vector<double> out(size_t(n_moe_layer() * n_expert_), 0.0);
  for (const auto& [kind, c] : kinds_)
    for (size_t i = 0; i < out.size(); ++i) out[i] += c.gate_weight[i];
  return out;
}

json ExpertStats::to_json() const {
  json j;
  j["schema"] = kStatsSchema;
  j["fingerprint"] = fingerprint_;
  j["model_type"] = model_type_;
  j["mode"] = profile_mode_name(mode_);
  j["n_expert"] = n_expert_;
  j["n_expert_used"] = n_expert_used_;
  j["moe_layers"] = moe_layers_;
  json tokens = json::object();
  for (const auto& [kind, c] : kinds_) tokens[kind] = c.tokens;
  j["tokens"] = tokens;
  json layers = json::array();
  for (int64_t s = 0; s < n_moe_layer(); ++s) {
    json rows = json::object(), gw = json::object();
    for (const auto& [kind, c] : kinds_) {
      auto b = size_t(s * n_expert_), e = b + size_t(n_expert_);
      rows[kind] = std::vector<int64_t>(c.rows.begin() + b, c.rows.begin() + e);
      gw[kind] = std::vector<double>(c.gate_weight.begin() + b, c.gate_weight.begin() + e);
    }
    layers.push_back({{"layer", moe_layers_[size_t(s)]}, {"rows", rows}, {"gate_weight", gw}});
  }
  j["layers"] = layers;
  j["meta"] = meta_;
  return j;
}

ExpertStats ExpertStats::from_json(const json& j, std::string_view source) {
  constexpr int64_t kMaxCount = std::numeric_limits<int64_t>::max() / 4;
  if (!j.is_object()) fail("{}: a stats file must be a JSON object", source);
  std::string schema = pj::string_field(j, "schema", source, "");
  if (schema != kStatsSchema) fail("{}: schema is \"{}\", expected \"{}\"", source, schema, kStatsSchema);
  std::string fingerprint = pj::string_field(j, "fingerprint", source, "");
  std::string model_type = pj::string_field(j, "model_type", source, "");
  std::string mode_name = pj::string_field(j, "mode", source, "");
  auto mode = profile_mode_from_name(mode_name);
  if (!mode) fail("{}: mode is \"{}\", expected \"teacher\" or \"generate\"", source, mode_name);
  int64_t n_expert = pj::int_field(j, "n_expert", 1, 1 << 20, source, "");
  int64_t k = pj::int_field(j, "n_expert_used", 1, n_expert, source, "");
  std::vector<int64_t> moe_layers;
  const json& jl = pj::array_field(j, "moe_layers", source, "");
  for (size_t i = 0; i < jl.size(); ++i) {
    int64_t l = pj::int_value(jl[i], 0, 1 << 20, source, fmt::format("moe_layers[{}]", i));
    if (!moe_layers.empty() && l <= moe_layers.back())
      fail("{}: moe_layers must be strictly increasing (layer {} after {})", source, l, moe_layers.back());
    moe_layers.push_back(l);
  }
  ExpertStats st(fingerprint, model_type, *mode, moe_layers, n_expert, k);

  const json& jt = pj::object_field(j, "tokens", source, "");
  const json& layers = pj::array_field(j, "layers", source, "");
  if (layers.size() != moe_layers.size())
    fail("{}: layers has {} entries, moe_layers lists {}", source, layers.size(), moe_layers.size());
  // Shapes first, so the counters allocated below are bounded by what the document really holds.
  for (size_t s = 0; s < layers.size(); ++s) {
    std::string where = fmt::format("layers[{}]", s);
    int64_t layer = pj::int_field(layers[s], "layer", 0, 1 << 20, source, where);
    if (layer != moe_layers[s])
      fail("{}: {}.layer is {}, moe_layers[{}] is {}", source, where, layer, s, moe_layers[s]);
    for (const char* part : {"rows", "gate_weight"}) {
      const json& jp = pj::object_field(layers[s], part, source, where);
      for (const auto& [kind, v] : jp.items())
        if (!jt.contains(kind)) fail("{}: {} has kind \"{}\" that tokens does not list", source, where, kind);
      for (const auto& [kind, v] : jt.items()) {
        const json& a = pj::array_field(jp, kind, source, fmt::format("{}.{}", where, part));
        if (int64_t(a.size()) != n_expert)
          fail("{}: {}.{}.{} has {} entries, n_expert is {}", source, where, part, kind, a.size(), n_expert);
      }
    }
  }
  for (const auto& [kind, v] : jt.items()) {
    if (kind.empty()) fail("{}: tokens has an empty kind name", source);
    st.kind_counts(kind).tokens = pj::int_value(v, 0, kMaxCount, source, fmt::format("tokens.{}", kind));
  }
  for (size_t s = 0; s < layers.size(); ++s) {
    for (auto& [kind, c] : st.kinds_) {
      const json& rows = layers[s]["rows"][kind];
      const json& gw = layers[s]["gate_weight"][kind];
      auto what = [&](const char* part, int64_t e) { return fmt::format("layers[{}].{}.{}[{}]", s, part, kind, e); };
      int64_t sum = 0;
      for (int64_t e = 0; e < n_expert; ++e) {
        const json& r = rows[size_t(e)];
        const json& g = gw[size_t(e)];
        // Fast path for well-formed values; the checked readers produce the error message.
        int64_t n = r.is_number_unsigned() && r.get<uint64_t>() <= uint64_t(kMaxCount)
                        ? int64_t(r.get<uint64_t>())
                        : pj::int_value(r, 0, kMaxCount, source, what("rows", e));
        double w = g.is_number_float() && g.get<double>() >= 0 && std::isfinite(g.get<double>())
                       ? g.get<double>()
                       : pj::nonneg_number(g, source, what("gate_weight", e));
        c.rows[size_t(int64_t(s) * n_expert + e)] = n;
        c.gate_weight[size_t(int64_t(s) * n_expert + e)] = w;
        sum += n;
        if (sum > kMaxCount) fail("{}: layers[{}].rows.{} sums past the counter range", source, s, kind);
      }
      if (c.tokens > kMaxCount / k || sum > c.tokens * k)
        fail("{}: layers[{}].rows.{} sums to {} rows, more than tokens.{} ({}) × n_expert_used ({})", source, s,
             kind, sum, kind, c.tokens, k);
    }
  }
  if (j.contains("meta")) {
    const json& jm = j["meta"];
    if (!jm.is_object()) fail("{}: meta must be an object of strings", source);
    for (const auto& [key, v] : jm.items()) {
      if (!v.is_string()) fail("{}: meta.{} must be a string", source, key);
      st.meta_[key] = v.get<std::string>();
    }
  }
  return st;
}

ExpertStats ExpertStats::load(const std::string& path) { return from_json(pj::parse_file(path), path); }

void ExpertStats::save(const std::string& path) const { pj::write_file(path, to_json()); }

void validate_stats(const ExpertStats& stats, const ModelConfig& cfg, std::string_view model_fingerprint,
                    std::string_view source) {
  if (stats.fingerprint() != model_fingerprint)
    fail("{}: stats were made for model {}, this model is {}", source, stats.fingerprint(), model_fingerprint);
  if (stats.moe_layers() != moe_layer_indices(cfg))
    fail("{}: stats cover MoE layers {}, the model has {}", source, fmt::join(stats.moe_layers(), ","),
         fmt::join(moe_layer_indices(cfg), ","));
  if (stats.n_expert() != cfg.n_expert || stats.n_expert_used() != cfg.n_expert_used)
    fail("{}: stats count {} experts (top-{}), the model has {} (top-{})", source, stats.n_expert(),
         stats.n_expert_used(), cfg.n_expert, cfg.n_expert_used);
}

}  // namespace tandem
