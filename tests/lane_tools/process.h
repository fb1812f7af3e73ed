// Child processes for lane tests: spawn a program with stdout/stderr to files, wait with a bound
// (a test must end even when the code under test hangs), find the helper binaries next to `tandem`.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fcntl.h>
#include <string>
#include <thread>
#include <vector>

namespace tandem::test {

struct Child {
  pid_t pid = -1;
  int exit_code = -1;  // after wait: exit status, or 128 + signal
  bool reaped = false;
};

inline Child spawn(const std::vector<std::string>& args, const std::string& out_path, const std::string& err_path) {
  Child c;
  c.pid = fork();
  if (c.pid == 0) {
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out, 1);
    dup2(err, 2);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return c;
}

// Reaps c if it has exited; true when it has.
inline bool try_reap(Child& c) {
  if (c.reaped) return true;
  int status = 0;
  if (waitpid(c.pid, &status, WNOHANG) != c.pid) return false;
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.reaped = true;
  return true;
}

// Waits up to timeout_s for c to exit; kills it (SIGKILL) and returns false past the bound.
inline bool wait_exit(Child& c, double timeout_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!try_reap(c)) {
    if (std::chrono::steady_clock::now() > end) {
      kill(c.pid, SIGCONT);
      kill(c.pid, SIGKILL);
      int status = 0;
      waitpid(c.pid, &status, 0);
      c.reaped = true;
      c.exit_code = 128 + SIGKILL;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Polls cond every 5 ms for up to timeout_s; returns its last value.
template <class F>
bool wait_until(F cond, double timeout_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Helper programs are built next to the tandem binary.
inline std::string helper_binary(const std::string& tandem_binary, const std::string& name) {
  auto slash = tandem_binary.rfind('/');
  return (slash == std::string::npos ? std::string(".") : tandem_binary.substr(0, slash)) + "/" + name;
}

}  // namespace tandem::test
