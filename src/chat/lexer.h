// Template source → tokens, with the whitespace rules of the environment transformers renders chat
// templates in: trim_blocks (the newline after a block or comment tag goes), lstrip_blocks (spaces and
// tabs before a block or comment tag at the start of a line go), `-` strips all whitespace on its
// side, `+` turns either rule off, one trailing newline of the source goes, and \r\n / \r in text
// become \n. Comments vanish; {% raw %}...{% endraw %} becomes text. Throws ChatTemplateError.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::chat {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // Text: the data; Name; String: the decoded value; Op: the operator
  int64_t integer = 0;
  double real = 0;
  int line = 1;
};

std::vector<Token> lex(std::string_view source);

const char* token_desc(Tok t);  // "end of print statement", "name", ...

}  // namespace tandem::chat
