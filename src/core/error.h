// Errors. Two kinds, never mixed:
//  - TANDEM_ASSERT: a bug or a broken invariant. Prints file:line and aborts. On in every build.
//  - InputError (thrown by fail()): bad input (file, config, rowmap, request, shared memory). Carries
//    context (which file, tensor, field, what was expected). Caught at one boundary per thread and
//    turned into exit code 2 (CLI), an HTTP error or an error status on the shared-memory link.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tandem {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A device ran out of memory for what was asked (weights, KV, step buffers): not bad input, not a bug.
// The message names what did not fit, how much and what was free. The CLI exits with kExitOutOfMemory;
// `tandem bench` skips the cell that caused it.
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The exit code of a command that rejected its input.
inline constexpr int kExitBadInput = 2;
// The exit code of a command that ran a device out of memory.
inline constexpr int kExitOutOfMemory = 5;

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw InputError(fmt::format(format, std::forward<Args>(args)...));
}

namespace detail {
[[noreturn]] void assert_fail(const char* file, int line, const char* cond, const std::string& message);
}  // namespace detail

template <class... Args>
[[noreturn]] void fail_out_of_memory(fmt::format_string<Args...> format, Args&&... args) {
  throw OutOfMemoryError(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tandem

#define TANDEM_ASSERT(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::tandem::detail::assert_fail(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__));   \
  } while (0)
