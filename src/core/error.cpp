// Assertion failure reporting (see error.h).
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace tandem::detail {

void assert_fail(const char* file, int line, const char* cond, const std::string& message) {
  std::fprintf(stderr, "%s:%d: TANDEM_ASSERT(%s) failed: %s\n", file, line, cond, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tandem::detail
