// Helpers shared by every test binary: where the fixtures are, temp folders, running the CLI.
#pragma once

#include <string>
#include <vector>

namespace tandem::test {

// ../shared (or $TANDEM_SHARED when set).
std::string shared_dir();
std::string oracle_dir(const std::string& name);  // shared/fixtures/oracle/<name>
std::string tandem_binary();                       // build/tandem
// A fresh folder under the system temp dir, removed by the destructor.
struct TempDir {
  TempDir();
  ~TempDir();
  std::string path;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the tandem binary with args (no shell), capturing stdout and stderr.
CommandResult run_tandem(const std::vector<std::string>& args, const std::string& stdin_text = "");

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& content);

}  // namespace tandem::test
