// Batched generation (see generate.h). Sequences are released on every exit path.
#include "engine/generate.h"

#include <algorithm>
#include <chrono>

namespace tandem {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct SeqGuard {
  Engine& engine;
  std::vector<int> seqs;
  ~SeqGuard() {
    for (int s : seqs) engine.remove_sequence(s);
  }
};
}  // namespace

std::vector<GenerateResult> generate(Engine& engine, std::span<const GenerateRequest> requests,
                                     const GenerateOptions& options, GenerateStats* stats) {
  const int64_t vocab = engine.vocab_size();
  std::vector<GenerateResult> results(requests.size());
  std::vector<Sampler> samplers;
  const int64_t ctx = engine.max_ctx();
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    if (r.prompt.empty()) fail("a prompt must hold at least one token");
    if (r.max_tokens < 0) fail("max tokens must be >= 0");
    const int64_t need = int64_t(r.prompt.size()) + (r.max_tokens > 0 ? 1 : 0);
    if (need > ctx)
      fail("prompt {} has {} tokens{}, more than the context limit of {} (--ctx)", i, r.prompt.size(),
           r.max_tokens > 0 ? " and asks for at least one more" : "", ctx);
    samplers.emplace_back(r.sampling);
  }
  SeqGuard guard{engine, {}};
  for (size_t i = 0; i < requests.size(); ++i) guard.seqs.push_back(engine.add_sequence());
  GenerateStats st;
  std::vector<int32_t> next(requests.size(), -1);
  std::vector<bool> live(requests.size(), false);

  auto take = [&](size_t i, const float* logits) {
    int32_t tok = samplers[i].sample(logits, vocab);
    auto& res = results[i];
    res.tokens.push_back(tok);
    if (options.keep_logits) res.logits.insert(res.logits.end(), logits, logits + vocab);
    ++st.generated_tokens;
    if (options.on_token) options.on_token(i, tok);
    const auto& stop = requests[i].stop_ids;
    if (std::find(stop.begin(), stop.end(), tok) != stop.end()) {
      res.finish_reason = "stop";
      live[i] = false;
    } else if (int64_t(res.tokens.size()) >= requests[i].max_tokens ||
               int64_t(requests[i].prompt.size() + res.tokens.size()) >= ctx) {
      res.finish_reason = "length";  // the budget, or the context is full: what was generated is kept
      live[i] = false;
    } else {
      next[i] = tok;
      live[i] = true;
    }
  };

  // Prefill in chunks of rows; the last chunk of each prompt yields its first token.
  double t0 = now();
  {
    std::vector<size_t> offset(requests.size(), 0);
    for (;;) {
      std::vector<Engine::Item> items;
      std::vector<size_t> owners;
      int64_t budget = std::max<int64_t>(1, options.prefill_chunk);
      for (size_t i = 0; i < requests.size() && budget > 0; ++i) {
        const auto& p = requests[i].prompt;
        if (offset[i] == p.size()) continue;
        size_t count = std::min<size_t>(size_t(budget), p.size() - offset[i]);
        items.push_back({guard.seqs[i], std::span<const int32_t>(p.data() + offset[i], count)});
        owners.push_back(i);
        offset[i] += count;
        budget -= int64_t(count);
      }
      if (items.empty()) break;
      const auto& logits = engine.forward(items);
      for (size_t j = 0; j < owners.size(); ++j) {
        size_t i = owners[j];
        st.prompt_tokens += int64_t(items[j].tokens.size());
        if (offset[i] == requests[i].prompt.size()) {
          if (requests[i].max_tokens == 0) {
            results[i].finish_reason = "length";
          } else {
            take(i, logits.data() + int64_t(j) * vocab);
          }
        }
      }
    }
  }
  double t1 = now();
  st.prefill_seconds = t1 - t0;

  for (;;) {
    std::vector<Engine::Item> items;
    std::vector<size_t> owners;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!live[i]) continue;
      items.push_back({guard.seqs[i], std::span<const int32_t>(&next[i], 1)});
      owners.push_back(i);
    }
    if (items.empty()) break;
    const auto& logits = engine.forward(items);
    ++st.decode_steps;
    for (size_t j = 0; j < owners.size(); ++j) take(owners[j], logits.data() + int64_t(j) * vocab);
  }
  st.decode_seconds = now() - t1;
  if (stats) *stats = st;
  return results;
}

}  // namespace tandem
