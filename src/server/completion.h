// The two generation endpoints, POST /v1/chat/completions and /v1/completions: a checked request
// becomes a prompt (through the chat template for chat), goes to the scheduler, and its tokens come
// back as text through a TextStream — streamed as server-sent events or answered whole.
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "server/openai.h"
#include "server/scheduler.h"
#include "server/server.h"

namespace tandem::server {

// What a finished request adds to its access-log line.
struct RequestInfo {
  std::string id;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::string finish;
  std::string error;
};

struct CompletionContext {
  Scheduler& scheduler;
  const Tokenizer& tokenizer;
  const ChatSetup& chat;
  std::string model_name;
  std::vector<int32_t> eos_ids;
  // Called once per request when it is over (the answer sent or the client gone).
  std::function<void(const RequestInfo&)> done;
};

// The prompt text of a chat request through the template (ApiError 400 when the template fails on it,
// or when there is no template).
std::string render_prompt(const ChatSetup& chat, const ParsedRequest& r);

void handle_completion(const CompletionContext& ctx, const httplib::Request& req, httplib::Response& res, bool chat);

}  // namespace tandem::server
