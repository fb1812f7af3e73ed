// `tandem info`: what a checkpoint is (with its model fingerprint), where its bytes are, what the
// placement planner counts as fixed on the primary, and what a token of KV cache costs.
#include <fmt/format.h>

#include <map>
#include <string>

#include "cli/command.h"
#include "io/fp8_weights.h"
#include "models/model.h"
#include "placement/fingerprint.h"
#include "placement/memory_model.h"

namespace tandem::cli {
namespace {

size_t bytes_of(std::initializer_list<TensorView> views) {
  size_t n = 0;
  for (const auto& v : views) n += v.empty() ? 0 : v.nbytes() + v.scale_nbytes();
  return n;
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

RunFn setup(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  app.add_option("--model", *dir, "Model folder")->required();
  return [dir] {
    auto m = Model::load(*dir);
    const auto& c = m->cfg;
    size_t attn = 0, dense = 0, shared = 0, routed = 0, norms = 0, params = 0;
    std::vector<size_t> routed_per_layer;
    for (const auto& L : m->layers) {
      const auto& a = L.attn;
      attn += bytes_of({a.q, a.k, a.v, a.q_norm, a.k_norm, a.q_a, a.q_a_norm, a.q_b, a.kv_a, a.kv_a_norm, a.kv_b, a.o});
      norms += bytes_of({L.attn_norm, L.ffn_norm});
      dense += L.dense.present() ? L.dense.nbytes() : 0;
      shared += L.shared.present() ? L.shared.nbytes() : 0;
      attn += bytes_of({L.router, L.router_bias});  // routers sit with the primary's non-expert weights
      size_t r = 0;
      for (const auto& e : L.experts) r += e.present() ? e.nbytes() : 0;
      routed_per_layer.push_back(r);
      routed += r;
    }
    const size_t embed = m->embed.nbytes();
    const size_t head = c.tie_word_embeddings && m->lm_head.data == m->embed.data ? 0 : m->lm_head.nbytes();
    norms += m->final_norm.nbytes();
    const size_t total = m->store.total_bytes();
    for (const auto& name : m->store.names())  // FP8 block scales are not parameters
      if (!(c.quant.fp8 && name.ends_with(kFp8ScaleSuffix))) params += size_t(m->store.find(name)->numel());
    fmt::print("model            {}\n", *dir);
    fmt::print("model fingerprint {} (config + tensor names, dtypes and shapes; stats files and rowmaps carry it)\n",
               model_fingerprint(c, m->store));
    fmt::print("architecture     {} ({} layers, {} MoE; hidden {}, vocab {})\n", c.model_type, c.n_layer,
               c.n_moe_layers(), c.hidden_size, c.vocab_size);
    if (c.mla)
      fmt::print("attention        MLA: {} heads, q_lora {}, kv_lora {}, qk nope {} + rope {}, v {}\n", c.n_head,
                 c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
    else
      fmt::print("attention        GQA: {} q heads, {} kv heads, head_dim {}\n", c.n_head, c.n_head_kv, c.head_dim);
    fmt::print("experts          {} routed per MoE layer, top-{}, intermediate {}{}\n", c.n_expert, c.n_expert_used,
               c.moe_intermediate_size,
               c.n_shared_expert ? fmt::format(", {} shared (intermediate {})", c.n_shared_expert,
                                               c.shared_intermediate_size())
                                 : std::string());
    fmt::print("parameters       {:.3f} B ({} on disk)\n", double(params) / 1e9, human(double(total)));
    std::map<std::string, size_t> by_dtype;  // every tensor of the files, FP8 scale grids under F32
    for (const auto& name : m->store.names()) {
      const TensorView* v = m->store.find(name);
      by_dtype[std::string(dtype_name(v->dtype))] += v->nbytes();
    }
    std::string dtypes;
    for (const auto& [name, bytes] : by_dtype)
      dtypes += fmt::format("{}{} {}", dtypes.empty() ? "" : ", ", name, human(double(bytes)));
    fmt::print("bytes by dtype   {}\n", dtypes);
    if (c.quant.fp8)
      fmt::print("quantization     FP8 e4m3 weights with {}x{} block scales (F32 *_scale_inv; counted with their "
                 "weights below)\n",
                 c.quant.block_rows, c.quant.block_cols);
    fmt::print("bytes            embeddings {}, output head {}, attention+routers {}, norms {}\n", human(double(embed)),
               human(double(head)), human(double(attn)), human(double(norms)));
    fmt::print("                 dense MLPs {}, shared experts {}, routed experts {}\n", human(double(dense)),
               human(double(shared)), human(double(routed)));
    std::string per_layer;
    for (size_t l = 0; l < routed_per_layer.size(); ++l)
      if (c.layer_is_moe[l]) per_layer += fmt::format("{}{}: {}", per_layer.empty() ? "" : ", ", l, human(double(routed_per_layer[l])));
    fmt::print("routed per layer {}\n", per_layer);
    if (c.n_moe_layers() > 0) {
      const auto& L = m->layers[size_t(std::find(c.layer_is_moe.begin(), c.layer_is_moe.end(), true) - c.layer_is_moe.begin())];
      fmt::print("one expert       {}\n", human(double(L.experts[0].nbytes())));
    }
    const ModelBytes mb = model_bytes(c, m->store);
    fmt::print("planner          fixed on the primary {} (all but routed experts), one routed expert {}, "
               "all routed {}{}{}\n",
               format_bytes(mb.primary_fixed()), format_bytes(mb.expert_bytes), format_bytes(mb.routed_experts),
               mb.other ? fmt::format(", unclassified {} (counted as fixed)", format_bytes(mb.other)) : std::string(),
               mb.unused ? fmt::format(", unused layers {} (not loaded)", format_bytes(mb.unused)) : std::string());
    const int64_t kv = c.kv_floats_per_token_layer() * c.n_layer;
    fmt::print("KV cache / token {} values: {} at bf16, {} at f32 ({})\n", kv, human(double(kv * 2)),
               human(double(kv * 4)), c.mla ? "MLA: kv_lora + rope per layer" : "GQA: 2 x kv heads x head_dim per layer");
    return 0;
  };
}

}  // namespace
TANDEM_COMMAND(info, "info", "Architecture, parameters, bytes by component, KV-cache bytes per token", setup);
}  // namespace tandem::cli
