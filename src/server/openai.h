// The OpenAI API's JSON on our side: request bodies checked field by field into a ParsedRequest (every
// wrong type or value is an ApiError naming the field, answered 400 before any work), and the
// response, chunk and error objects in OpenAI's shapes.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace tandem::server {

using nlohmann::ordered_json;

// An error the client is told about: {"error": {"message", "type", "param", "code"}} with `status`.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_, type_, code_;
};

// The error object {"message", "type", "param", "code"}; type and code default from the status.
ordered_json error_object(int status, const std::string& message, const std::string& param = {},
                          const std::string& type = {}, const std::string& code = {});
std::string error_body(const ApiError& e);

struct ParsedRequest {
  bool chat = false;
  std::string model;  // "" when absent
  bool stream = false, include_usage = false;
  // Chat: what the template is given.
  ordered_json messages, tools;
  ordered_json template_vars = ordered_json::object();  // chat_template_kwargs
  bool add_generation_prompt = true;
  // Completions: the prompt as text or as token ids.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  std::optional<int64_t> max_tokens;  // max_completion_tokens or max_tokens
  SamplerParams sampling;
  bool seeded = false;
  std::vector<std::string> stop;
  int top_logprobs = -1;  // -1: none
  bool ignore_eos = false;
};

// The body of POST /v1/chat/completions, /v1/completions (parsed JSON). ApiError 400 on any field of
// the wrong type or out of range, and on features this server does not offer (n > 1, penalties, ...).
ParsedRequest parse_chat_request(const ordered_json& body);
ParsedRequest parse_completion_request(const ordered_json& body);
// The body of POST /apply-template: messages, tools, add_generation_prompt (default true), and every
// other key as a template variable (chat_template_kwargs' keys too).
ParsedRequest parse_apply_template(const ordered_json& body);

// Parses a request body: ApiError 400 for malformed JSON or invalid UTF-8, or a body that is not an object.
ordered_json parse_body(const std::string& body);

}  // namespace tandem::server
