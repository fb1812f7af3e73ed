// `tandem check`: the bring-up gate. Runs real text through the peer lane with the check gate on every
// handoff and prints, per MoE layer, the number of rows checked and the minimum and mean cosine between
// the peer's rows and a reference computation on the primary, then a verdict (exit 1 when it fails).
// The reference is the primary's own experts (--reference lane), or, to measure what --weights fp8
// changes, the checkpoint's experts as stored (--reference checkpoint).
#include <fmt/format.h>

#include "cli/command.h"
#include "cli/common.h"
#include "io/corpus.h"
#include "io/tokenizer.h"
#include "models/model.h"

namespace tandem::cli {
namespace {

RunFn setup(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    std::string corpus;
    std::vector<std::string> kinds;
    double min_cosine = 0.999;
    int64_t max_tokens = 4096;
    int64_t window = 256;
    std::string reference = "lane";
  };
  auto o = std::make_shared<Opts>();
  o->model.lane = "peer";
  o->model.peer_check = 1;
  o->model.check_min = -2;  // record every row: the verdict below is check's own (--min-cosine)
  add_model_options(app, o->model);
  app.add_option("--corpus", o->corpus, "JSON-lines corpus of real text")->required();
  app.add_option("--kinds", o->kinds, "Corpus kinds to use (default: all)")->delimiter(',');
  app.add_option("--min-cosine", o->min_cosine, "Gate: minimum per-layer cosine (default 0.999)");
  app.add_option("--max-tokens", o->max_tokens, "Tokens of text to run (default 4096)");
  app.add_option("--window", o->window, "Tokens per document window (default 256)");
  app.add_option("--reference", o->reference,
                 "What the peer's rows are compared with: lane (default: the primary's own experts, the same "
                 "weights as the peer's: tests the peer) or checkpoint (the experts as stored in the checkpoint: "
                 "with --weights fp8, measures what quantizing at load changes; CPU primary)")
      ->check(CLI::IsMember({"lane", "checkpoint"}));
  return [o] {
    const RuntimeOptions ro = runtime_options(o->model, 8);
    if (!lane_has_peer(ro.lane)) fail("check runs a lane with a peer (--lane peer, or split on cuda)");
    if (ro.peer_check <= 0) fail("--peer-check must be >= 1 for the gate");
    if (o->reference == "checkpoint" && ro.weights != "fp8")
      fail("--reference checkpoint compares with the weights as stored, which the lane already runs: it needs "
           "--weights fp8 (for the peer too)");
    if (o->reference == "checkpoint" && ro.device.cuda)
      fail("--reference checkpoint runs on the CPU primary (--device cpu): FP8 weights are not on the GPU yet");
    Runtime rt = Runtime::open(ro);
    std::unique_ptr<Model> stored;
    if (o->reference == "checkpoint") {
      if (!rt.peer) fail("--reference checkpoint needs the peer lane on the CPU primary");
      stored = Model::load(o->model.model_dir);
      rt.peer->set_check_reference(*stored);
    }
    Tokenizer tok = Tokenizer::load(o->model.model_dir + "/tokenizer.json");
    auto docs = load_corpus(o->corpus, o->kinds);
    // Round-robin over kinds so every kind is represented within the budget.
    int64_t used = 0;
    size_t next = 0;
    while (used < o->max_tokens && next < docs.size()) {
      auto ids = tok.encode(docs[next++].text);
      if (ids.empty()) continue;
      int64_t n = std::min<int64_t>({int64_t(ids.size()), o->window, o->max_tokens - used});
      int seq = rt.engine->add_sequence();
      Engine::Item item{seq, std::span<const int32_t>(ids.data(), size_t(n))};
      try {
        rt.engine->forward(std::span<const Engine::Item>(&item, 1));
      } catch (...) {
        rt.engine->remove_sequence(seq);
        throw;
      }
      rt.engine->remove_sequence(seq);
      used += n;
    }
    const auto* lane_checks = rt.lane_checks();
    if (!lane_checks) fail("check needs a peer lane");
    const auto& checks = *lane_checks;
    bool pass = true;
    int64_t total = 0;
    double worst = 1.0;
    if (stored) fmt::print("reference: the checkpoint's experts as stored (what --weights fp8 changes)\n");
    fmt::print("{:>6} {:>10} {:>12} {:>12}\n", "layer", "checks", "min cosine", "mean cosine");
    for (size_t l = 0; l < checks.size(); ++l) {
      if (!rt.model->cfg.layer_is_moe[l]) continue;
      const auto& c = checks[l];
      bool ok = c.checks > 0 && c.min_cosine >= o->min_cosine;
      pass = pass && ok;
      total += c.checks;
      worst = std::min(worst, c.min_cosine);
      fmt::print("{:>6} {:>10} {:>12.6f} {:>12.6f}{}\n", l, c.checks, c.min_cosine,
                 c.checks ? c.sum_cosine / double(c.checks) : 1.0,
                 c.checks == 0 ? "  (no rows reached the peer)" : ok ? "" : "  FAIL");
    }
    fmt::print("{}\n", rt.lane_summary());
    fmt::print("check: {} tokens, {} row checks, minimum cosine {:.6f}, bar {} -> {}\n", used, total, worst,
               o->min_cosine, pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
  };
}

}  // namespace
TANDEM_COMMAND(check, "check", "Bring-up gate: compare the peer's rows with a reference computation, per layer", setup);
}  // namespace tandem::cli
