// Which names start out undefined in each frame, as jinja2's compiler decides (idtracking.py): a
// frame is the template's top level, a for loop's body (each iteration) or else branch, a macro or
// call body, a with, set or filter block. A name the frame assigns before it reads it, and that no
// enclosing frame knows, starts undefined there, hiding a template variable of the same name from the
// frame and from frames nested in it: `{% for m in x %}{{ y }}{% endfor %}{% set y = 1 %}` prints
// nothing even when y is passed in. A name first assigned inside an `if` keeps the passed-in value
// until assigned, as in jinja2 3.1.
#pragma once

#include "chat/ast.h"

namespace tandem::chat {

// Fills every Node's body_undefined / else_undefined and tmpl.body_undefined.
void resolve_scopes(Template& tmpl);

}  // namespace tandem::chat
