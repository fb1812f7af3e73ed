// The chat template interpreter (see interpreter.h): statements, expressions, operators with Python
// semantics (integers checked for overflow instead of growing), and the global functions.
#include "chat/interpreter.h"

#include <cmath>

#include "chat/builtins.h"

namespace tandem::chat {
namespace {

double to_double(const Value& v) {
  return v.kind == Kind::Float ? v.real : v.kind == Kind::Bool ? (v.boolean ? 1.0 : 0.0) : static_cast<double>(v.integer);
}
int64_t to_int(const Value& v) { return v.kind == Kind::Bool ? (v.boolean ? 1 : 0) : v.integer; }

[[noreturn]] void operand_fail(const std::string& op, const Value& a, const Value& b, int line) {
  template_fail(line, "unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

Value repeat(const Value& seq, int64_t n, Interpreter& in, int line) {
  if (n < 0) n = 0;
  size_t unit = seq.kind == Kind::String ? seq.str.size() : seq.list->size();
  if (unit != 0 && static_cast<uint64_t>(n) > in.options().max_output / unit) {
    template_fail(line, "result too large ({} x {})", unit, n);
  }
  if (seq.kind == Kind::String) {
    std::string s;
    for (int64_t i = 0; i < n; ++i) s += seq.str;
    return Value::from(std::move(s));
  }
  List l;
  for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.list->begin(), seq.list->end());
  return Value::from(std::move(l), seq.tuple);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, Interpreter& in, int line) {
  if (a.is_undefined()) undefined_fail(a, line);
  if (b.is_undefined()) undefined_fail(b, line);
  if (op == "+") {
    if (a.kind == Kind::String && b.kind == Kind::String) {
      in.check_size(a.str.size() + b.str.size(), line);
      return Value::from(a.str + b.str);
    }
    if (a.kind == Kind::List && b.kind == Kind::List && a.tuple == b.tuple) {
      in.check_size(a.list->size() + b.list->size(), line);
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::from(std::move(l), a.tuple);
    }
    if (a.kind == Kind::String) template_fail(line, "can only concatenate str (not \"{}\") to str", type_name(b));
  }
  if (op == "*") {
    if ((a.kind == Kind::String || a.kind == Kind::List) && (b.kind == Kind::Int || b.kind == Kind::Bool)) {
      return repeat(a, to_int(b), in, line);
    }
    if ((b.kind == Kind::String || b.kind == Kind::List) && (a.kind == Kind::Int || a.kind == Kind::Bool)) {
      return repeat(b, to_int(a), in, line);
    }
  }
  if (!a.is_number() || !b.is_number()) operand_fail(op, a, b, line);
  bool ints = a.kind != Kind::Float && b.kind != Kind::Float;
  if (ints && op != "/" && op != "**") {
    int64_t x = to_int(a), y = to_int(b), r = 0;
    if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value::from(r);
    if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::from(r);
    if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::from(r);
    if (op == "//" || op == "%") {
      if (y == 0) template_fail(line, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) template_fail(line, "integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::from(op == "//" ? q : m);
    }
    template_fail(line, "integer overflow in {} {} {}", x, op, y);
  }
  if (ints && op == "**" && to_int(b) >= 0) {
    int64_t base = to_int(a), e = to_int(b), r = 1;
    for (int64_t i = 0; i < e; ++i) {
      if (__builtin_mul_overflow(r, base, &r)) template_fail(line, "integer overflow in {} ** {}", base, e);
      if (r == 0 || r == 1) break;
    }
    if (r == 1 && base == -1 && e % 2 == 1) r = -1;
    return Value::from(r);
  }
  double x = to_double(a), y = to_double(b);
  if (op == "+") return Value::from(x + y);
  if (op == "-") return Value::from(x - y);
  if (op == "*") return Value::from(x * y);
  if (op == "**") return Value::from(std::pow(x, y));
  if (y == 0) template_fail(line, "float division by zero");
  if (op == "/") return Value::from(x / y);
  double q = std::floor(x / y);
  if (op == "//") return Value::from(q);
  double m = std::fmod(x, y);
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return Value::from(m);
}

bool contains(const Value& container, const Value& item, int line) {
  switch (container.kind) {
    case Kind::String:
      if (item.kind != Kind::String) {
        template_fail(line, "'in <string>' requires string as left operand, not {}", type_name(item));
      }
      return container.str.find(item.str) != std::string::npos;
    case Kind::List:
      for (const Value& x : *container.list) {
        if (equals(x, item)) return true;
      }
      return false;
    case Kind::Dict:
      return item.kind == Kind::String && container.dict->find(item.str) != nullptr;
    case Kind::Undefined:
      return false;
    case Kind::None:
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float:
    case Kind::Namespace:
    case Kind::Callable:
      break;
  }
  template_fail(line, "argument of type '{}' is not iterable", type_name(container));
}

}  // namespace

List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Kind::List:
      return *v.list;
    case Kind::Dict: {
      List keys;
      for (const auto& [k, x] : v.dict->entries()) keys.push_back(Value::from(k));
      return keys;
    }
    case Kind::String: {
      List chars;
      for (char32_t c : utf8_decode(v.str)) {
        std::string s;
        utf8_append(s, c);
        chars.push_back(Value::from(std::move(s)));
      }
      return chars;
    }
    case Kind::Undefined:
      return {};
    case Kind::None:
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float:
    case Kind::Namespace:
    case Kind::Callable:
      break;
  }
  template_fail(line, "'{}' object is not iterable", type_name(v));
}

Interpreter::Interpreter(const RenderOptions& options) : options_(options) {
  globals_["range"] = Value::function("range", [](Interpreter& in, CallArgs& a) {
    if (a.args.empty() || a.args.size() > 3) template_fail(a.line, "range expected 1 to 3 arguments");
    for (const Value& x : a.args) {
      if (x.kind != Kind::Int && x.kind != Kind::Bool) template_fail(a.line, "range: '{}' is not an integer", type_name(x));
    }
    int64_t start = 0, stop = to_int(a.args[0]), step = 1;
    if (a.args.size() >= 2) start = to_int(a.args[0]), stop = to_int(a.args[1]);
    if (a.args.size() == 3) step = to_int(a.args[2]);
    if (step == 0) template_fail(a.line, "range() arg 3 must not be zero");
    List l;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      in.step(a.line);
      l.push_back(Value::from(i));
      if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
    }
    return Value::from(std::move(l));
  });
  auto make_dict = [](CallArgs& a) {
    auto d = std::make_shared<Dict>();
    if (!a.args.empty()) {
      if (a.args.size() > 1 || a.args[0].kind != Kind::Dict) template_fail(a.line, "expected a dict or keyword arguments");
      for (const auto& [k, v] : a.args[0].dict->entries()) d->set(k, v);
    }
    for (auto& [k, v] : a.kwargs) d->set(k, v);
    return d;
  };
  globals_["dict"] = Value::function("dict", [make_dict](Interpreter&, CallArgs& a) { return Value::from(make_dict(a)); });
  globals_["namespace"] = Value::function("namespace", [make_dict](Interpreter&, CallArgs& a) {
    return Value::namespace_of(make_dict(a));
  });
  globals_["raise_exception"] = Value::function("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
    const Value* msg = arg(a, 0, "message");
    throw ChatTemplateError(msg ? to_str(*msg) : std::string("raise_exception() called"), a.line, true);
  });
  globals_["strftime_now"] = Value::function("strftime_now", [](Interpreter& in, CallArgs& a) {
    const Value* f = arg(a, 0, "format");
    if (!f || f->kind != Kind::String) template_fail(a.line, "strftime_now expects a format string");
    std::tm tm{};
    if (in.options().now) {
      tm = in.options().now();
    } else {
      std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    if (f->str.size() > 256) template_fail(a.line, "strftime_now: format too long");
    std::string buf(4096, '\0');
    size_t n = std::strftime(buf.data(), buf.size(), f->str.c_str(), &tm);
    buf.resize(n);
    return Value::from(std::move(buf));
  });
}

Interpreter::DepthGuard::DepthGuard(Interpreter& interp, int line) : in(interp) {
  if (++in.eval_depth_ > in.options_.max_eval_depth) {
    --in.eval_depth_;
    template_fail(line, "evaluation nested more than {} levels deep", in.options_.max_eval_depth);
  }
}

void Interpreter::step(int line) {
  if (++steps_ > options_.max_steps) template_fail(line, "rendering took more than {} steps", options_.max_steps);
}
void Interpreter::check_size(size_t bytes, int line) {
  if (bytes > options_.max_output) template_fail(line, "rendered text larger than {} bytes", options_.max_output);
}

std::string Interpreter::render(const Template& tmpl, const Dict& vars) {
  scopes_.assign(1, Scope{});
  for (const auto& [k, v] : vars.entries()) scopes_[0][k] = v;
  for (const auto& [k, v] : frame_scope(tmpl.body_undefined)) scopes_[0][k] = v;
  std::string out;
  exec(tmpl.body, out);
  return out;
}

Interpreter::Scope Interpreter::frame_scope(const std::vector<std::string>& undefined_names) const {
  Scope scope;
  for (const auto& name : undefined_names) scope[name] = Value::undefined("'" + name + "' is undefined");
  return scope;
}

Value Interpreter::lookup(const std::string& name) const {
  for (size_t i = scopes_.size(); i-- > floor_;) {
    auto it = scopes_[i].find(name);
    if (it != scopes_[i].end()) return it->second;
  }
  if (floor_ > 0) {
    auto it = scopes_[0].find(name);
    if (it != scopes_[0].end()) return it->second;
  }
  auto it = globals_.find(name);
  if (it != globals_.end()) return it->second;
  return Value::undefined("'" + name + "' is undefined");
}

Interpreter::Flow Interpreter::exec(const Body& body, std::string& out) {
  for (const auto& n : body) {
    Flow f = exec_node(*n, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

std::string Interpreter::render_scoped(const Node& n) {
  scopes_.push_back(frame_scope(n.body_undefined));
  std::string out;
  exec(n.body, out);
  scopes_.pop_back();
  return out;
}

Interpreter::Flow Interpreter::exec_node(const Node& n, std::string& out) {
  step(n.line);
  DepthGuard guard(*this, n.line);
  switch (n.kind) {
    case NodeKind::Text:
      out += n.text;
      break;
    case NodeKind::Output:
      out += to_str(eval(*n.expr));
      break;
    case NodeKind::If:
      for (const auto& [test, body] : n.branches) {
        if (truthy(eval(*test))) return exec(body, out);
      }
      return exec(n.else_body, out);
    case NodeKind::For:
      return exec_for(n, out);
    case NodeKind::Set:
      exec_set(n, eval(*n.expr));
      break;
    case NodeKind::SetBlock: {
      Value v = Value::from(render_scoped(n));
      for (const auto& f : n.filters) {
        CallArgs a = eval_args(*f, 1);
        v = filter(f->name, v, a, f->line);
      }
      exec_set(n, std::move(v));
      break;
    }
    case NodeKind::FilterBlock: {
      Value v = Value::from(render_scoped(n));
      for (const auto& f : n.filters) {
        CallArgs a = eval_args(*f, 1);
        v = filter(f->name, v, a, f->line);
      }
      out += to_str(v);
      break;
    }
    case NodeKind::Macro:
      assign(n.text, define_macro(n));
      break;
    case NodeKind::CallBlock: {
      Value caller = define_macro(n);
      const Expr& call_expr = *n.expr;
      CallArgs a = eval_args(call_expr, 1);
      a.kwargs.emplace_back("caller", std::move(caller));
      Value callee = eval(*call_expr.kids[0]);
      out += to_str(call(callee, a, n.line));
      break;
    }
    case NodeKind::With: {
      Scope scope = frame_scope(n.body_undefined);
      for (const auto& [name, e] : n.assigns) scope[name] = eval(*e);
      scopes_.push_back(std::move(scope));
      Flow f = exec(n.body, out);
      scopes_.pop_back();
      if (f != Flow::Normal) return f;
      break;
    }
    case NodeKind::Scope:
      return exec(n.body, out);
    case NodeKind::Break:
      return Flow::Break;
    case NodeKind::Continue:
      return Flow::Continue;
  }
  check_size(out.size(), n.line);
  return Flow::Normal;
}

void Interpreter::exec_set(const Node& n, Value value) {
  if (!n.attr.empty()) {
    Value ns = lookup(n.text);
    if (ns.kind != Kind::Namespace) template_fail(n.line, "cannot assign attribute on non-namespace object '{}'", n.text);
    check_storable(value, ns.dict.get(), n.line);
    ns.dict->set(n.attr, std::move(value));
    return;
  }
  if (n.targets.size() == 1) {
    assign(n.targets[0], std::move(value));
    return;
  }
  List items = iterate(value, n.line);
  if (items.size() != n.targets.size()) {
    template_fail(n.line, "cannot unpack {} values into {} names", items.size(), n.targets.size());
  }
  for (size_t i = 0; i < items.size(); ++i) assign(n.targets[i], std::move(items[i]));
}

Interpreter::Flow Interpreter::exec_for(const Node& n, std::string& out) {
  List items = iterate(eval(*n.expr), n.line);
  // Each iteration runs in a fresh scope, as in jinja2: a `set` in the body is gone by the next one.
  auto bind = [&](const Value& item) {
    if (n.targets.size() == 1) {
      assign(n.targets[0], item);
      return;
    }
    List parts = iterate(item, n.line);
    if (parts.size() != n.targets.size()) {
      template_fail(n.line, "cannot unpack {} values into {} loop variables", parts.size(), n.targets.size());
    }
    for (size_t i = 0; i < parts.size(); ++i) assign(n.targets[i], parts[i]);
  };
  if (n.cond) {
    List kept;
    for (const Value& item : items) {
      step(n.line);
      scopes_.emplace_back();
      bind(item);
      bool keep = truthy(eval(*n.cond));
      scopes_.pop_back();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t len = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < len; ++i) {
    step(n.line);
    scopes_.push_back(frame_scope(n.body_undefined));
    bind(items[static_cast<size_t>(i)]);
    auto loop = std::make_shared<Dict>();
    loop->set("index", Value::from(i + 1));
    loop->set("index0", Value::from(i));
    loop->set("revindex", Value::from(len - i));
    loop->set("revindex0", Value::from(len - i - 1));
    loop->set("first", Value::from(i == 0));
    loop->set("last", Value::from(i == len - 1));
    loop->set("length", Value::from(len));
    loop->set("depth", Value::from(int64_t{1}));
    loop->set("depth0", Value::from(int64_t{0}));
    loop->set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
    loop->set("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
    loop->set("cycle", Value::function("cycle", [i](Interpreter&, CallArgs& a) {
      if (a.args.empty()) template_fail(a.line, "no items for cycling given");
      return a.args[static_cast<size_t>(i) % a.args.size()];
    }));
    assign("loop", Value::from(std::move(loop)));
    Flow f = exec(n.body, out);
    scopes_.pop_back();
    if (f == Flow::Break) break;
  }
  if (len == 0) {
    scopes_.push_back(frame_scope(n.else_undefined));
    Flow f = exec(n.else_body, out);
    scopes_.pop_back();
    return f;
  }
  return Flow::Normal;
}

Value Interpreter::define_macro(const Node& n) {
  const Node* node = &n;
  return Value::function(n.kind == NodeKind::Macro ? n.text : "caller", [node](Interpreter& in, CallArgs& a) {
    if (++in.call_depth_ > in.options_.max_call_depth) {
      template_fail(a.line, "macro calls nested more than {} deep", in.options_.max_call_depth);
    }
    in.step(a.line);
    Scope scope = in.frame_scope(node->body_undefined);
    for (size_t i = 0; i < node->params.size(); ++i) {
      const Param& p = node->params[i];
      const Value* v = arg(a, i, p.name);
      if (v) {
        scope[p.name] = *v;
      } else if (p.default_value) {
        scope[p.name] = in.eval(*p.default_value);
      } else {
        scope[p.name] = Value::undefined("parameter '" + p.name + "' was not provided");
      }
    }
    List varargs;
    for (size_t i = node->params.size(); i < a.args.size(); ++i) varargs.push_back(a.args[i]);
    scope["varargs"] = Value::from(std::move(varargs), true);
    auto kwargs = std::make_shared<Dict>();
    for (const auto& [k, v] : a.kwargs) {
      bool is_param = false;
      for (const Param& p : node->params) is_param = is_param || p.name == k;
      if (k == "caller") {
        scope["caller"] = v;
      } else if (!is_param) {
        kwargs->set(k, v);
      }
    }
    scope["kwargs"] = Value::from(std::move(kwargs));
    size_t saved_floor = in.floor_;
    in.scopes_.push_back(std::move(scope));
    in.floor_ = in.scopes_.size() - 1;
    std::string out;
    try {
      in.exec(node->body, out);
    } catch (...) {
      in.scopes_.pop_back();
      in.floor_ = saved_floor;
      --in.call_depth_;
      throw;
    }
    in.scopes_.pop_back();
    in.floor_ = saved_floor;
    --in.call_depth_;
    return Value::from(std::move(out));
  });
}

CallArgs Interpreter::eval_args(const Expr& e, size_t first) {
  CallArgs a;
  a.line = e.line;
  for (size_t i = first; i < e.kids.size(); ++i) a.args.push_back(eval(*e.kids[i]));
  for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v));
  return a;
}

Value Interpreter::call(const Value& callee, CallArgs& args, int line) {
  if (callee.is_undefined()) undefined_fail(callee, line);
  if (callee.kind != Kind::Callable) template_fail(line, "'{}' object is not callable", type_name(callee));
  args.line = line;
  return callee.fn->fn(*this, args);
}

Value Interpreter::filter(const std::string& name, const Value& input, CallArgs& args, int line) {
  const FilterFn* f = find_filter(name);
  if (!f) template_fail(line, "no filter named '{}'", name);
  args.line = line;
  Value v = (*f)(*this, input, args);
  if (v.kind == Kind::String) check_size(v.str.size(), line);
  return v;
}

bool Interpreter::test(const std::string& name, const Value& input, CallArgs& args, int line) {
  const TestFn* t = find_test(name);
  if (!t) template_fail(line, "no test named '{}'", name);
  args.line = line;
  return (*t)(*this, input, args);
}

Value Interpreter::eval_call(const Expr& e) {
  Value callee = eval(*e.kids[0]);
  CallArgs a = eval_args(e, 1);
  step(e.line);
  return call(callee, a, e.line);
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.kids[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.kids[i + 1]);
    const std::string& op = e.ops[i];
    bool r;
    if (op == "==") {
      r = equals(left, right);
    } else if (op == "!=") {
      r = !equals(left, right);
    } else if (op == "in" || op == "notin") {
      r = contains(right, left, e.line) == (op == "in");
    } else {
      int c = compare(left, right, e.line);
      r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!r) return Value::from(false);
    left = std::move(right);
  }
  return Value::from(true);
}

Value Interpreter::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  Value a = eval(*e.kids[0]);
  if (op == "and") return truthy(a) ? eval(*e.kids[1]) : a;
  if (op == "or") return truthy(a) ? a : eval(*e.kids[1]);
  Value b = eval(*e.kids[1]);
  if (op == "~") {
    std::string s = to_str(a);
    std::string t = to_str(b);
    check_size(s.size() + t.size(), e.line);
    return Value::from(s + t);
  }
  return arithmetic(op, a, b, *this, e.line);
}

Value Interpreter::eval(const Expr& e) {
  DepthGuard guard(*this, e.line);
  switch (e.kind) {
    case ExprKind::Literal:
      return e.value;
    case ExprKind::Name:
      return lookup(e.name);
    case ExprKind::List: {
      List l;
      for (const auto& k : e.kids) l.push_back(eval(*k));
      return Value::from(std::move(l), e.tuple);
    }
    case ExprKind::Dict: {
      auto d = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
        Value k = eval(*e.kids[i]);
        if (k.kind != Kind::String) template_fail(e.line, "dict keys must be strings here, got '{}'", type_name(k));
        d->set(k.str, eval(*e.kids[i + 1]));
      }
      return Value::from(std::move(d));
    }
    case ExprKind::GetAttr: {
      Value obj = eval(*e.kids[0]);
      if (obj.is_undefined()) undefined_fail(obj, e.line);
      return get_attr(obj, e.name, e.line);
    }
    case ExprKind::GetItem: {
      Value obj = eval(*e.kids[0]);
      if (obj.is_undefined()) undefined_fail(obj, e.line);
      return get_item(obj, eval(*e.kids[1]), e.line);
    }
    case ExprKind::Slice: {
      Value obj = eval(*e.kids[0]);
      if (obj.is_undefined()) undefined_fail(obj, e.line);
      auto part = [&](size_t i) { return e.kids[i] ? eval(*e.kids[i]) : Value::none(); };
      return slice(obj, part(1), part(2), part(3), e.line);
    }
    case ExprKind::Call:
      return eval_call(e);
    case ExprKind::Filter: {
      Value input = eval(*e.kids[0]);
      CallArgs a = eval_args(e, 1);
      return filter(e.name, input, a, e.line);
    }
    case ExprKind::Test: {
      Value input = eval(*e.kids[0]);
      CallArgs a = eval_args(e, 1);
      return Value::from(test(e.name, input, a, e.line) != e.negated);
    }
    case ExprKind::Unary: {
      Value v = eval(*e.kids[0]);
      if (e.name == "not") return Value::from(!truthy(v));
      if (v.is_undefined()) undefined_fail(v, e.line);
      if (!v.is_number()) template_fail(e.line, "bad operand type for unary {}: '{}'", e.name, type_name(v));
      if (e.name == "+") return v.kind == Kind::Bool ? Value::from(to_int(v)) : v;
      if (v.kind == Kind::Float) return Value::from(-v.real);
      if (to_int(v) == INT64_MIN) template_fail(e.line, "integer overflow");
      return Value::from(-to_int(v));
    }
    case ExprKind::Binary:
      return eval_binary(e);
    case ExprKind::Compare:
      return eval_compare(e);
    case ExprKind::CondExpr:
      if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
      return e.kids[2] ? eval(*e.kids[2]) : Value::undefined("the condition was false and there is no else");
  }
  return Value::none();
}

}  // namespace tandem::chat
