// The chat template parser (see parser.h): recursive descent mirroring jinja2's parser.py, so that
// precedence matches (filters and `is` tests bind tightest, then ** * / // %, ~, + -, comparisons,
// not, and, or, `x if c else y`). Nesting is bounded so that hostile input cannot exhaust the stack.
#include "chat/parser.h"

#include <algorithm>
#include <initializer_list>

#include "chat/builtins.h"
#include "chat/lexer.h"
#include "chat/scopes.h"

namespace tandem::chat {
namespace {

constexpr int kMaxDepth = 200;   // nested expressions and blocks, as the parser recurses
constexpr int kMaxHeight = 256;  // an expression tree's height (a+b+c... and a.b.c... chains loop, not recurse)

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Template run() {
    Template t;
    t.body = parse_body({}, nullptr, "");
    check_names(t.body, false);
    resolve_scopes(t);
    return t;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loops_ = 0;  // enclosing for loops (break/continue need one)

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > kMaxDepth) template_fail(line, "template nested too deeply (more than {} levels)", kMaxDepth);
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[p_]; }
  const Token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  bool is_op(std::string_view op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  std::string describe(const Token& t) const {
    if (t.type == Tok::Op || t.type == Tok::Name) return "'" + t.text + "'";
    return token_desc(t.type);
  }
  [[noreturn]] void unexpected(std::string_view expected) const {
    template_fail(cur().line, "expected {}, got {}", expected, describe(cur()));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) unexpected("end of statement block ('%}')");
    next();
  }

  // Sets e's height from its kids; fails past kMaxHeight (evaluating and freeing the tree recurse).
  static ExprPtr grown(ExprPtr e) {
    int h = 0;
    for (const auto& k : e->kids) h = std::max(h, k ? k->height : 0);
    for (const auto& [name, v] : e->kwargs) h = std::max(h, v->height);
    e->height = h + 1;
    if (e->height > kMaxHeight) template_fail(e->line, "expression nested too deeply (more than {} levels)", kMaxHeight);
    return e;
  }

  static ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- statements ----

  // Nodes until a block tag whose name is in `ends` (consumed: its name goes to *found; the caller
  // reads the rest of that tag) or the end of the template (only allowed when ends is empty).
  Body parse_body(std::initializer_list<std::string_view> ends, std::string* found, std::string_view opener,
                  int open_line = 0) {
    Body body;
    for (;;) {
      const Token& tok = cur();
      switch (tok.type) {
        case Tok::Text: {
          auto n = std::make_unique<Node>();
          n->kind = NodeKind::Text;
          n->line = tok.line;
          n->text = tok.text;
          body.push_back(std::move(n));
          next();
          break;
        }
        case Tok::VarBegin: {
          auto n = std::make_unique<Node>();
          n->kind = NodeKind::Output;
          n->line = tok.line;
          next();
          n->expr = parse_tuple(true, {});
          if (cur().type != Tok::VarEnd) unexpected("end of print statement ('}}')");
          next();
          body.push_back(std::move(n));
          break;
        }
        case Tok::BlockBegin: {
          next();
          if (cur().type != Tok::Name) unexpected("a statement name");
          std::string name = cur().text;
          if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
            next();
            *found = name;
            return body;
          }
          body.push_back(parse_statement(opener, open_line));
          break;
        }
        case Tok::Eof:
          if (ends.size() == 0) return body;
          template_fail(tok.line, "unexpected end of template: the '{}' block opened at line {} is never closed "
                        "(expected '{}')", opener, open_line, *ends.begin() == "else" || *ends.begin() == "elif"
                        ? *(ends.end() - 1) : *ends.begin());
        default:
          template_fail(tok.line, "unexpected {}", describe(tok));
      }
    }
  }

  NodePtr parse_statement(std::string_view opener, int open_line) {
    const Token& tok = cur();
    int line = tok.line;
    DepthGuard guard(*this, line);
    std::string name = tok.text;
    next();
    auto n = std::make_unique<Node>();
    n->line = line;
    if (name == "if") {
      n->kind = NodeKind::If;
      std::string found = "elif";
      while (found == "elif") {
        ExprPtr test = parse_tuple(false, {});
        expect_block_end();
        Body b = parse_body({"elif", "else", "endif"}, &found, "if", line);
        n->branches.emplace_back(std::move(test), std::move(b));
      }
      if (found == "else") {
        expect_block_end();
        n->else_body = parse_body({"endif"}, &found, "if", line);
      }
      expect_block_end();
    } else if (name == "for") {
      n->kind = NodeKind::For;
      n->targets = parse_targets();
      if (!skip_name("in")) unexpected("'in'");
      n->expr = parse_tuple(false, {"if", "recursive"});
      if (skip_name("if")) n->cond = parse_expression(true);
      if (is_name("recursive")) template_fail(cur().line, "recursive for loops are not supported");
      expect_block_end();
      std::string found;
      ++loops_;
      n->body = parse_body({"else", "endfor"}, &found, "for", line);
      --loops_;
      if (found == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"}, &found, "for", line);
      }
      expect_block_end();
    } else if (name == "set") {
      if (cur().type == Tok::Name && t_[p_ + 1].type == Tok::Op && t_[p_ + 1].text == ".") {
        n->text = next().text;
        next();
        n->attr = expect_name();
      } else {
        n->targets = parse_targets();
      }
      if (skip_op("=")) {
        n->kind = NodeKind::Set;
        n->expr = parse_tuple(true, {});
        expect_block_end();
      } else {
        n->kind = NodeKind::SetBlock;
        if (n->targets.size() > 1) unexpected("'='");
        parse_block_filters(n->filters);
        expect_block_end();
        std::string found;
        n->body = parse_body({"endset"}, &found, "set", line);
        expect_block_end();
      }
    } else if (name == "macro") {
      n->kind = NodeKind::Macro;
      n->text = expect_name();
      parse_params(n->params);
      expect_block_end();
      std::string found;
      int loops = loops_;
      loops_ = 0;
      n->body = parse_body({"endmacro"}, &found, "macro", line);
      loops_ = loops;
      expect_block_end();
    } else if (name == "call") {
      n->kind = NodeKind::CallBlock;
      if (is_op("(")) parse_params(n->params);
      n->expr = parse_expression(true);
      if (n->expr->kind != ExprKind::Call) template_fail(line, "expected a call after 'call'");
      expect_block_end();
      std::string found;
      int loops = loops_;
      loops_ = 0;
      n->body = parse_body({"endcall"}, &found, "call", line);
      loops_ = loops;
      expect_block_end();
    } else if (name == "with") {
      n->kind = NodeKind::With;
      while (cur().type != Tok::BlockEnd) {
        if (!n->assigns.empty()) expect_op(",");
        std::string target = expect_name();
        expect_op("=");
        n->assigns.emplace_back(std::move(target), parse_expression(true));
      }
      next();
      std::string found;
      n->body = parse_body({"endwith"}, &found, "with", line);
      expect_block_end();
    } else if (name == "filter") {
      n->kind = NodeKind::FilterBlock;
      parse_block_filters(n->filters, true);
      expect_block_end();
      std::string found;
      n->body = parse_body({"endfilter"}, &found, "filter", line);
      expect_block_end();
    } else if (name == "generation") {  // transformers' assistant-mask marker: renders its body as is
      n->kind = NodeKind::Scope;
      expect_block_end();
      std::string found;
      n->body = parse_body({"endgeneration"}, &found, "generation", line);
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      if (loops_ == 0) template_fail(line, "'{}' outside of a for loop", name);
      n->kind = name == "break" ? NodeKind::Break : NodeKind::Continue;
      expect_block_end();
    } else if (name.starts_with("end") || name == "else" || name == "elif") {
      if (opener.empty()) template_fail(line, "unexpected '{}': no block is open", name);
      template_fail(line, "unexpected '{}' inside the '{}' block opened at line {}", name, opener, open_line);
    } else {
      template_fail(line, "unknown or unsupported tag '{}'", name);
    }
    return n;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    do {
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  void parse_params(std::vector<Param>& params) {
    expect_op("(");
    while (!skip_op(")")) {
      if (!params.empty()) expect_op(",");
      if (skip_op(")")) break;
      Param param;
      param.name = expect_name();
      if (skip_op("=")) param.default_value = parse_expression(true);
      params.push_back(std::move(param));
    }
  }

  void parse_block_filters(std::vector<ExprPtr>& filters, bool required = false) {
    if (required) {
      filters.push_back(parse_filter(nullptr));
    }
    while (is_op("|")) {
      next();
      filters.push_back(parse_filter(nullptr));
    }
  }

  // ---- expressions ----

  bool tuple_end(std::initializer_list<std::string_view> extra) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof) return true;
    if (is_op(")")) return true;
    return cur().type == Tok::Name && std::find(extra.begin(), extra.end(), cur().text) != extra.end();
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> extra, bool parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!parens) unexpected("an expression");
    }
    auto e = make(ExprKind::List, line);
    e->kids = std::move(items);
    e->tuple = true;
    return grown(std::move(e));
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this, cur().line);
    ExprPtr body = parse_or();
    while (is_name("if")) {
      int line = next().line;
      auto e = make(ExprKind::CondExpr, line);
      e->kids.push_back(parse_or());
      e->kids.push_back(std::move(body));
      e->kids.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      body = grown(std::move(e));
    }
    return body;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(ExprKind::Binary, line);
    e->name = std::move(op);
    e->kids.push_back(std::move(l));
    e->kids.push_back(std::move(r));
    return grown(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      int line = next().line;
      l = binary("or", std::move(l), parse_and(), line);
    }
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      int line = next().line;
      l = binary("and", std::move(l), parse_not(), line);
    }
    return l;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      int line = next().line;
      DepthGuard guard(*this, line);
      auto e = make(ExprKind::Unary, line);
      e->name = "not";
      e->kids.push_back(parse_not());
      return grown(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    auto e = make(ExprKind::Compare, line);
    e->kids.push_back(std::move(first));
    for (;;) {
      static const char* kOps[] = {"==", "!=", "<", "<=", ">", ">="};
      const char* op = nullptr;
      for (const char* o : kOps) {
        if (is_op(o)) op = o;
      }
      if (op) {
        next();
        e->ops.push_back(op);
      } else if (skip_name("in")) {
        e->ops.push_back("in");
      } else if (is_name("not") && t_[p_ + 1].type == Tok::Name && t_[p_ + 1].text == "in") {
        next();
        next();
        e->ops.push_back("notin");
      } else {
        break;
      }
      e->kids.push_back(parse_math1());
    }
    if (e->ops.empty()) return std::move(e->kids[0]);
    return grown(std::move(e));
  }

  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = next().line;
      l = binary(op, std::move(l), parse_concat(), line);
    }
    return l;
  }

  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      int line = next().line;
      l = binary("~", std::move(l), parse_math2(), line);
    }
    return l;
  }

  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = next().line;
      l = binary(op, std::move(l), parse_pow(), line);
    }
    return l;
  }

  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      int line = next().line;
      l = binary("**", std::move(l), parse_unary(true), line);
    }
    return l;
  }

  ExprPtr parse_unary(bool with_filter) {
    int line = cur().line;
    DepthGuard guard(*this, line);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto e = make(ExprKind::Unary, line);
      e->name = next().text;
      e->kids.push_back(parse_unary(false));
      node = grown(std::move(e));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tok = cur();
    int line = tok.line;
    if (tok.type == Tok::Name) {
      auto e = make(ExprKind::Literal, line);
      const std::string& n = tok.text;
      if (n == "true" || n == "True") {
        e->value = Value::from(true);
      } else if (n == "false" || n == "False") {
        e->value = Value::from(false);
      } else if (n == "none" || n == "None") {
        e->value = Value::none();
      } else {
        e->kind = ExprKind::Name;
        e->name = n;
      }
      next();
      return e;
    }
    if (tok.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;
      auto e = make(ExprKind::Literal, line);
      e->value = Value::from(std::move(s));
      return e;
    }
    if (tok.type == Tok::Int || tok.type == Tok::Float) {
      auto e = make(ExprKind::Literal, line);
      e->value = tok.type == Tok::Int ? Value::from(tok.integer) : Value::from(tok.real);
      next();
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make(ExprKind::List, line);
      while (!skip_op("]")) {
        if (!e->kids.empty()) expect_op(",");
        if (skip_op("]")) break;
        e->kids.push_back(parse_expression(true));
      }
      return grown(std::move(e));
    }
    if (skip_op("{")) {
      auto e = make(ExprKind::Dict, line);
      while (!skip_op("}")) {
        if (!e->kids.empty()) expect_op(",");
        if (skip_op("}")) break;
        e->kids.push_back(parse_expression(true));
        expect_op(":");
        e->kids.push_back(parse_expression(true));
      }
      return grown(std::move(e));
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == Tok::Int) {
          auto e = make(ExprKind::GetItem, line);
          auto key = make(ExprKind::Literal, line);
          key->value = Value::from(next().integer);
          e->kids.push_back(std::move(node));
          e->kids.push_back(std::move(key));
          node = grown(std::move(e));
          continue;
        }
        auto e = make(ExprKind::GetAttr, line);
        e->name = expect_name();
        e->kids.push_back(std::move(node));
        node = grown(std::move(e));
      } else if (skip_op("[")) {
        node = parse_subscript(std::move(node), line);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node, int line) {
    std::vector<ExprPtr> parts;  // up to 3 slice parts, or one index
    bool is_slice = false;
    auto part = [&]() -> ExprPtr {
      if (is_op(":") || is_op("]") || is_op(",")) return nullptr;
      return parse_expression(true);
    };
    parts.push_back(part());
    while (skip_op(":")) {
      is_slice = true;
      if (parts.size() == 3) unexpected("']'");
      parts.push_back(part());
    }
    if (!is_slice && !parts[0]) unexpected("an expression");
    if (!is_slice && is_op(",")) {  // x[a, b]: a tuple key (no dict here has one: Undefined)
      auto key = make(ExprKind::List, line);
      key->tuple = true;
      key->kids.push_back(std::move(parts[0]));
      while (skip_op(",")) {
        if (is_op("]")) break;
        key->kids.push_back(parse_expression(true));
      }
      parts[0] = grown(std::move(key));
    }
    expect_op("]");
    auto e = make(is_slice ? ExprKind::Slice : ExprKind::GetItem, line);
    e->kids.push_back(std::move(node));
    for (auto& p : parts) e->kids.push_back(std::move(p));
    while (is_slice && e->kids.size() < 4) e->kids.push_back(nullptr);
    return grown(std::move(e));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (is_op("*") || is_op("**")) template_fail(cur().line, "*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && t_[p_ + 1].type == Tok::Op && t_[p_ + 1].text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) template_fail(cur().line, "positional argument after a keyword argument");
        e.kids.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(ExprKind::Call, cur().line);
    e->kids.push_back(std::move(callee));
    parse_call_args(*e);
    return grown(std::move(e));
  }

  ExprPtr parse_filter(ExprPtr input) {  // after the `|`
    auto e = make(ExprKind::Filter, cur().line);
    e->name = expect_name();
    while (skip_op(".")) e->name.append(1, '.').append(expect_name());
    e->kids.push_back(std::move(input));
    if (is_op("(")) parse_call_args(*e);
    e->known = find_filter(e->name) != nullptr;
    return grown(std::move(e));
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    for (;;) {
      if (skip_op("|")) {
        node = parse_filter(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr node) {
    int line = next().line;  // `is`
    auto e = make(ExprKind::Test, line);
    e->negated = skip_name("not");
    e->name = expect_name();
    while (skip_op(".")) e->name.append(1, '.').append(expect_name());
    e->kids.push_back(std::move(node));
    const Token& c = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) template_fail(c.line, "you cannot chain multiple tests with 'is'");
      e->kids.push_back(parse_postfix(parse_primary()));
    }
    e->known = find_test(e->name) != nullptr;
    return grown(std::move(e));
  }

  // ---- names: an unknown filter or test fails here, unless inside an `if` or `x if c else y` ----

  void check_expr(const Expr* e, bool soft) {
    if (!e) return;
    if (e->kind == ExprKind::CondExpr) soft = true;
    if ((e->kind == ExprKind::Filter || e->kind == ExprKind::Test) && !e->known && !soft) {
      template_fail(e->line, "no {} named '{}'", e->kind == ExprKind::Filter ? "filter" : "test", e->name);
    }
    for (const auto& k : e->kids) check_expr(k.get(), soft);
    for (const auto& [k, v] : e->kwargs) check_expr(v.get(), soft);
  }

  void check_names(const Body& body, bool soft) {
    for (const auto& n : body) {
      bool inner_soft = soft;
      switch (n->kind) {
        case NodeKind::If:
          inner_soft = true;
          break;
        case NodeKind::For:
        case NodeKind::Macro:
        case NodeKind::CallBlock:
        case NodeKind::With:
        case NodeKind::SetBlock:
        case NodeKind::FilterBlock:
          inner_soft = false;
          break;
        case NodeKind::Text:
        case NodeKind::Output:
        case NodeKind::Set:
        case NodeKind::Break:
        case NodeKind::Continue:
        case NodeKind::Scope:
          break;
      }
      bool here = n->kind == NodeKind::If ? true : soft;
      check_expr(n->expr.get(), here);
      check_expr(n->cond.get(), inner_soft);
      for (const auto& f : n->filters) check_expr(f.get(), soft);
      for (const auto& p : n->params) check_expr(p.default_value.get(), soft);
      for (const auto& [name, v] : n->assigns) check_expr(v.get(), soft);
      for (const auto& [test, b] : n->branches) {
        check_expr(test.get(), true);
        check_names(b, true);
      }
      check_names(n->body, inner_soft);
      check_names(n->else_body, n->kind == NodeKind::If ? true : inner_soft);
    }
  }
};

}  // namespace

Template parse_template(std::string_view source) { return Parser(lex(source)).run(); }

}  // namespace tandem::chat
