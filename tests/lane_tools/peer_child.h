// A `tandem peer` child for lane tests: started with a model, a rowmap and a lane name, its log in the
// test's temp folder; wait_serving() until it says so; stopped (and reaped) by the destructor.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include "process.h"
#include "test_util.h"

namespace tandem::test {

struct PeerChild {
  Child child;
  std::string log;
  PeerChild(const std::string& model, const std::string& rowmap, const std::string& lane, const TempDir& tmp,
            std::vector<std::string> extra = {}) {
    log = tmp.file("peer-" + lane + ".log");
    std::vector<std::string> args = {tandem_binary(), "peer", "--model", model, "--rowmap", rowmap, "--lane", lane,
                                     "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    child = spawn(args, tmp.file("peer.out"), log);
  }
  // Waits for the `serving` line; false if the peer exited or took too long.
  bool wait_serving() {
    return wait_until([&] { return read_file(log).find("serving") != std::string::npos || try_reap(child); }, 30) &&
           !child.reaped;
  }
  ~PeerChild() {
    if (!child.reaped) {
      kill(child.pid, SIGCONT);
      kill(child.pid, SIGTERM);
      wait_exit(child, 10);
    }
  }
};

}  // namespace tandem::test
