// Renders a parsed template (ast.h) with jinja2's run-time rules: scopes (a for loop or macro body
// keeps its `set`s to itself; namespace() objects carry values out), the `loop` object, loop
// controls, macros and call blocks, Undefined values, and the globals transformers adds
// (raise_exception, strftime_now) next to jinja2's (range, dict, namespace). One Interpreter renders
// once; every render is bounded in work, output size and call depth so hostile templates end in
// an error instead of hanging or exhausting memory.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/ast.h"

namespace tandem::chat {

struct RenderOptions {
  std::function<std::tm()> now;        // strftime_now's clock (local time); unset: the system clock
  size_t max_output = 64u << 20;       // bytes of output, and of any one string or list built
  uint64_t max_steps = 20'000'000;     // statements run + loop iterations + calls
  int max_call_depth = 32;             // nested macro calls
  int max_eval_depth = 1500;           // nested evaluations, statements included: bounds the stack (~1 MB)
};

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);

  // Renders `tmpl` with `vars` as the template's variables.
  std::string render(const Template& tmpl, const Dict& vars);

  Value eval(const Expr& e);
  Value call(const Value& callee, CallArgs& args, int line);
  Value filter(const std::string& name, const Value& input, CallArgs& args, int line);
  bool test(const std::string& name, const Value& input, CallArgs& args, int line);
  void step(int line);                      // one unit of work; fails past max_steps
  void check_size(size_t bytes, int line);  // fails past max_output
  const RenderOptions& options() const { return options_; }

 private:
  enum class Flow { Normal, Break, Continue };
  using Scope = std::unordered_map<std::string, Value>;

  Flow exec(const Body& body, std::string& out);
  Flow exec_node(const Node& n, std::string& out);
  Flow exec_for(const Node& n, std::string& out);
  void exec_set(const Node& n, Value value);
  Value define_macro(const Node& n);
  Value eval_binary(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_call(const Expr& e);
  CallArgs eval_args(const Expr& e, size_t first);
  std::string render_scoped(const Node& n);  // n.body in a frame of its own
  Scope frame_scope(const std::vector<std::string>& undefined_names) const;  // a new frame's scope (scopes.h)

  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

  const RenderOptions& options_;
  std::vector<Scope> scopes_;   // [0]: the template's variables and top-level sets
  size_t floor_ = 0;            // lookups see scopes_[floor_..] then scopes_[0] (a macro's barrier)
  Scope globals_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  struct DepthGuard {  // counts nested eval/exec calls against max_eval_depth
    Interpreter& in;
    DepthGuard(Interpreter& interp, int line);
    ~DepthGuard() { --in.eval_depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
  };
};

// Iterating a value as a for loop does: a list's items, a dict's keys, a string's characters,
// nothing for Undefined; anything else fails (line).
List iterate(const Value& v, int line);

}  // namespace tandem::chat
