// `tandem template`: renders a chat template for a list of messages and prints the prompt exactly
// (no newline added), so a user sees what the model is given. The template comes from a model folder
// (chat_template.jinja or tokenizer_config.json) or from --template FILE, which overrides the model's
// as the server's --chat-template-file will; bos/eos come from the model unless given.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>

#include "chat/chat_template.h"
#include "cli/command.h"
#include "core/error.h"

namespace tandem::cli {
namespace {

using nlohmann::ordered_json;

struct TemplateOptions {
  std::string model, template_file, messages, tools;
  bool add_generation_prompt = false;
  std::vector<std::string> vars;
  std::string bos_token, eos_token;
  bool bos_set = false, eos_set = false;
};

std::string read_input(const std::string& path) {
  if (path == "-") return std::string((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("{}: cannot read the file", path);
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

ordered_json read_json(const std::string& path) {
  ordered_json j = ordered_json::parse(read_input(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("{}: not valid JSON", path);
  return j;
}

int run_template(const TemplateOptions& o) {
  if (o.model.empty() && o.template_file.empty()) fail("give --model DIR or --template FILE");
  chat::ModelChatTemplate src;
  if (!o.model.empty()) {
    if (o.template_file.empty()) {
      src = chat::load_model_chat_template(o.model);
    } else {  // the tokens still come from the model folder
      try {
        src = chat::load_model_chat_template(o.model);
      } catch (const InputError&) {
      }
    }
  }
  if (!o.template_file.empty()) {
    src.source = read_input(o.template_file);
    src.origin = o.template_file;
  }
  if (o.bos_set) src.bos_token = o.bos_token;
  if (o.eos_set) src.eos_token = o.eos_token;

  ordered_json messages = read_json(o.messages);
  ordered_json tools;
  if (messages.is_object()) {  // {"messages": [...], "tools": [...]} (an /apply-template body) is fine too
    if (messages.contains("tools")) tools = messages["tools"];
    if (!messages.contains("messages")) fail("{}: expected a list of messages or an object with \"messages\"", o.messages);
    messages = ordered_json(messages["messages"]);
  }
  if (!o.tools.empty()) tools = read_json(o.tools);
  ordered_json extra = ordered_json::object();
  for (const std::string& kv : o.vars) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) fail("--var expects NAME=VALUE, got '{}'", kv);
    std::string value = kv.substr(eq + 1);
    ordered_json v = ordered_json::parse(value, nullptr, false);  // JSON (true, 3, "x", [..]) or else a string
    extra[kv.substr(0, eq)] = v.is_discarded() ? ordered_json(value) : v;
  }
  chat::ChatTemplate tmpl = chat::ChatTemplate::parse(src.source, src.origin);
  std::string prompt = chat::render_chat(tmpl, messages, tools, o.add_generation_prompt, extra, src.bos_token, src.eos_token);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

RunFn setup_template(CLI::App& app) {
  auto o = std::make_shared<TemplateOptions>();
  app.add_option("--model", o->model, "model folder: chat_template.jinja or tokenizer_config.json, and bos/eos");
  app.add_option("--template", o->template_file, "a Jinja chat template file (overrides the model's)");
  app.add_option("--messages", o->messages, "JSON file: a list of messages (or {\"messages\": [...], \"tools\": [...]}); - for stdin")
      ->required();
  app.add_option("--tools", o->tools, "JSON file: a list of tool definitions");
  app.add_flag("--add-generation-prompt", o->add_generation_prompt, "end with the assistant turn's opening");
  app.add_option("--var", o->vars, "NAME=VALUE: another template variable (VALUE as JSON, else a string)");
  app.add_option("--bos-token", o->bos_token, "bos_token (default: the model's)")->each([o](const std::string&) { o->bos_set = true; });
  app.add_option("--eos-token", o->eos_token, "eos_token (default: the model's)")->each([o](const std::string&) { o->eos_set = true; });
  return [o] { return run_template(*o); };
}

}  // namespace
}  // namespace tandem::cli

TANDEM_COMMAND(template_, "template", "Render a chat template for a list of messages and print the prompt",
               tandem::cli::setup_template);
