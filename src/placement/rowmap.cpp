// Rowmap: JSON form, fingerprint and the validation every consumer runs (see rowmap.h).
#include "placement/rowmap.h"

#include <algorithm>
#include <limits>

#include <fmt/ranges.h>

#include "core/error.h"
#include "placement/fingerprint.h"
#include "placement/json_fields.h"
#include "placement/stats.h"

namespace tandem {

using nlohmann::json;
namespace pj = placement_json;

const RowmapLayer* Rowmap::find_layer(int64_t layer) const {
  for (const RowmapLayer& l : layers)
    if (l.layer == layer) return &l;
  return nullptr;
}

bool Rowmap::is_cold(int64_t layer, int32_t expert) const {
  const RowmapLayer* l = find_layer(layer);
  TANDEM_ASSERT(l != nullptr, "is_cold: layer {} is not in the rowmap", layer);
  return std::binary_search(l->cold.begin(), l->cold.end(), expert);
}

int64_t Rowmap::n_hot() const {
  int64_t n = 0;
  for (const RowmapLayer& l : layers) n += int64_t(l.hot.size());
  return n;
}

int64_t Rowmap::n_cold() const {
  int64_t n = 0;
  for (const RowmapLayer& l : layers) n += int64_t(l.cold.size());
  return n;
}

void Rowmap::finalize() {
  for (RowmapLayer& l : layers) {
    std::sort(l.hot.begin(), l.hot.end());
    std::sort(l.cold.begin(), l.cold.end());
  }
  rowmap_fingerprint = compute_rowmap_fingerprint(*this);
}

std::string compute_rowmap_fingerprint(const Rowmap& rm) {
  Fnv1a64 h;
  h.add("rowmap\nmodel=");
  h.add(rm.fingerprint);
  h.add("\n");
  auto list = [&](std::string_view name, std::vector<int32_t> ids) {
    std::sort(ids.begin(), ids.end());
    h.add(fmt::format("{}={}\n", name, fmt::join(ids, ",")));
  };
  for (const RowmapLayer& l : rm.layers) {
    h.add(fmt::format("layer={}\n", l.layer));
    list("hot", l.hot);
    list("cold", l.cold);
  }
  return h.fingerprint();
}

json Rowmap::to_json() const {
  json src{{"mode", source.mode},
           {"tokens", source.tokens},
           {"policy", source.policy},
           {"budget", source.budget},
           {"kv_tokens", source.kv_tokens},
           {"expected_cold_share", source.expected_cold_share},
           {"expected_cold_share_by_kind", source.expected_cold_share_by_kind}};
  json jl = json::array();
  for (const RowmapLayer& l : layers) jl.push_back({{"layer", l.layer}, {"hot", l.hot}, {"cold", l.cold}});
  return {{"schema", kRowmapSchema},
          {"fingerprint", fingerprint},
          {"rowmap_fingerprint", compute_rowmap_fingerprint(*this)},
          {"source", src},
          {"layers", jl}};
}

static std::vector<int32_t> id_list(const json& j, std::string_view key, std::string_view source,
                                    const std::string& where) {
  const json& a = pj::array_field(j, key, source, where);
  std::vector<int32_t> ids;
  ids.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    ids.push_back(int32_t(pj::int_value(a[i], std::numeric_limits<int32_t>::min(),
                                        std::numeric_limits<int32_t>::max(), source,
                                        fmt::format("{}.{}[{}]", where, key, i))));
  std::sort(ids.begin(), ids.end());
  return ids;
}

Rowmap Rowmap::from_json(const json& j, std::string_view source) {
  if (!j.is_object()) fail("{}: a rowmap must be a JSON object", source);
  std::string schema = pj::string_field(j, "schema", source, "");
  if (schema != kRowmapSchema) fail("{}: schema is \"{}\", expected \"{}\"", source, schema, kRowmapSchema);
  Rowmap rm;
  rm.fingerprint = pj::string_field(j, "fingerprint", source, "");

  const json& src = pj::object_field(j, "source", source, "");
  rm.source.mode = pj::string_field(src, "mode", source, "source");
  rm.source.policy = pj::string_field(src, "policy", source, "source");
  if (src.contains("budget")) rm.source.budget = pj::string_field(src, "budget", source, "source");
  if (src.contains("kv_tokens"))
    rm.source.kv_tokens = pj::int_field(src, "kv_tokens", -1, std::numeric_limits<int64_t>::max(), source, "source");
  for (const auto& [kind, v] : pj::object_field(src, "tokens", source, "source").items())
    rm.source.tokens[kind] = pj::int_value(v, 0, std::numeric_limits<int64_t>::max(), source, "source.tokens." + kind);
  auto share = [&](const json& v, const std::string& what) {
    double d = pj::nonneg_number(v, source, what);
    if (d > 1.0) fail("{}: {} = {} is a share and must be <= 1", source, what, d);
    return d;
  };
  rm.source.expected_cold_share =
      share(pj::field(src, "expected_cold_share", source, "source"), "source.expected_cold_share");
  if (src.contains("expected_cold_share_by_kind"))
    for (const auto& [kind, v] : pj::object_field(src, "expected_cold_share_by_kind", source, "source").items())
      rm.source.expected_cold_share_by_kind[kind] = share(v, "source.expected_cold_share_by_kind." + kind);

  const json& jl = pj::array_field(j, "layers", source, "");
  for (size_t i = 0; i < jl.size(); ++i) {
    std::string where = fmt::format("layers[{}]", i);
    RowmapLayer l;
    l.layer = pj::int_field(jl[i], "layer", 0, std::numeric_limits<int32_t>::max(), source, where);
    l.hot = id_list(jl[i], "hot", source, where);
    l.cold = id_list(jl[i], "cold", source, where);
    rm.layers.push_back(std::move(l));
  }
  std::sort(rm.layers.begin(), rm.layers.end(),
            [](const RowmapLayer& a, const RowmapLayer& b) { return a.layer < b.layer; });
  rm.rowmap_fingerprint = compute_rowmap_fingerprint(rm);
  if (j.contains("rowmap_fingerprint")) {
    std::string stored = pj::string_field(j, "rowmap_fingerprint", source, "");
    if (stored != rm.rowmap_fingerprint)
      fail("{}: rowmap_fingerprint {} does not match the contents ({}); the lists were edited — delete the "
           "field to accept the edit",
           source, stored, rm.rowmap_fingerprint);
  }
  return rm;
}

Rowmap Rowmap::load(const std::string& path) { return from_json(pj::parse_file(path), path); }

void Rowmap::save(const std::string& path) const { pj::write_file(path, to_json()); }

void validate(const Rowmap& rm, const ModelConfig& cfg, std::string_view model_fingerprint, std::string_view source) {
  if (rm.fingerprint != model_fingerprint)
    fail("{}: rowmap was planned for model {}, this model is {}", source, rm.fingerprint, model_fingerprint);
  validate_lists(rm, moe_layer_indices(cfg), cfg.n_expert, source);
}

void validate_lists(const Rowmap& rm, const std::vector<int64_t>& moe, int64_t n_expert, std::string_view source) {
  for (const RowmapLayer& l : rm.layers)
    if (!std::binary_search(moe.begin(), moe.end(), l.layer))
      fail("{}: layer {} is not a MoE layer of this model (MoE layers: {})", source, l.layer, fmt::join(moe, ","));
  for (int64_t layer : moe) {
    int64_t found = std::count_if(rm.layers.begin(), rm.layers.end(),
                                  [&](const RowmapLayer& l) { return l.layer == layer; });
    if (found == 0) fail("{}: MoE layer {} is missing", source, layer);
    if (found > 1) fail("{}: MoE layer {} appears {} times", source, layer, found);
  }
  for (const RowmapLayer& l : rm.layers) {
    std::vector<int8_t> seen(size_t(n_expert), 0);  // 1 hot, 2 cold
    for (int part = 0; part < 2; ++part) {
      const std::vector<int32_t>& ids = part == 0 ? l.hot : l.cold;
      for (int32_t e : ids) {
        if (e < 0 || e >= n_expert)
          fail("{}: layer {}: expert id {} is out of range [0, {})", source, l.layer, e, n_expert);
        int8_t& s = seen[size_t(e)];
        if (s != 0)
          fail("{}: layer {}: expert {} appears twice ({} and {})", source, l.layer, e, s == 1 ? "hot" : "cold",
               part == 0 ? "hot" : "cold");
        s = int8_t(part + 1);
      }
    }
    for (int64_t e = 0; e < n_expert; ++e)
      if (seen[size_t(e)] == 0) fail("{}: layer {}: expert {} is neither hot nor cold", source, l.layer, e);
  }
}

std::vector<int32_t> expert_slot_table(const RowmapLayer& layer, int64_t n_expert) {
  std::vector<int32_t> table(size_t(n_expert), std::numeric_limits<int32_t>::min());
  auto place = [&](int32_t e, int32_t value) {
    TANDEM_ASSERT(e >= 0 && e < n_expert, "expert id {} of layer {} out of range", e, layer.layer);
    table[size_t(e)] = value;
  };
  for (size_t i = 0; i < layer.hot.size(); ++i) place(layer.hot[i], int32_t(i));
  for (size_t i = 0; i < layer.cold.size(); ++i) place(layer.cold[i], -1 - int32_t(i));
  for (int64_t e = 0; e < n_expert; ++e)
    TANDEM_ASSERT(table[size_t(e)] != std::numeric_limits<int32_t>::min(), "expert {} of layer {} unplaced", e,
                  layer.layer);
  return table;
}

}  // namespace tandem
