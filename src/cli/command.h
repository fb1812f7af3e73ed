// Subcommand registry. Each src/cli/<name>.cpp registers itself with a static TANDEM_COMMAND; main.cpp
// only dispatches. `setup` declares the options on the CLI11 subcommand and returns the function that
// runs it (returning the process exit code). InputError escaping `run` becomes exit code 2.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tandem::cli {

using RunFn = std::function<int()>;
struct CommandSpec {
  std::string name;
  std::string help;
  std::function<RunFn(CLI::App&)> setup;
};

std::vector<CommandSpec>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSpec spec) { command_registry().push_back(std::move(spec)); }
};

}  // namespace tandem::cli

#define TANDEM_COMMAND(ident, name, help, setup_fn) \
  static ::tandem::cli::CommandRegistrar tandem_command_##ident{{name, help, setup_fn}}
