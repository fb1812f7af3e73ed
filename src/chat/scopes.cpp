// Frame analysis (see scopes.h), a transcription of the parts of jinja2's idtracking.py that decide
// how a frame's names start: a parameter, resolved from the template variables, undefined, or an
// alias of an enclosing frame's name. Only "undefined" needs acting on at run time: the other three
// are what looking a name up through the enclosing scopes gives anyway.
#include "chat/scopes.h"

#include <map>
#include <set>

namespace tandem::chat {
namespace {

enum class Load { Param, Resolve, Undefined, Alias };

struct Symbols {
  const Symbols* parent = nullptr;
  std::map<std::string, Load> refs;
  std::set<std::string> stores;

  bool find(const std::string& name) const { return refs.count(name) || (parent && parent->find(name)); }
  void load(const std::string& name) {
    if (!find(name)) refs[name] = Load::Resolve;
  }
  void store(const std::string& name) {
    stores.insert(name);
    if (refs.count(name)) return;
    refs[name] = parent && parent->find(name) ? Load::Alias : Load::Undefined;
  }
  void param(const std::string& name) {
    stores.insert(name);
    refs[name] = Load::Param;
  }
  // After an `if`: a name first assigned inside one of its branches starts as the template variable
  // (or the enclosing frame's name), not undefined, whichever branches assign it.
  void branch_update(const std::vector<const Symbols*>& branches) {
    std::set<std::string> fresh;
    for (const Symbols* b : branches) {
      for (const auto& t : b->stores) {
        if (!stores.count(t)) fresh.insert(t);
      }
    }
    for (const Symbols* b : branches) {
      for (const auto& [k, v] : b->refs) refs[k] = v;
      stores.insert(b->stores.begin(), b->stores.end());
    }
    for (const auto& name : fresh) refs[name] = parent && parent->find(name) ? Load::Alias : Load::Resolve;
  }
};

struct Child {
  const Body* body;
  std::vector<std::string>* out;
  std::vector<std::string> params;
};

class Analyzer {
 public:
  void frame(const Body& body, const Symbols* parent, const std::vector<std::string>& params,
             std::vector<std::string>* out) {
    Symbols sym;
    sym.parent = parent;
    for (const auto& p : params) sym.param(p);
    std::vector<Child> children;
    visit_body(body, sym, children);
    out->clear();
    for (const auto& [name, load] : sym.refs) {
      if (load == Load::Undefined) out->push_back(name);
    }
    for (const Child& c : children) frame(*c.body, &sym, c.params, c.out);
  }

 private:
  void expr(const Expr* e, Symbols& sym) {
    if (!e) return;
    if (e->kind == ExprKind::Name) sym.load(e->name);
    for (const auto& k : e->kids) expr(k.get(), sym);
    for (const auto& [k, v] : e->kwargs) expr(v.get(), sym);
  }

  void visit_body(const Body& body, Symbols& sym, std::vector<Child>& children) {
    for (const auto& n : body) visit(*n, sym, children);
  }

  // jinja2's If: test, body, the elif chain (each an If of its own), else.
  void visit_if(const Node& n, size_t k, Symbols& sym, std::vector<Child>& children) {
    expr(n.branches[k].first.get(), sym);
    Symbols body = sym, elifs = sym, orelse = sym;
    visit_body(n.branches[k].second, body, children);
    if (k == 0) {
      for (size_t j = 1; j < n.branches.size(); ++j) visit_if(n, j, elifs, children);
      visit_body(n.else_body, orelse, children);
    }
    sym.branch_update({&body, &elifs, &orelse});
  }

  void store_target(const Node& n, Symbols& sym) {
    if (!n.attr.empty()) {
      sym.load(n.text);  // ns.attr = ...: reads ns
    } else {
      for (const auto& t : n.targets) sym.store(t);
    }
  }

  void visit(Node& n, Symbols& sym, std::vector<Child>& children) {
    switch (n.kind) {
      case NodeKind::Text:
      case NodeKind::Break:
      case NodeKind::Continue:
        break;
      case NodeKind::Output:
        expr(n.expr.get(), sym);
        break;
      case NodeKind::If:
        visit_if(n, 0, sym, children);
        break;
      case NodeKind::For: {
        expr(n.expr.get(), sym);
        std::vector<std::string> params = n.targets;
        params.push_back("loop");
        children.push_back({&n.body, &n.body_undefined, std::move(params)});
        children.push_back({&n.else_body, &n.else_undefined, {}});
        break;
      }
      case NodeKind::Set:
        expr(n.expr.get(), sym);
        store_target(n, sym);
        break;
      case NodeKind::SetBlock:
        for (const auto& f : n.filters) expr(f.get(), sym);
        children.push_back({&n.body, &n.body_undefined, {}});
        store_target(n, sym);
        break;
      case NodeKind::Macro:
      case NodeKind::CallBlock: {
        if (n.kind == NodeKind::Macro) {
          sym.store(n.text);
        } else {
          expr(n.expr.get(), sym);
        }
        std::vector<std::string> params = {"varargs", "kwargs", "caller"};
        for (const auto& p : n.params) params.push_back(p.name);
        children.push_back({&n.body, &n.body_undefined, std::move(params)});
        break;
      }
      case NodeKind::With: {
        std::vector<std::string> params;
        for (const auto& [name, e] : n.assigns) {
          expr(e.get(), sym);
          params.push_back(name);
        }
        children.push_back({&n.body, &n.body_undefined, std::move(params)});
        break;
      }
      case NodeKind::FilterBlock:
        for (const auto& f : n.filters) expr(f.get(), sym);
        children.push_back({&n.body, &n.body_undefined, {}});
        break;
      case NodeKind::Scope:
        for (const auto& c : n.body) visit(*c, sym, children);
        break;
    }
  }
};

}  // namespace

void resolve_scopes(Template& tmpl) { Analyzer().frame(tmpl.body, nullptr, {}, &tmpl.body_undefined); }

}  // namespace tandem::chat
