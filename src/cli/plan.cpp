// `tandem plan`: turns expert traffic stats into a rowmap under one budget and prints the trade-off
// between hot experts and KV capacity; `--check` validates a rowmap against a model, `--evaluate`
// measures a rowmap's cold share on other traffic. All logic lives in src/placement; this file parses
// flags, loads files and prints.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "placement/fingerprint.h"
#include "placement/memory_model.h"
#include "placement/planner.h"
#include "placement/rowmap.h"
#include "placement/stats.h"

namespace tandem::cli {
namespace {

struct PlanArgs {
  std::string model, stats, out, check, evaluate, weights = "checkpoint";
  std::string policy = "uniform";
  int64_t hot_per_layer = 0, cold_per_layer = 0, kv_tokens = 0;
  std::string primary_memory, reserve, kv_dtype = "bf16", weight_dtype;
  CLI::Option *hot_opt = nullptr, *cold_opt = nullptr, *mem_opt = nullptr, *kv_opt = nullptr, *reserve_opt = nullptr;
};

struct LoadedModel {
  ModelConfig cfg;
  TensorStore store;
  std::string fingerprint;
};

LoadedModel load_model(const std::string& dir, const std::string& weights) {
  ModelConfig cfg = load_config(dir);
  apply_weights_option(cfg, weights);
  TensorStore store = TensorStore::open_dir(dir);
  std::string fp = model_fingerprint(cfg, store);
  return {std::move(cfg), std::move(store), std::move(fp)};
}

DType parse_float_dtype(const std::string& s, std::string_view flag) {
  std::string upper;
  for (char c : s) upper += char(std::toupper(static_cast<unsigned char>(c)));
  auto d = dtype_from_name(upper);
  if (!d || !dtype_is_float_weight(*d)) fail("{} must be bf16, f16 or f32, got \"{}\"", flag, s);
  return *d;
}

std::string percent(double share) { return fmt::format("{:.2f}%", 100.0 * share); }

// One row per hot count: the KV tokens it leaves (with a memory budget only), the share of routed
// slots that go cold, cold rows per token and the expert bytes a host lane would read per token.
void print_table(const PlanResult& r, bool with_memory) {
  const std::string kv_head = with_memory ? fmt::format(" {:>16}", "KV tokens") : "";
  fmt::print("{:>2} {:>10} {:>10}{} {:>11} {:>15} {:>18}\n", "", "hot/layer", "hot total", kv_head, "cold share",
             "cold rows/tok", "host bytes/tok");
  for (const TradeoffRow& row : r.table) {
    std::string kv;
    if (with_memory) kv = fmt::format(" {:>16}", row.fits ? fmt::format("{}", row.kv_tokens) : "does not fit");
    fmt::print("{:>2} {:>10.2f} {:>10}{} {:>11} {:>15.3f} {:>18}\n", row.chosen ? "->" : "", row.hot_per_layer,
               row.n_hot, kv, percent(row.traffic.cold_share), row.traffic.cold_rows_per_token,
               format_bytes(uint64_t(row.traffic.host_bytes_per_token + 0.5)));
  }
  if (!with_memory)
    fmt::print("(-> marks the plan written. With --primary-memory SIZE the table also shows the KV-cache tokens "
               "each row leaves.)\n");
}

// The reserve: --reserve when given, else 10% of the primary memory, at most 1 GiB (a fixed 1 GiB
// would leave nothing on a small model's budget).
uint64_t reserve_bytes(const PlanArgs& a, uint64_t primary) {
  if (a.reserve_opt->count()) return parse_size(a.reserve, "--reserve");
  return std::min<uint64_t>(primary / 10, uint64_t(1) << 30);
}

int run_check(const PlanArgs& a) {
  if (a.model.empty()) fail("--check needs --model DIR");
  LoadedModel m = load_model(a.model, a.weights);
  Rowmap rm = Rowmap::load(a.check);
  validate(rm, m.cfg, m.fingerprint, a.check);
  fmt::print("{}: ok for model {} ({} MoE layers, {} hot / {} cold experts), rowmap fingerprint {}\n", a.check,
             m.fingerprint, rm.layers.size(), rm.n_hot(), rm.n_cold(), rm.rowmap_fingerprint);
  return 0;
}

int run_evaluate(const PlanArgs& a) {
  if (a.stats.empty()) fail("--evaluate needs --stats FILE (traffic the map was not made from)");
  Rowmap rm = Rowmap::load(a.evaluate);
  ExpertStats stats = ExpertStats::load(a.stats);
  if (!a.model.empty()) {
    LoadedModel m = load_model(a.model, a.weights);
    validate(rm, m.cfg, m.fingerprint, a.evaluate);
    validate_stats(stats, m.cfg, m.fingerprint, a.stats);
  }
  Evaluation ev = evaluate(rm, stats, a.stats);
  int64_t planned_tokens = 0;
  for (const auto& [kind, t] : rm.source.tokens) planned_tokens += t;
  fmt::print("rowmap {} ({} policy, planned on {} tokens) on {} ({} tokens, {} mode)\n", a.evaluate,
             rm.source.policy, planned_tokens, a.stats, ev.tokens, profile_mode_name(stats.mode()));
  fmt::print("{:<16} {:>12} {:>14} {:>14} {:>10}\n", "kind", "tokens", "cold measured", "cold expected", "delta");
  for (const Evaluation::Kind& k : ev.kinds)
    fmt::print("{:<16} {:>12} {:>14} {:>14} {:>10}\n", k.kind, k.tokens, percent(k.measured),
               k.expected ? percent(*k.expected) : "-",
               k.expected ? fmt::format("{:+.2f}", 100.0 * (k.measured - *k.expected)) : "-");
  fmt::print("{:<16} {:>12} {:>14} {:>14} {:>10}\n", "all", ev.tokens, percent(ev.measured), percent(ev.expected),
             fmt::format("{:+.2f}", 100.0 * (ev.measured - ev.expected)));
  return 0;
}

int run_plan(const PlanArgs& a) {
  if (a.model.empty() || a.stats.empty())
    fail("plan needs --model DIR and --stats FILE (from `tandem profile`); or --check R / --evaluate R");
  int n_budgets = int(a.hot_opt->count() > 0) + int(a.cold_opt->count() > 0) + int(a.mem_opt->count() > 0);
  if (n_budgets != 1) fail("give exactly one budget: --hot-per-layer N, --cold-per-layer N or --primary-memory SIZE");
  if (a.kv_opt->count() > 0 && a.mem_opt->count() == 0) fail("--kv-tokens goes with --primary-memory");
  if (a.reserve_opt->count() > 0 && a.mem_opt->count() == 0) fail("--reserve goes with --primary-memory");
  auto policy = plan_policy_from_name(a.policy);
  if (!policy) fail("--policy must be uniform or global, got \"{}\"", a.policy);

  PlanBudget budget;
  if (a.hot_opt->count()) {
    budget = {PlanBudget::Kind::kHotPerLayer, a.hot_per_layer, std::nullopt,
              fmt::format("--hot-per-layer {}", a.hot_per_layer)};
  } else if (a.cold_opt->count()) {
    budget = {PlanBudget::Kind::kColdPerLayer, a.cold_per_layer, std::nullopt,
              fmt::format("--cold-per-layer {}", a.cold_per_layer)};
  } else {
    budget.kind = PlanBudget::Kind::kPrimaryMemory;
    budget.text = fmt::format("--primary-memory {} --reserve {} --kv-dtype {}", a.primary_memory,
                              a.reserve_opt->count() ? a.reserve : "auto", a.kv_dtype);
    if (a.kv_opt->count()) {
      budget.kv_tokens = a.kv_tokens;
      budget.text += fmt::format(" --kv-tokens {}", a.kv_tokens);
    }
  }
  bool table_only = budget.kind == PlanBudget::Kind::kPrimaryMemory && !budget.kv_tokens;
  if (!table_only && a.out.empty()) fail("plan needs --out FILE for the rowmap");

  LoadedModel m = load_model(a.model, a.weights);
  ExpertStats stats = ExpertStats::load(a.stats);
  validate_stats(stats, m.cfg, m.fingerprint, a.stats);
  ModelBytes bytes = a.weight_dtype.empty() ? model_bytes(m.cfg, m.store)
                                            : model_bytes(m.cfg, parse_float_dtype(a.weight_dtype, "--weight-dtype"));
  std::optional<MemoryModel> memory;
  if (a.mem_opt->count()) {
    const uint64_t primary = parse_size(a.primary_memory, "--primary-memory");
    memory = MemoryModel{bytes, primary, reserve_bytes(a, primary),
                         kv_bytes_per_token(m.cfg, parse_float_dtype(a.kv_dtype, "--kv-dtype"))};
  }

  fmt::print("model {} (model fingerprint {}), {} MoE layers × {} experts (top-{}), one expert {}\n", a.model, m.fingerprint,
             stats.n_moe_layer(), stats.n_expert(), stats.n_expert_used(), format_bytes(bytes.expert_bytes));
  fmt::print("stats {} ({} mode, {} tokens)\n", a.stats, profile_mode_name(stats.mode()), stats.total_tokens());
  if (memory)
    fmt::print("primary {}: fixed weights {} (shared experts {}), reserve {}{}, free for hot experts + KV {}; "
               "KV {} per token\n",
               format_bytes(memory->primary_bytes), format_bytes(bytes.primary_fixed()),
               format_bytes(bytes.shared_experts), format_bytes(memory->reserve_bytes),
               a.reserve_opt->count() ? "" : " (default: 10% of it, at most 1 GiB)",
               memory->free_bytes() >= 0 ? format_bytes(uint64_t(memory->free_bytes())) : "none (over budget)",
               format_bytes(memory->kv_bytes_per_token));

  PlanResult r = plan(stats, *policy, budget, bytes.expert_bytes, memory ? &*memory : nullptr);
  print_table(r, memory.has_value());
  if (memory && memory->free_bytes() < 0)
    fmt::print("no row fits: the fixed weights and the reserve exceed --primary-memory {}; give more memory or a "
               "smaller --reserve\n", a.primary_memory);
  if (table_only) {
    if (!a.out.empty())
      fail("--primary-memory needs --kv-tokens N to write {}: the KV-cache tokens the primary must hold (pick them "
           "from the table above), or use --hot-per-layer N / --cold-per-layer N",
           a.out);
    fmt::print("no rowmap written: pick a row and rerun with --kv-tokens N and --out FILE (or --hot-per-layer N)\n");
    return 0;
  }
  r.rowmap->save(a.out);
  fmt::print("wrote {} ({} policy, {} hot / {} cold, expected cold share {}, rowmap fingerprint {})\n", a.out,
             r.rowmap->source.policy, r.rowmap->n_hot(), r.rowmap->n_cold(),
             percent(r.rowmap->source.expected_cold_share), r.rowmap->rowmap_fingerprint);
  fmt::print(stderr, "next: tandem peer --model {} --rowmap {} --lane NAME &, then a primary with --lane peer --peer "
             "NAME --rowmap {} (docs/quickstart.md, step 6)\n", a.model, a.out, a.out);
  return 0;
}

RunFn plan_setup(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  app.add_option("--model", a->model, "REQUIRED (optional with --evaluate): model folder (config.json + safetensors)");
  add_weights_option(app, a->weights);
  app.add_option("--stats", a->stats, "REQUIRED (not with --check): traffic stats from `tandem profile` (tandem.stats/1)");
  app.add_option("--out", a->out, "rowmap to write (tandem.rowmap/1)");
  a->hot_opt = app.add_option("--hot-per-layer", a->hot_per_layer, "budget: hot experts per MoE layer");
  a->cold_opt = app.add_option("--cold-per-layer", a->cold_per_layer, "budget: cold experts per MoE layer");
  a->mem_opt = app.add_option("--primary-memory", a->primary_memory, "budget: primary memory, e.g. 80GiB");
  a->kv_opt = app.add_option("--kv-tokens", a->kv_tokens, "KV cache tokens the primary must hold (with --primary-memory)");
  app.add_option("--policy", a->policy, "uniform (same hot count per layer) or global (one budget)")->capture_default_str();
  app.add_option("--kv-dtype", a->kv_dtype, "KV cache dtype: bf16, f16 or f32")->capture_default_str();
  a->reserve_opt = app.add_option("--reserve", a->reserve,
                                  "primary memory kept free for activations and workspaces (with --primary-memory; "
                                  "default: 10% of it, at most 1GiB)");
  app.add_option("--weight-dtype", a->weight_dtype,
                 "count weights at this dtype from the config instead of the checkpoint's tensor bytes");
  app.add_option("--check", a->check, "validate this rowmap against --model");
  app.add_option("--evaluate", a->evaluate, "measure this rowmap's cold share on --stats");
  return [a]() -> int {
    if (!a->check.empty() && !a->evaluate.empty()) fail("give --check or --evaluate, not both");
    if (!a->check.empty()) return run_check(*a);
    if (!a->evaluate.empty()) return run_evaluate(*a);
    return run_plan(*a);
  };
}

}  // namespace
}  // namespace tandem::cli

TANDEM_COMMAND(plan, "plan", "rank experts by traffic and write the hot/cold rowmap for a memory budget",
               tandem::cli::plan_setup);
