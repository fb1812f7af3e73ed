// Tokens → the template's tree (ast.h), with jinja2's grammar and operator precedence. Throws
// ChatTemplateError with the line for a syntax error, an unclosed block, a misplaced end tag, or a
// filter or test that does not exist (as jinja2 does when compiling: only inside an `if` or a
// conditional expression does that wait until the filter is actually evaluated).
#pragma once

#include <string_view>

#include "chat/ast.h"

namespace tandem::chat {

Template parse_template(std::string_view source);  // with its frames resolved (scopes.h)

}  // namespace tandem::chat
