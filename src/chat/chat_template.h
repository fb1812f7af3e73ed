// Chat templates: a model's Jinja `chat_template` parsed once, then rendered per request exactly as
// Hugging Face transformers renders it (jinja2 with trim_blocks, lstrip_blocks, loop controls, its
// tojson, raise_exception and strftime_now). The interpreter is our own (src/chat/*); docs/chat_templates.md
// lists what it covers. A ChatTemplate is immutable: one instance renders on many threads at once.
// Every failure (bad template, bad input, the template's own raise_exception) throws ChatTemplateError.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "chat/interpreter.h"
#include "chat/value.h"

namespace tandem::chat {

class ChatTemplate {
 public:
  // Parses `source` (throws ChatTemplateError with the line of a syntax error). `origin` names where
  // it came from in error messages (a file, "tokenizer_config.json").
  static ChatTemplate parse(std::string source, std::string origin = "chat template");

  // Renders with `vars` (a JSON object: the template's variables).
  std::string render(const nlohmann::ordered_json& vars, const RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }

 private:
  std::string source_, origin_;
  std::shared_ptr<const Template> tree_;
};

// The prompt for a chat request, with the variables transformers' apply_chat_template passes:
// messages, tools (None when absent or null), documents (None), add_generation_prompt, bos_token,
// eos_token, then every key of `extra` (e.g. enable_thinking); extra may not redefine the first four.
// JSON objects must come as ordered_json: key order shows in the output (tojson, dict.items()).
std::string render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra, const std::string& bos_token,
                        const std::string& eos_token, const RenderOptions& options = {});

// A model folder's chat template and special tokens, as transformers finds them: chat_template.jinja
// when present, else tokenizer_config.json's `chat_template` (a string, or a list of {name, template}
// of which "default" is taken). bos/eos come from tokenizer_config.json (a string or {"content": ...};
// empty when absent). A server's --chat-template-file replaces `source` and keeps the tokens.
struct ModelChatTemplate {
  std::string source;
  std::string origin;  // the file it came from
  std::string bos_token, eos_token;
};
ModelChatTemplate load_model_chat_template(const std::string& model_dir);
// Replaces `t`'s template with the file at `path` (a --chat-template-file), keeping its bos/eos; an
// InputError naming `flag` and the file when it cannot be read.
void override_chat_template(ModelChatTemplate& t, const std::string& path, const std::string& flag);

// The `chat_template` field of a tokenizer_config.json: a string, or [{name, template}, ...] → "default".
std::string select_chat_template(const nlohmann::ordered_json& field, const std::string& origin);

}  // namespace tandem::chat
