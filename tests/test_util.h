// Helpers shared by every test binary: where the fixtures are, temp folders, running the CLI.
#pragma once

#include <string>
#include <vector>

namespace tandem::test {

// The repo's own fixtures: tests/fixtures (made by tests/fixtures/make.py, committed). Every test reads
// these; a missing file is a test failure that names it (never a skip). $TANDEM_FIXTURES overrides the
// folder (test binaries run on another machine than the one that built them).
std::string fixtures_dir();
// tests/fixtures/oracle/<name>, after checking that its three files exist (throws naming the missing one).
std::string oracle_dir(const std::string& name);
// The repo's tokenizer fixture folder (tokenizer.json, encodings.json), checked the same way.
std::string tokenizer_dir();

// The optional extra fixture set beside the checkout: ../shared (or $TANDEM_SHARED when set). Empty when
// it is not there; tests over it skip, saying so.
std::string shared_dir();
// <shared>/fixtures/oracle/<name>, or "" when the shared set is absent.
std::string shared_oracle_dir(const std::string& name);
// Throws std::runtime_error("missing fixture file: PATH ...") when path does not exist.
void require_fixture(const std::string& path);
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
