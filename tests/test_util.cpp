// Test helpers (see test_util.h).
#include "test_util.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace tandem::test {

std::string fixtures_dir() {
  const char* env = std::getenv("TANDEM_FIXTURES");  // binaries carried to another machine (scripts/gpu_run.sh)
  return env ? env : TANDEM_SOURCE_DIR "/tests/fixtures";
}

void require_fixture(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw std::runtime_error("missing fixture file: " + path +
                             " (the repo's fixtures are made by tests/fixtures/make.py and committed)");
}

std::string oracle_dir(const std::string& name) {
  std::string dir = fixtures_dir() + "/oracle/" + name;
  for (const char* f : {"config.json", "model.safetensors", "expected.safetensors"}) require_fixture(dir + "/" + f);
  return dir;
}

std::string tokenizer_dir() {
  std::string dir = fixtures_dir() + "/tokenizer";
  for (const char* f : {"tokenizer.json", "encodings.json"}) require_fixture(dir + "/" + f);
  return dir;
}

std::string shared_dir() {
  const char* env = std::getenv("TANDEM_SHARED");
  std::string dir = env ? env : TANDEM_SHARED_DIR;
  return std::filesystem::is_directory(dir + "/fixtures") ? dir : "";
}

std::string shared_oracle_dir(const std::string& name) {
  std::string shared = shared_dir();
  return shared.empty() ? "" : shared + "/fixtures/oracle/" + name;
}
std::string tandem_binary() { return TANDEM_BINARY; }

TempDir::TempDir() {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (;;) {
    auto p = base / ("tandem-test-" + std::to_string(rd()));
    if (std::filesystem::create_directory(p)) {
      path = p.string();
      break;
    }
  }
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary);
  f << content;
}

CommandResult run_tandem(const std::vector<std::string>& args, const std::string& stdin_text) {
  TempDir tmp;
  std::string in_path = tmp.file("in"), out_path = tmp.file("out"), err_path = tmp.file("err");
  write_file(in_path, stdin_text);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int in = open(in_path.c_str(), O_RDONLY);
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    std::vector<char*> argv;
    std::string bin = tandem_binary();
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

}  // namespace tandem::test
