// `tandem serve`'s HTTP side: the OpenAI API (chat and text completions, streamed or not, models),
// /apply-template, /health, /metrics and the page, over cpp-httplib, in front of a Scheduler that owns
// the engine. Handlers check everything a request says before any work (400/401/404/413/429/503 in
// OpenAI's error shape); an answer is streamed as server-sent events or sent whole; a lane failure
// ends a streamed answer with an error event and a whole one with 503 — never a truncated answer.
#pragma once

#include <httplib.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chat/chat_template.h"
#include "engine/engine.h"
#include "io/tokenizer.h"
#include "server/lane_status.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace tandem::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (bind() returns it)
  std::string api_key;                // "": no key; else /v1/* and /apply-template need "Authorization: Bearer KEY"
  std::string served_model_name;      // the id in /v1/models and the only `model` accepted
  SchedulerOptions scheduler;
  size_t max_body_bytes = 8u << 20;   // larger bodies: 413
  int http_threads = 0;               // 0: max_seqs + max_queue + 16
  std::vector<int64_t> eos_token_ids; // the model's end-of-sequence ids (config.json); empty: the engine's model's
};

// The chat template and the special tokens it is given; no template: chat requests get 400.
struct ChatSetup {
  std::optional<chat::ChatTemplate> tmpl;
  std::string bos_token, eos_token;
};

class Server {
 public:
  // tokenizer, engine and lane (may be null) must outlive the server (or the next install). engine
  // null: /health says "starting" (503) and requests get 503 until scheduler().install() gives it one.
  Server(Engine* engine, const Tokenizer& tokenizer, ChatSetup chat, LaneStatus* lane, ServerOptions options);
  ~Server();  // stop()

  // Binds host:port; returns the port. InputError when it cannot (in use, bad address).
  int bind();
  // Starts the scheduler and serves on this thread until stop(). bind() first.
  void run();
  // bind() + run() on a background thread; returns the port once it accepts connections.
  int start_background();
  // Stops serving (in-flight answers end with an error) and joins; idempotent, any thread.
  void stop();

  Scheduler& scheduler() { return *scheduler_; }
  Metrics& metrics() { return metrics_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Metrics metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  std::thread thread_;
};

}  // namespace tandem::server
