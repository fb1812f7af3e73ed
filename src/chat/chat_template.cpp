// Chat template API (see chat_template.h): parse once, render per request, find a model's template.
#include "chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/parser.h"

namespace tandem::chat {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot read the file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string special_token(const nlohmann::ordered_json& config, const char* key, const std::string& origin) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  fail("{}: '{}' must be a string or an object with a string 'content'", origin, key);
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string source, std::string origin) {
  ChatTemplate t;
  try {
    t.tree_ = std::make_shared<const Template>(parse_template(source));
  } catch (const ChatTemplateError& e) {
    throw ChatTemplateError(e.message(), e.line(), false, origin);
  }
  t.source_ = std::move(source);
  t.origin_ = std::move(origin);
  return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& vars, const RenderOptions& options) const {
  if (!vars.is_object()) fail("chat template variables must be a JSON object");
  Value v = from_json(vars);
  Interpreter in(options);
  try {
    return in.render(*tree_, *v.dict);
  } catch (const ChatTemplateError& e) {
    throw ChatTemplateError(e.message(), e.line(), e.raised(), origin_);
  }
}

std::string render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                        const nlohmann::ordered_json& extra, const std::string& bos_token,
                        const std::string& eos_token, const RenderOptions& options) {
  if (!messages.is_array()) fail("messages must be a JSON list");
  if (!tools.is_null() && !tools.is_array()) fail("tools must be a JSON list");
  if (!extra.is_null() && !extra.is_object()) fail("extra template variables must be a JSON object");
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = messages;
  vars["tools"] = tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  vars["bos_token"] = bos_token;
  vars["eos_token"] = eos_token;
  if (extra.is_object()) {
    for (const auto& [k, v] : extra.items()) {
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") {
        fail("extra template variable '{}' would replace the request's own", k);
      }
      vars[k] = v;
    }
  }
  return tmpl.render(vars, options);
}

std::string select_chat_template(const nlohmann::ordered_json& field, const std::string& origin) {
  if (field.is_string()) return field.get<std::string>();
  if (!field.is_array()) fail("{}: 'chat_template' must be a string or a list of {{name, template}}", origin);
  std::string names;
  for (const auto& entry : field) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
        !entry["template"].is_string()) {
      fail("{}: each 'chat_template' entry must be {{\"name\": string, \"template\": string}}", origin);
    }
    if (entry["name"] == "default") return entry["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
  }
  fail("{}: 'chat_template' has no template named \"default\" (it has: {})", origin, names.empty() ? "none" : names);
}

void override_chat_template(ModelChatTemplate& t, const std::string& path, const std::string& flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{} {}: cannot read the file", flag, path);
  std::stringstream ss;
  ss << f.rdbuf();
  t.source = ss.str();
  t.origin = path;
}

ModelChatTemplate load_model_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  ModelChatTemplate m;
  std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (fs::exists(config_path)) {
    config = nlohmann::ordered_json::parse(read_text(config_path), nullptr, false);
    if (config.is_discarded() || !config.is_object()) fail("{}: not a JSON object", config_path);
    m.bos_token = special_token(config, "bos_token", config_path);
    m.eos_token = special_token(config, "eos_token", config_path);
  }
  std::string jinja_path = (fs::path(model_dir) / "chat_template.jinja").string();
  if (fs::exists(jinja_path)) {
    m.source = read_text(jinja_path);
    m.origin = jinja_path;
    return m;
  }
  if (!fs::exists(config_path)) fail("{}: no chat_template.jinja or tokenizer_config.json", model_dir);
  if (!config.contains("chat_template")) fail("{}: has no 'chat_template' (pass a template file instead)", config_path);
  m.source = select_chat_template(config["chat_template"], config_path);
  m.origin = config_path;
  return m;
}

}  // namespace tandem::chat
