// Chat and text completions (see completion.h).
#include "server/completion.h"

#include <fmt/format.h>

#include <random>

#include "chat/chat_template.h"
#include "core/error.h"
#include "server/text_stream.h"

namespace tandem::server {

namespace {

using Clock = std::chrono::steady_clock;

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32)};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One request's progress, shared by the streaming callbacks.
struct Answer {
  Answer(const CompletionContext& c, ParsedRequest req, bool is_chat)
      : ctx(c), p(std::move(req)), chat(is_chat), text(c.tokenizer, p.stop) {}
  const CompletionContext& ctx;
  ParsedRequest p;
  bool chat;
  TextStream text;
  std::shared_ptr<Stream> stream;
  RequestInfo info;
  int64_t created = 0;
  int64_t sent_chars = 0;  // text bytes handed out so far (completions' text_offset)
  bool started = false, finished = false, logged = false;
  Finish finish = Finish::kNone;

  void log_once() {
    if (logged) return;
    logged = true;
    if (!finished && stream) stream->cancel();  // the client left before the end: free its sequence now
    if (info.finish.empty()) info.finish = finished ? finish_name(finish) : "cancelled";
    if (ctx.done) ctx.done(info);
  }
};

std::string token_text(const Tokenizer& tok, int32_t id) {
  const int32_t one[1] = {id};
  return tok.decode(one, false);
}

ordered_json bytes_of(const std::string& s) {
  ordered_json b = ordered_json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// The logprobs of `tokens` in the endpoint's shape: chat {"content": [...]}; completions
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. offsets: each token's text offset.
ordered_json logprobs_json(const Answer& a, const std::vector<GenToken>& tokens, const std::vector<int64_t>& offsets) {
  const Tokenizer& tok = a.ctx.tokenizer;
  if (a.chat) {
    ordered_json content = ordered_json::array();
    for (const auto& t : tokens) {
      const std::string s = token_text(tok, t.id);
      ordered_json e{{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", ordered_json::array()}};
      for (const auto& o : t.top) {
        const std::string os = token_text(tok, o.id);
        e["top_logprobs"].push_back({{"token", os}, {"logprob", o.logprob}, {"bytes", bytes_of(os)}});
      }
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}};
  }
  ordered_json j{{"tokens", ordered_json::array()}, {"token_logprobs", ordered_json::array()},
                 {"top_logprobs", ordered_json::array()}, {"text_offset", ordered_json::array()}};
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto& t = tokens[i];
    j["tokens"].push_back(token_text(tok, t.id));
    j["token_logprobs"].push_back(t.logprob);
    ordered_json top = ordered_json::object();
    for (const auto& o : t.top) top[token_text(tok, o.id)] = o.logprob;
    j["top_logprobs"].push_back(std::move(top));
    j["text_offset"].push_back(offsets[i]);
  }
  return j;
}

// Feeds tokens through the text stream: the text now safe to send, and the tokens it consumed (fewer
// than given when a stop string matched: the request is cancelled then).
std::string consume(Answer& a, std::vector<GenToken>& tokens, std::vector<int64_t>& offsets) {
  std::string out;
  size_t used = 0;
  offsets.clear();
  for (; used < tokens.size() && !a.text.stopped(); ++used) {
    offsets.push_back(a.sent_chars + int64_t(out.size()));
    out += a.text.push(tokens[used].id);
    ++a.info.completion_tokens;
  }
  tokens.resize(used);
  if (a.text.stopped() && !a.finished) {
    a.finished = true;
    a.finish = Finish::kStop;
    a.stream->cancel();
  }
  a.sent_chars += int64_t(out.size());
  return out;
}

ordered_json usage_json(const Answer& a) {
  return {{"prompt_tokens", a.info.prompt_tokens},
          {"completion_tokens", a.info.completion_tokens},
          {"total_tokens", a.info.prompt_tokens + a.info.completion_tokens}};
}

// One streamed chunk with choice 0 (text, logprobs, finish reason).
std::string chunk(const Answer& a, const std::string* text, const ordered_json& logprobs, const char* finish,
                  bool role = false) {
  ordered_json j;
  j["id"] = a.info.id;
  j["object"] = a.chat ? "chat.completion.chunk" : "text_completion";
  j["created"] = a.created;
  j["model"] = a.ctx.model_name;
  ordered_json c;
  c["index"] = 0;
  if (a.chat) {
    ordered_json delta = ordered_json::object();
    if (role) delta["role"] = "assistant";
    if (text) delta["content"] = *text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = text ? *text : std::string();
  }
  c["logprobs"] = logprobs;
  c["finish_reason"] = finish ? ordered_json(finish) : ordered_json(nullptr);
  j["choices"] = ordered_json::array({std::move(c)});
  if (a.p.include_usage) j["usage"] = nullptr;
  return "data: " + j.dump() + "\n\n";
}

std::string error_event(const Answer& a, const std::string& message) {
  ordered_json j;
  j["id"] = a.info.id;
  j["object"] = a.chat ? "chat.completion.chunk" : "text_completion";
  j["created"] = a.created;
  j["model"] = a.ctx.model_name;
  ordered_json c{{"index", 0}, {"finish_reason", "error"}};
  if (a.chat) c["delta"] = ordered_json::object();
  j["choices"] = ordered_json::array({std::move(c)});
  j["error"] = error_object(503, message, "", "", "lane_failed");
  return "data: " + j.dump() + "\n\n";
}

// The finish of a request the scheduler ended (not a stop string).
void take_end(Answer& a) {
  a.finished = true;
  a.finish = a.stream->finish();
  if (a.finish == Finish::kError) a.info.error = a.stream->error();
}

void stream_answer(const std::shared_ptr<Answer>& a, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Request-Id", a->info.id);
  res.set_chunked_content_provider(
      "text/event-stream",
      [a](size_t, httplib::DataSink& sink) -> bool {
        auto send = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        if (!a->started) {
          a->started = true;
          if (a->chat && !send(chunk(*a, nullptr, nullptr, nullptr, true))) return false;
        }
        std::vector<GenToken> tokens;
        const bool ended = a->stream->wait(tokens, std::chrono::milliseconds(100));
        if (tokens.empty() && !ended) return sink.is_writable();  // false: the client is gone (cancelled by log_once)
        std::vector<int64_t> offsets;
        std::string text = consume(*a, tokens, offsets);
        if (!a->finished && ended) {
          take_end(*a);
          if (a->finish != Finish::kError) text += a->text.finish();
        }
        if (a->finished && a->finish == Finish::kError) {
          // Tokens that came with the failure are not sent: nothing after a fault.
          send(error_event(*a, a->info.error));
          sink.done();
          return true;
        }
        const ordered_json lp = a->p.top_logprobs >= 0 && !tokens.empty() ? logprobs_json(*a, tokens, offsets) : nullptr;
        if ((!text.empty() || !lp.is_null()) && !send(chunk(*a, &text, lp, nullptr))) return false;
        if (a->finished) {
          static const std::string kNoText;
          std::string tail = chunk(*a, a->chat ? nullptr : &kNoText, nullptr, finish_name(a->finish));
          if (a->p.include_usage) {
            ordered_json u{{"id", a->info.id},
                           {"object", a->chat ? "chat.completion.chunk" : "text_completion"},
                           {"created", a->created},
                           {"model", a->ctx.model_name},
                           {"choices", ordered_json::array()},
                           {"usage", usage_json(*a)}};
            tail += "data: " + u.dump() + "\n\n";
          }
          tail += "data: [DONE]\n\n";
          if (!send(tail)) return false;
          sink.done();
        }
        return true;
      },
      [a](bool) { a->log_once(); });
}

void whole_answer(const std::shared_ptr<Answer>& a, httplib::Response& res) {
  std::string text;
  std::vector<GenToken> all;
  std::vector<int64_t> all_offsets;
  while (!a->finished) {
    std::vector<GenToken> tokens;
    const bool ended = a->stream->wait(tokens, std::chrono::milliseconds(100));
    std::vector<int64_t> offsets;
    text += consume(*a, tokens, offsets);
    all.insert(all.end(), tokens.begin(), tokens.end());
    all_offsets.insert(all_offsets.end(), offsets.begin(), offsets.end());
    if (!a->finished && ended) {
      take_end(*a);
      if (a->finish != Finish::kError) text += a->text.finish();
    }
  }
  res.set_header("X-Request-Id", a->info.id);
  if (a->finish == Finish::kError) {
    a->log_once();
    throw ApiError(503, "the answer failed: " + a->info.error, "", "", "lane_failed");
  }
  ordered_json j;
  j["id"] = a->info.id;
  j["object"] = a->chat ? "chat.completion" : "text_completion";
  j["created"] = a->created;
  j["model"] = a->ctx.model_name;
  ordered_json c;
  c["index"] = 0;
  if (a->chat)
    c["message"] = {{"role", "assistant"}, {"content", text}};
  else
    c["text"] = text;
  c["logprobs"] = a->p.top_logprobs >= 0 ? logprobs_json(*a, all, all_offsets) : ordered_json(nullptr);
  c["finish_reason"] = finish_name(a->finish);
  j["choices"] = ordered_json::array({std::move(c)});
  j["usage"] = usage_json(*a);
  res.set_content(j.dump(), "application/json");
  a->log_once();
}

}  // namespace

std::string render_prompt(const ChatSetup& chat, const ParsedRequest& r) {
  if (!chat.tmpl)
    throw ApiError(400,
                   "this model has no chat template (no chat_template.jinja, none in tokenizer_config.json): start "
                   "the server with --chat-template-file FILE, or use /v1/completions",
                   "messages");
  try {
    return chat::render_chat(*chat.tmpl, r.messages, r.tools, r.add_generation_prompt, r.template_vars,
                             chat.bos_token, chat.eos_token);
  } catch (const InputError& e) {
    throw ApiError(400, fmt::format("the chat template refused the request: {}", e.what()), "messages");
  }
}

void handle_completion(const CompletionContext& ctx, const httplib::Request& req, httplib::Response& res, bool chat) {
  ordered_json body = parse_body(req.body);
  ParsedRequest p = chat ? parse_chat_request(body) : parse_completion_request(body);
  if (!p.model.empty() && p.model != ctx.model_name)
    throw ApiError(404, fmt::format("The model `{}` does not exist: this server serves `{}`", p.model, ctx.model_name),
                   "model", "", "model_not_found");
  // Starting, tripped or restarting: 503 before any work (the context is not even known while starting).
  if (!ctx.scheduler.healthy())
    throw ApiError(503, "the server is not serving: its lane is down or starting (see /health)");
  GenRequest g;
  try {
    if (chat)
      g.prompt = ctx.tokenizer.encode(render_prompt(ctx.chat, p));
    else
      g.prompt = p.prompt_is_ids ? p.prompt_ids : ctx.tokenizer.encode_with_special(p.prompt_text);
  } catch (const ApiError&) {
    throw;
  } catch (const InputError& e) {
    throw ApiError(400, e.what(), chat ? "messages" : "prompt");
  }
  const int64_t limit = ctx.scheduler.token_limit();
  const int64_t n_prompt = int64_t(g.prompt.size());
  if (n_prompt == 0) throw ApiError(400, "the prompt encodes to no tokens", chat ? "messages" : "prompt");
  if (n_prompt >= limit)
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens: this server's context holds {} (prompt and answer together)",
                               n_prompt, limit),
                   chat ? "messages" : "prompt", "", "context_length_exceeded");
  if (p.max_tokens && n_prompt + *p.max_tokens > limit)
    throw ApiError(400,
                   fmt::format("max_tokens {} with a prompt of {} tokens needs {}: this server's context holds {}",
                               *p.max_tokens, n_prompt, n_prompt + *p.max_tokens, limit),
                   "max_tokens", "", "context_length_exceeded");
  g.max_tokens = p.max_tokens.value_or(limit - n_prompt);
  g.sampling = p.sampling;
  if (!p.ignore_eos) g.stop_ids = ctx.eos_ids;
  g.top_logprobs = p.top_logprobs;
  const bool streamed = p.stream;
  auto a = std::make_shared<Answer>(ctx, std::move(p), chat);
  a->info.id = random_id(chat ? "chatcmpl-" : "cmpl-");
  a->info.prompt_tokens = n_prompt;
  a->created = unix_now();
  Scheduler::Submit result{};
  try {
    a->stream = ctx.scheduler.submit(std::move(g), result);
  } catch (const InputError& e) {
    throw ApiError(400, e.what());
  }
  switch (result) {
    case Scheduler::Submit::kOk: break;
    case Scheduler::Submit::kQueueFull:
      throw ApiError(429, "the server's queue is full: try again later (--max-queue)");
    case Scheduler::Submit::kUnhealthy:
      throw ApiError(503, "the server is not serving: its lane is down or starting (see /health)");
  }
  if (streamed)
    stream_answer(a, res);
  else
    whole_answer(a, res);
}

}  // namespace tandem::server
