// Fixture comparison (see verify.h).
#include "engine/verify.h"

#include <cmath>
#include <map>

#include "engine/generate.h"

namespace tandem {

double max_rel_err(const float* a, const float* b, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::fabs(double(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

namespace {

TensorView need(const TensorStore& st, const std::string& path, const std::string& name, DType dtype, int ndim) {
  const TensorView* v = st.find(name);
  if (!v) fail("{}: reference tensor '{}' is missing", path, name);
  if (v->dtype != dtype || v->shape.ndim != ndim)
    fail("{}: reference tensor '{}' must be {} with {} dims, found {} {}", path, name, dtype_name(dtype), ndim,
         dtype_name(v->dtype), v->shape.str());
  return *v;
}

}  // namespace

std::vector<VerifyCheck> verify_against(Engine& engine, const std::string& expected_path,
                                        const VerifyOptions& options) {
  const auto& c = engine.model().cfg;
  TensorStore ref = TensorStore::open_file(expected_path);
  TensorView ids = need(ref, expected_path, "input_ids", DType::kI32, 2);
  const int64_t B = ids.shape[0], T = ids.shape[1], V = c.vocab_size, H = c.hidden_size;
  for (int64_t i = 0; i < B * T; ++i)
    if (ids.as<int32_t>()[i] < 0 || ids.as<int32_t>()[i] >= V)
      fail("{}: input_ids holds {} outside the vocabulary", expected_path, ids.as<int32_t>()[i]);
  TensorView logits_ref = need(ref, expected_path, "logits", DType::kF32, 3);
  if (!(logits_ref.shape == Shape{B, T, V}))
    fail("{}: logits has shape {}, expected {}", expected_path, logits_ref.shape.str(), Shape{B, T, V}.str());

  std::vector<VerifyCheck> checks;
  auto add = [&](std::string name, double err) {
    checks.push_back({std::move(name), err, options.tolerance, err <= options.tolerance});
  };

  // 1. Full forward over every prompt in one batch; capture each MoE block's output.
  std::map<int64_t, std::vector<float>> moe_out;
  auto saved = engine.hooks;
  engine.hooks.on_moe = [&](int64_t layer, const float*, const float* out, int64_t n) {
    moe_out[layer].assign(out, out + n * H);
  };
  std::vector<int> seqs;
  std::vector<Engine::Item> items;
  for (int64_t b = 0; b < B; ++b) {
    seqs.push_back(engine.add_sequence());
    items.push_back({seqs.back(), std::span<const int32_t>(ids.as<int32_t>() + b * T, size_t(T))});
  }
  std::vector<float> logits;
  try {
    logits = engine.forward(items, /*all_logits=*/true);
  } catch (...) {
    engine.hooks = saved;
    for (int s : seqs) engine.remove_sequence(s);
    throw;
  }
  engine.hooks = saved;
  for (int s : seqs) engine.remove_sequence(s);
  add("logits", max_rel_err(logits.data(), logits_ref.as<float>(), B * T * V));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::string name = "moe_out." + std::to_string(l);
    const TensorView* r = ref.find(name);
    if (!c.layer_is_moe[size_t(l)]) {
      if (r) fail("{}: has '{}' but layer {} of the model is dense", expected_path, name, l);
      continue;
    }
    if (!r) fail("{}: reference tensor '{}' is missing", expected_path, name);
    if (r->dtype != DType::kF32 || !(r->shape == Shape{B * T, H}))
      fail("{}: '{}' must be F32 {}, found {} {}", expected_path, name, Shape{B * T, H}.str(), dtype_name(r->dtype),
           r->shape.str());
    add(name, max_rel_err(moe_out[l].data(), r->as<float>(), B * T * H));
  }

  // 2. Greedy continuation with the KV cache, one token per step.
  TensorView gen_tokens = need(ref, expected_path, "gen_tokens", DType::kI32, 2);
  TensorView gen_logits = need(ref, expected_path, "gen_logits", DType::kF32, 3);
  const int64_t G = gen_tokens.shape[1];
  if (gen_tokens.shape[0] != B || !(gen_logits.shape == Shape{B, G, V}))
    fail("{}: gen_tokens {} / gen_logits {} do not match {} prompts", expected_path, gen_tokens.shape.str(),
         gen_logits.shape.str(), B);
  std::vector<GenerateRequest> reqs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    reqs[size_t(b)].prompt.assign(ids.as<int32_t>() + b * T, ids.as<int32_t>() + (b + 1) * T);
    reqs[size_t(b)].max_tokens = G;
  }
  GenerateOptions gopt;
  gopt.keep_logits = true;
  auto results = generate(engine, reqs, gopt);
  double tok_mismatch = 0, gen_err = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto& res = results[size_t(b)];
    for (int64_t g = 0; g < G; ++g)
      tok_mismatch += (g >= int64_t(res.tokens.size()) || res.tokens[size_t(g)] != gen_tokens.as<int32_t>()[b * G + g]);
    if (int64_t(res.tokens.size()) == G)
      gen_err = std::max(gen_err, max_rel_err(res.logits.data(), gen_logits.as<float>() + b * G * V, G * V));
    else
      gen_err = INFINITY;
  }
  add("gen_logits", gen_err);
  checks.push_back({"gen_tokens", tok_mismatch, 0, tok_mismatch == 0});
  return checks;
}

}  // namespace tandem
