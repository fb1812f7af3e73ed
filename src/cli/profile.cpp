// `tandem profile`: runs corpus text through the model and counts, per MoE layer and routed expert,
// the token rows routed to it and their gate-weight sum, split by corpus kind (`tandem.stats/1`).
// teacher: every position of the text is one decode step; generate: corpus excerpts are prompts and
// only the generated steps count. Corpus format, options and the even/odd split: docs/placement.md.
#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "io/corpus.h"
#include "io/tokenizer.h"
#include "placement/fingerprint.h"
#include "placement/stats.h"

namespace tandem::cli {
namespace {

enum class Split { kAll, kEven, kOdd };

struct Opts {
  ModelOptions model;
  std::string corpus, out, mode = "teacher", split = "all";
  std::vector<std::string> kinds;
  int64_t max_tokens = 0, max_tokens_per_kind = 0;
  int64_t window = 512, batch = 8;
  int64_t prompt_tokens = 64, gen_tokens = 32;
  float temperature = 0;
  uint64_t seed = 0;
};

// A run of tokens to feed as one sequence: a teacher window (all of it counts) or a generate prompt
// (only the `count` generated steps count).
struct Unit {
  size_t kind = 0;  // index into the selected kinds
  std::vector<int32_t> tokens;
  int64_t count = 0;  // tokens this unit adds to the stats (generate: at most this many steps)
};

struct Selection {
  std::vector<std::string> kinds;   // selected kinds, sorted
  std::vector<int64_t> docs;        // documents used per kind
  std::vector<int64_t> planned;     // tokens planned per kind
  std::vector<Unit> units;          // in corpus order
  int64_t total = 0;
};

// Progress on stderr: a bar with tokens/s on a terminal, a plain line every few seconds otherwise.
class Progress {
 public:
  Progress(int64_t total, bool tty) : total_(std::max<int64_t>(total, 1)), tty_(tty) {}
  void add(int64_t n) {
    done_ += n;
    auto now = Clock::now();
    double since = std::chrono::duration<double>(now - last_).count();
    if (since < (tty_ ? 0.1 : kLogSeconds)) return;
    last_ = now;
    print(false);
  }
  void finish() {
    if (tty_) print(true);
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double rate() const { return seconds() > 0 ? double(done_) / seconds() : 0; }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr double kLogSeconds = 5.0;
  void print(bool last) const {
    double frac = std::min(1.0, double(done_) / double(total_));
    if (tty_) {
      constexpr int kWidth = 30;
      int fill = int(frac * kWidth);
      fmt::print(stderr, "\rprofile [{}{}] {:5.1f}% {}/{} tokens {:.0f} tok/s{}", std::string(size_t(fill), '#'),
                 std::string(size_t(kWidth - fill), '.'), 100 * frac, done_, total_, rate(), last ? "\n" : "");
    } else {
      fmt::print(stderr, "profile: {}/{} tokens ({:.1f}%), {:.0f} tokens/s\n", done_, total_, 100 * frac, rate());
    }
    std::fflush(stderr);
  }
  int64_t total_;
  bool tty_;
  int64_t done_ = 0;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = Clock::now();
};

Split parse_split(const std::string& s) {
  if (s == "all") return Split::kAll;
  if (s == "even") return Split::kEven;
  if (s == "odd") return Split::kOdd;
  fail("--split must be all, even or odd, got \"{}\"", s);
}

bool keep_doc(Split split, int64_t index_in_kind) {
  switch (split) {
    case Split::kAll: return true;
    case Split::kEven: return index_in_kind % 2 == 0;
    case Split::kOdd: return index_in_kind % 2 == 1;
  }
  return true;
}

// Chooses documents (kind filter, split), tokenizes them lazily until the budgets are spent and cuts
// them into units: teacher windows of <= window tokens, or generate prompts of prompt_tokens tokens
// (a shorter tail of >= 1 token is a prompt too) each asking for gen_tokens steps.
Selection select_units(const Opts& o, ProfileMode mode, const std::vector<CorpusDoc>& docs, const Tokenizer& tok,
                       int64_t vocab) {
  // The documents are those of the selected kinds (load_corpus checked that each is there).
  std::vector<std::string> kinds;
  for (const auto& d : docs)
    if (std::find(kinds.begin(), kinds.end(), d.kind) == kinds.end()) kinds.push_back(d.kind);
  std::sort(kinds.begin(), kinds.end());
  const Split split = parse_split(o.split);
  Selection sel;
  sel.kinds = kinds;
  sel.docs.assign(kinds.size(), 0);
  sel.planned.assign(kinds.size(), 0);
  std::map<std::string, int64_t> index_in_kind;
  const int64_t kNoCap = INT64_MAX;
  const int64_t kind_cap = o.max_tokens_per_kind > 0 ? o.max_tokens_per_kind : kNoCap;
  const int64_t total_cap = o.max_tokens > 0 ? o.max_tokens : kNoCap;
  for (const auto& d : docs) {
    const int64_t index = index_in_kind[d.kind]++;
    auto kit = std::find(kinds.begin(), kinds.end(), d.kind);
    if (kit == kinds.end() || !keep_doc(split, index)) continue;
    const size_t k = size_t(kit - kinds.begin());
    if (sel.planned[k] >= kind_cap || sel.total >= total_cap) continue;
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(d.text);
    } catch (const InputError& e) {
      fail("{}:{}: document \"{}\": {}", o.corpus, d.line, d.name, e.what());
    }
    for (int32_t id : ids)
      if (id < 0 || id >= vocab)
        fail("{}:{}: token id {} is outside the model's vocab of {} (tokenizer {} does not fit the model)", o.corpus,
             d.line, id, vocab, tok.source());
    if (ids.empty()) continue;
    ++sel.docs[k];
    const int64_t step = mode == ProfileMode::kTeacher ? o.window : o.prompt_tokens;
    for (int64_t at = 0; at < int64_t(ids.size()); at += step) {
      const int64_t left = std::min(kind_cap - sel.planned[k], total_cap - sel.total);
      if (left <= 0) break;
      Unit u;
      u.kind = k;
      int64_t len = std::min<int64_t>(step, int64_t(ids.size()) - at);
      if (mode == ProfileMode::kTeacher) {
        len = std::min(len, left);
        u.count = len;
      } else {
        u.count = std::min(o.gen_tokens, left);
      }
      u.tokens.assign(ids.begin() + at, ids.begin() + at + len);
      sel.planned[k] += u.count;
      sel.total += u.count;
      sel.units.push_back(std::move(u));
    }
  }
  if (sel.total == 0) fail("no tokens to profile: the selected documents of {} are empty", o.corpus);
  return sel;
}

// Records one forward's routing, attributing each item's rows to its unit's kind. `active` false
// (a generate prefill) records nothing.
struct Recorder {
  ExpertStats* stats = nullptr;
  const std::vector<std::string>* kinds = nullptr;
  std::vector<std::pair<size_t, int64_t>> runs;  // (kind, rows) per item, in batch order
  bool active = false;

  void on_routing(int64_t layer, const Routing& r) {
    if (!active) return;
    int64_t row = 0;
    for (const auto& [kind, n] : runs) {
      stats->record(layer, r.ids.data() + row * r.k, r.weights.data() + row * r.k, n, r.k, (*kinds)[kind]);
      row += n;
    }
    TANDEM_ASSERT(row == r.n_rows, "routing has {} rows, the batch {}", r.n_rows, row);
  }
};

void run_teacher(Engine& engine, const Selection& sel, int64_t batch, ExpertStats& stats, Recorder& rec,
                 Progress& progress) {
  std::vector<Engine::Item> items;
  for (size_t at = 0; at < sel.units.size(); at += size_t(batch)) {
    const size_t end = std::min(sel.units.size(), at + size_t(batch));
    items.clear();
    rec.runs.clear();
    int64_t n = 0;
    for (size_t i = at; i < end; ++i) {
      const Unit& u = sel.units[i];
      items.push_back({engine.add_sequence(), u.tokens});
      rec.runs.emplace_back(u.kind, int64_t(u.tokens.size()));
      n += int64_t(u.tokens.size());
    }
    rec.active = true;
    engine.forward(items);
    for (size_t i = at; i < end; ++i) stats.add_tokens(sel.kinds[sel.units[i].kind], sel.units[i].count);
    for (const auto& it : items) engine.remove_sequence(it.seq);
    progress.add(n);
  }
}

// Prefills a batch of prompts (not counted), then decodes them together one token per step; every
// decode step of a sequence counts once, until it has made `count` steps or sampled a stop token.
void run_generate(Engine& engine, const Selection& sel, const Opts& o, const std::vector<int32_t>& stop_ids,
                  ExpertStats& stats, Recorder& rec, Progress& progress) {
  const int64_t vocab = engine.vocab_size();
  struct Live {
    int seq;
    size_t unit;
    int64_t steps = 0;
    int32_t next = 0;
    Sampler sampler;
  };
  std::vector<Engine::Item> items;
  for (size_t at = 0; at < sel.units.size(); at += size_t(o.batch)) {
    const size_t end = std::min(sel.units.size(), at + size_t(o.batch));
    std::vector<Live> live;
    items.clear();
    for (size_t i = at; i < end; ++i) {
      live.push_back({engine.add_sequence(), i, 0, 0, Sampler({o.temperature, 0, 1.0f, o.seed + i})});
      items.push_back({live.back().seq, sel.units[i].tokens});
    }
    rec.active = false;
    const std::vector<float>* logits = &engine.forward(items);
    std::vector<int32_t> fed(live.size());
    while (true) {
      items.clear();
      rec.runs.clear();
      std::vector<Live> still;
      for (size_t i = 0; i < live.size(); ++i) {
        Live& l = live[i];
        const int32_t t = l.sampler.sample(logits->data() + int64_t(i) * vocab, vocab);
        const bool stop = std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end();
        if (stop || l.steps >= sel.units[l.unit].count) {
          engine.remove_sequence(l.seq);
          continue;
        }
        l.next = t;
        still.push_back(std::move(l));
      }
      live = std::move(still);
      if (live.empty()) break;
      for (size_t i = 0; i < live.size(); ++i) {
        fed[i] = live[i].next;
        items.push_back({live[i].seq, std::span<const int32_t>(&fed[i], 1)});
        rec.runs.emplace_back(sel.units[live[i].unit].kind, 1);
      }
      rec.active = true;
      logits = &engine.forward(items);
      for (Live& l : live) {
        ++l.steps;
        stats.add_tokens(sel.kinds[sel.units[l.unit].kind], 1);
      }
      progress.add(int64_t(live.size()));
    }
  }
}

std::string join_kinds(const Selection& sel, const std::vector<int64_t>& values) {
  std::string s;
  for (size_t k = 0; k < sel.kinds.size(); ++k) s += fmt::format("{}{}={}", s.empty() ? "" : ",", sel.kinds[k], values[k]);
  return s;
}

int run(const Opts& o) {
  auto mode = profile_mode_from_name(o.mode);
  if (!mode) fail("--mode must be teacher or generate, got \"{}\"", o.mode);
  parse_split(o.split);
  std::vector<CorpusDoc> docs = load_corpus(o.corpus, o.kinds);
  const std::string tok_path = o.model.model_dir + "/tokenizer.json";
  if (access(tok_path.c_str(), R_OK) != 0)
    fail("{} has no tokenizer.json: profile tokenizes the corpus with the model's tokenizer", o.model.model_dir);
  Tokenizer tok = Tokenizer::load(tok_path);

  Runtime rt = Runtime::open(runtime_options(o.model, o.batch));
  const ModelConfig& cfg = rt.model->cfg;
  if (cfg.n_moe_layers() == 0) fail("{} has no MoE layers: nothing to profile", o.model.model_dir);
  const int64_t ctx = o.model.max_ctx > 0 ? o.model.max_ctx : cfg.max_position_embeddings;
  const int64_t need = *mode == ProfileMode::kTeacher ? o.window : o.prompt_tokens + o.gen_tokens;
  if (need > ctx)
    fail("{} tokens per sequence exceed the context limit of {} (lower --window, --prompt-tokens or --gen-tokens)",
         need, ctx);

  Selection sel = select_units(o, *mode, docs, tok, cfg.vocab_size);
  const std::string fp = model_fingerprint(cfg, rt.model->store);
  ExpertStats stats = ExpertStats::for_model(cfg, fp, *mode);
  Recorder rec{&stats, &sel.kinds, {}, false};
  rt.engine->hooks.on_routing = [&rec](int64_t layer, const Routing& r) { rec.on_routing(layer, r); };

  fmt::print(stderr, "profile: {} ({}), {} mode, {} units, up to {} tokens ({})\n", o.model.model_dir, fp, o.mode,
             sel.units.size(), sel.total, join_kinds(sel, sel.planned));
  Progress progress(sel.total, isatty(STDERR_FILENO) != 0);
  if (*mode == ProfileMode::kTeacher) {
    run_teacher(*rt.engine, sel, o.batch, stats, rec, progress);
  } else {
    std::vector<int32_t> stop;
    for (int64_t e : cfg.eos_token_ids) stop.push_back(int32_t(e));
    run_generate(*rt.engine, sel, o, stop, stats, rec, progress);
  }
  progress.finish();
  rt.engine->hooks.on_routing = nullptr;

  std::vector<int64_t> counted;
  for (const auto& k : sel.kinds) counted.push_back(stats.tokens(k));
  auto& meta = stats.meta();
  meta["corpus"] = o.corpus;
  meta["kinds"] = join_kinds(sel, counted);
  meta["docs"] = join_kinds(sel, sel.docs);
  meta["split"] = o.split;
  meta["max_tokens"] = o.max_tokens > 0 ? std::to_string(o.max_tokens) : "none";
  meta["max_tokens_per_kind"] = o.max_tokens_per_kind > 0 ? std::to_string(o.max_tokens_per_kind) : "none";
  meta["tokenizer"] = tok_path;
  if (*mode == ProfileMode::kTeacher) {
    meta["window"] = std::to_string(o.window);
  } else {
    meta["prompt_tokens"] = std::to_string(o.prompt_tokens);
    meta["gen_tokens"] = std::to_string(o.gen_tokens);
    meta["temperature"] = fmt::format("{}", o.temperature);
    meta["seed"] = std::to_string(o.seed);
  }
  stats.save(o.out);

  fmt::print("{:<16} {:>6} {:>10}\n", "kind", "docs", "tokens");
  for (size_t k = 0; k < sel.kinds.size(); ++k) fmt::print("{:<16} {:>6} {:>10}\n", sel.kinds[k], sel.docs[k], counted[k]);
  fmt::print("wrote {} ({} mode, {} tokens, model {})\n", o.out, o.mode, stats.total_tokens(), fp);
  fmt::print(stderr, "next: tandem plan --model {} --stats {} --primary-memory SIZE (the trade-off table), then "
             "--cold-per-layer N or --kv-tokens N with --out rowmap.json\n", o.model.model_dir, o.out);
  fmt::print(stderr, "profile: {} tokens in {:.1f} s ({:.0f} tokens/s)\n", stats.total_tokens(), progress.seconds(),
             progress.rate());
  return 0;
}

RunFn setup(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  add_model_options(app, o->model, ModelOptionSet::kDevice);
  app.add_option("--corpus", o->corpus, "JSON lines {\"kind\", \"name\", \"text\"} (`tandem corpus` makes one from text files)")
      ->required();
  app.add_option("--out", o->out, "Stats file to write (tandem.stats/1)")->required();
  app.add_option("--mode", o->mode,
                 "teacher: every text position is one decode step (default); generate: excerpts are prompts, "
                 "generated steps count");
  app.add_option("--kinds", o->kinds, "Only these kinds (comma-separated; default: all)")->delimiter(',');
  app.add_option("--split", o->split,
                 "all (default), even or odd: the documents of each kind with an even / odd index (0-based, "
                 "corpus order); plan on one half, --evaluate on the other")
      ->check(CLI::IsMember({"all", "even", "odd"}));
  app.add_option("--max-tokens", o->max_tokens, "Stop after N counted tokens in all (corpus order; 0: no cap)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-tokens-per-kind", o->max_tokens_per_kind,
                 "At most N counted tokens of each kind (0: no cap)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--window", o->window, "teacher: tokens per window; longer documents are cut (default 512)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o->batch, "Sequences per forward pass (default 8)")->check(CLI::PositiveNumber);
  app.add_option("--prompt-tokens", o->prompt_tokens, "generate: tokens per prompt excerpt (default 64)")
      ->check(CLI::PositiveNumber);
  app.add_option("--gen-tokens", o->gen_tokens, "generate: decode steps per prompt (default 32)")
      ->check(CLI::PositiveNumber);
  app.add_option("--temperature", o->temperature, "generate: 0 = greedy (default)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o->seed, "generate: sampling seed (prompt i uses seed + i)");
  return [o] { return run(*o); };
}

}  // namespace
TANDEM_COMMAND(profile, "profile", "Count expert traffic on a corpus (stats for tandem plan)", setup);
}  // namespace tandem::cli
