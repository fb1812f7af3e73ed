// The parsed form of a chat template: expressions and statements as plain tagged structs (one struct
// per family, the fields a kind does not use left empty). Built once by the parser, read-only after;
// a rendered template never changes its tree, so one ChatTemplate renders on many threads at once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace tandem::chat {

enum class ExprKind {
  Literal,    // value
  Name,       // name
  List,       // kids (tuple: a tuple)
  Dict,       // kids: key, value, key, value...
  GetAttr,    // kids[0].name
  GetItem,    // kids[0][kids[1]]
  Slice,      // kids[0][kids[1]:kids[2]:kids[3]] (null kid: omitted)
  Call,       // kids[0](kids[1..], kwargs)
  Filter,     // kids[0] | name(kids[1..], kwargs)
  Test,       // kids[0] is [not] name(kids[1..], kwargs)
  Unary,      // name: "-", "+", "not"
  Binary,     // name: + - * / // % ** ~ and or
  Compare,    // kids[0] ops[0] kids[1] ops[1] kids[2]... (== != < <= > >= in notin)
  CondExpr,   // kids[1] if kids[0] else kids[2] (kids[2] null: undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::Literal;
  int line = 0;
  Value value;                      // Literal
  std::string name;                 // Name, GetAttr, Filter, Test, Unary, Binary
  std::vector<ExprPtr> kids;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call, Filter, Test
  std::vector<std::string> ops;     // Compare
  bool tuple = false;               // List
  bool negated = false;             // Test: `is not`
  bool known = true;                // Filter, Test: the name exists (an unknown one fails when evaluated)
  int height = 1;                   // 1 + the tallest kid: bounded by the parser (evaluation recurses)
};

enum class NodeKind { Text, Output, If, For, Set, SetBlock, Macro, CallBlock, With, FilterBlock, Break, Continue, Scope };

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Node {
  NodeKind kind = NodeKind::Text;
  int line = 0;
  std::string text;                        // Text; Macro: its name; Set/SetBlock: `ns` of `ns.attr`
  std::string attr;                        // Set/SetBlock: `attr` of `ns.attr`
  ExprPtr expr;                            // Output, For (iterable), Set (value), CallBlock (the call)
  ExprPtr cond;                            // For: the `if` filter
  std::vector<std::string> targets;        // For, Set, SetBlock: names (more than one: unpacking)
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (test, body), elif...
  Body body, else_body;                    // If: else_body is the else branch; For: the else branch
  std::vector<Param> params;               // Macro, CallBlock (the caller's)
  std::vector<std::pair<std::string, ExprPtr>> assigns;  // With
  std::vector<ExprPtr> filters;            // SetBlock, FilterBlock: Filter exprs with a null input
  // Names that start out undefined in the frame `body` opens (and `else_body`, for a For): see scopes.h.
  std::vector<std::string> body_undefined, else_undefined;
};

struct Template {
  Body body;
  std::vector<std::string> body_undefined;  // the root frame's (scopes.h)
};

}  // namespace tandem::chat
