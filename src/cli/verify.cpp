// `tandem verify`: compare the engine with a reference dump (expected.safetensors) from transformers.
#include <fmt/format.h>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/verify.h"

namespace tandem::cli {
namespace {

RunFn setup(CLI::App& app) {
  auto o = std::make_shared<ModelOptions>();
  auto expected = std::make_shared<std::string>();
  auto tol = std::make_shared<double>(1e-4);
  add_model_options(app, *o);
  app.add_option("--expected", *expected, "Reference dump (safetensors: input_ids, logits, moe_out.L, gen_tokens, gen_logits)")
      ->required();
  app.add_option("--tolerance", *tol, "Max relative error max|a-b|/max|b| per tensor (default 1e-4, f32 compute)");
  return [=] {
    Runtime rt = Runtime::open(runtime_options(*o, 8));
    VerifyOptions vo;
    vo.tolerance = *tol;
    auto checks = verify_against(*rt.engine, *expected, vo);
    bool pass = true;
    fmt::print("{:<14} {:>14} {:>10}  result\n", "check", "max_rel_err", "tolerance");
    for (const auto& c : checks) {
      if (c.name == "gen_tokens")
        fmt::print("{:<14} {:>14} {:>10}  {}\n", c.name, fmt::format("{} differ", int(c.max_rel_err)), "exact",
                   c.pass ? "ok" : "FAIL");
      else
        fmt::print("{:<14} {:>14.3e} {:>10.0e}  {}\n", c.name, c.max_rel_err, c.tolerance, c.pass ? "ok" : "FAIL");
      pass = pass && c.pass;
    }
    fmt::print("verify: {}\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
  };
}

}  // namespace
TANDEM_COMMAND(verify, "verify", "Compare the engine with a reference dump from transformers (exit 0 only on pass)", setup);
}  // namespace tandem::cli
