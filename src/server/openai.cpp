// OpenAI request checking and error shapes (see openai.h).
#include "server/openai.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <random>

#include "server/text_stream.h"

namespace tandem::server {

ApiError::ApiError(int status, std::string message, std::string param, std::string type, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), type_(std::move(type)),
      code_(std::move(code)) {}

ordered_json error_object(int status, const std::string& message, const std::string& param, const std::string& type,
                          const std::string& code) {
  // The type and code a status gets when the caller names none.
  struct Default {
    int status;
    const char* type;
    const char* code;
  };
  static constexpr Default kDefaults[] = {
      {401, "authentication_error", "invalid_api_key"},   {404, "not_found_error", "not_found"},
      {413, "invalid_request_error", "request_too_large"}, {429, "rate_limit_error", "queue_full"},
      {503, "service_unavailable_error", "lane_unavailable"},
  };
  std::string t = type, c = code;
  const Default* d = nullptr;
  for (const Default& x : kDefaults)
    if (x.status == status) d = &x;
  if (t.empty()) t = d ? d->type : status >= 500 ? "server_error" : "invalid_request_error";
  if (c.empty()) c = d ? d->code : std::to_string(status);
  ordered_json e;
  e["message"] = message;
  e["type"] = t;
  e["param"] = param.empty() ? ordered_json(nullptr) : ordered_json(param);
  e["code"] = c;
  return e;
}

std::string error_body(const ApiError& e) {
  ordered_json j;
  j["error"] = error_object(e.status(), e.what(), e.param(), e.type(), e.code());
  return j.dump();
}

ordered_json parse_body(const std::string& body) {
  // nlohmann's parser lets ill-formed UTF-8 through inside strings (dump() throws on it later), so the
  // whole body is checked first: JSON text is UTF-8 (RFC 8259).
  if (!valid_utf8(body)) throw ApiError(400, "the request body is not valid UTF-8");
  try {
    ordered_json j = ordered_json::parse(body);
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return j;
  } catch (const nlohmann::json::parse_error& e) {
    throw ApiError(400, fmt::format("the request body is not valid JSON (or not UTF-8): {}", e.what()));
  }
}

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw ApiError(400, fmt::format("'{}': {}", field, why), field);
}

// The field when present and not null.
const ordered_json* field(const ordered_json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> get_bool(const ordered_json& body, const char* key) {
  const ordered_json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(key, "expected true or false");
  return v->get<bool>();
}

std::optional<int64_t> get_int(const ordered_json& body, const char* key, int64_t lo, int64_t hi) {
  const ordered_json* v = field(body, key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      bad(key, fmt::format("must be in [{}, {}]", lo, hi));
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) && std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    x = int64_t(v->get<double>());
  } else {
    bad(key, "expected an integer");
  }
  if (x < lo || x > hi) bad(key, fmt::format("{} is out of range: give a value in [{}, {}]", x, lo, hi));
  return x;
}

std::optional<double> get_number(const ordered_json& body, const char* key, double lo, double hi) {
  const ordered_json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(key, "expected a number");
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(key, fmt::format("{} is out of range: give a value in [{}, {}]", x, lo, hi));
  return x;
}

std::optional<std::string> get_string(const ordered_json& body, const char* key) {
  const ordered_json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(key, "expected a string");
  return v->get<std::string>();
}

// Fields both endpoints share.
void parse_common(const ordered_json& body, ParsedRequest& r) {
  r.model = get_string(body, "model").value_or("");
  r.stream = get_bool(body, "stream").value_or(false);
  if (const ordered_json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "expected an object");
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
    if (!r.stream) bad("stream_options", "only allowed with \"stream\": true");
  }
  constexpr int64_t kMaxInt = int64_t(1) << 40;
  if (auto n = get_int(body, "n", std::numeric_limits<int64_t>::min(), kMaxInt); n && *n != 1)
    bad("n", "this server returns one choice: give 1 or leave it out");
  if (auto n = get_int(body, "best_of", std::numeric_limits<int64_t>::min(), kMaxInt); n && *n != 1)
    bad("best_of", "not supported: give 1 or leave it out");
  for (const char* k : {"presence_penalty", "frequency_penalty", "repetition_penalty"})
    if (auto p = get_number(body, k, -1e9, 1e9); p && *p != (std::string(k) == "repetition_penalty" ? 1.0 : 0.0))
      bad(k, "penalties are not supported by this server: leave it out");
  if (const ordered_json* lb = field(body, "logit_bias"); lb && !(lb->is_object() && lb->empty()))
    bad("logit_bias", "not supported by this server: leave it out");
  auto mt = get_int(body, "max_tokens", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  auto mct = get_int(body, "max_completion_tokens", std::numeric_limits<int64_t>::min(),
                     std::numeric_limits<int64_t>::max());
  r.max_tokens = mct ? mct : mt;
  if (r.max_tokens && *r.max_tokens < 1)
    bad(mct ? "max_completion_tokens" : "max_tokens", fmt::format("{}: give 1 or more", *r.max_tokens));
  r.sampling.temperature = float(get_number(body, "temperature", 0.0, 2.0).value_or(1.0));
  r.sampling.top_p = float(get_number(body, "top_p", 0.0, 1.0).value_or(1.0));
  if (r.sampling.top_p <= 0.0f) bad("top_p", "must be above 0");
  auto top_k = get_int(body, "top_k", -1, kMaxInt).value_or(0);
  r.sampling.top_k = top_k < 0 ? 0 : top_k;  // -1 means all, as in vLLM
  if (auto seed = get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    r.sampling.seed = uint64_t(*seed);
    r.seeded = true;
  } else {
    r.sampling.seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  }
  r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  if (const ordered_json* s = field(body, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 4) bad("stop", fmt::format("{} strings: give at most 4", s->size()));
      for (const auto& x : *s) {
        if (!x.is_string()) bad("stop", "expected a string or a list of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "expected a string or a list of strings");
    }
    for (const auto& x : r.stop)
      if (x.empty()) bad("stop", "a stop string must not be empty");
  }
}

// A message's content: a string, null, or a list of {"type": "text", "text": ...} parts (joined).
ordered_json normalize_messages(const ordered_json& messages) {
  if (!messages.is_array() || messages.empty()) bad("messages", "expected a non-empty list of messages");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(where, "expected an object with \"role\" and \"content\"");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad(where + ".role", "expected a string");
    ordered_json msg = m;
    auto content = m.find("content");
    if (content != m.end() && content->is_array()) {
      std::string text;
      for (size_t k = 0; k < content->size(); ++k) {
        const auto& part = (*content)[k];
        const std::string pw = fmt::format("{}.content[{}]", where, k);
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          bad(pw, "only {\"type\": \"text\", \"text\": \"...\"} parts are supported");
        text += part["text"].get<std::string>();
      }
      msg["content"] = text;
    } else if (content != m.end() && !content->is_string() && !content->is_null()) {
      bad(where + ".content", "expected a string, null or a list of text parts");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

void parse_logprobs_chat(const ordered_json& body, ParsedRequest& r) {
  const bool want = get_bool(body, "logprobs").value_or(false);
  auto top = get_int(body, "top_logprobs", 0, 20);
  if (top && !want) bad("top_logprobs", "needs \"logprobs\": true");
  if (want) r.top_logprobs = int(top.value_or(0));
}

}  // namespace

ParsedRequest parse_chat_request(const ordered_json& body) {
  ParsedRequest r;
  r.chat = true;
  parse_common(body, r);
  auto messages = body.find("messages");
  if (messages == body.end()) bad("messages", "required");
  r.messages = normalize_messages(*messages);
  if (const ordered_json* tools = field(body, "tools")) {
    if (!tools->is_array()) bad("tools", "expected a list");
    r.tools = *tools;
  }
  parse_logprobs_chat(body, r);
  r.add_generation_prompt = get_bool(body, "add_generation_prompt").value_or(true);
  if (const ordered_json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) bad("chat_template_kwargs", "expected an object");
    r.template_vars = *kw;
  }
  return r;
}

ParsedRequest parse_completion_request(const ordered_json& body) {
  ParsedRequest r;
  parse_common(body, r);
  auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) bad("prompt", "required");
  if (prompt->is_string()) {
    r.prompt_text = prompt->get<std::string>();
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    r.prompt_text = (*prompt)[0].get<std::string>();
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    r.prompt_is_ids = true;
    for (const auto& t : *prompt) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
        bad("prompt", "a list of token ids must hold non-negative integers");
      r.prompt_ids.push_back(int32_t(t.get<int64_t>()));
    }
  } else {
    bad("prompt", "expected a string, a list of one string, or a list of token ids (one prompt per request)");
  }
  if (!r.prompt_is_ids && r.prompt_text.empty()) bad("prompt", "is empty");
  if (get_bool(body, "echo").value_or(false)) bad("echo", "not supported: leave it out");
  if (field(body, "suffix")) bad("suffix", "not supported: leave it out");
  if (auto lp = get_int(body, "logprobs", 0, 20)) r.top_logprobs = int(*lp);
  return r;
}

ParsedRequest parse_apply_template(const ordered_json& body) {
  ParsedRequest r;
  r.chat = true;
  auto messages = body.find("messages");
  if (messages == body.end()) bad("messages", "required");
  r.messages = normalize_messages(*messages);
  if (const ordered_json* tools = field(body, "tools")) {
    if (!tools->is_array()) bad("tools", "expected a list");
    r.tools = *tools;
  }
  r.add_generation_prompt = get_bool(body, "add_generation_prompt").value_or(true);
  for (const auto& [k, v] : body.items()) {
    if (k == "messages" || k == "tools" || k == "add_generation_prompt" || k == "model") continue;
    if (k == "chat_template_kwargs") {
      if (!v.is_object()) bad(k, "expected an object");
      for (const auto& [k2, v2] : v.items()) r.template_vars[k2] = v2;
      continue;
    }
    r.template_vars[k] = v;
  }
  return r;
}

}  // namespace tandem::server
