// Shared by the serve tests: one tiny synthetic model (made once per binary by `tandem synth --preset
// tiny`, which also writes its ChatML tokenizer_config.json), servers on random loopback ports, and an
// HTTP client that reads server-sent events.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "io/tokenizer.h"
#include "models/model.h"
#include "server/server.h"

namespace tandem::test {

// The tiny model's folder (synthesized on first use, removed at exit).
const std::string& tiny_model_dir();
const Model& tiny_model();
const Tokenizer& tiny_tokenizer();

// A server over its own CpuEngine on 127.0.0.1:random.
struct TestServer {
  explicit TestServer(server::ServerOptions options = {}, int64_t max_ctx = 256,
                      std::unique_ptr<Engine> engine = nullptr, server::LaneStatus* lane = nullptr);
  ~TestServer();
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Server> srv;
  int port = 0;
  httplib::Client client() const;
};

// A streamed response: the HTTP status, and the data of each `data:` event in order.
struct SseResult {
  int status = 0;
  std::string body;                 // the raw body
  std::vector<std::string> events;  // the text after "data: " of each event
};
// POSTs `body` to `path` and collects the events. stop_after: close the connection after that many
// bytes of body were read (0: read to the end).
SseResult post_sse(int port, const std::string& path, const nlohmann::json& body, size_t stop_after = 0,
                   const httplib::Headers& headers = {});

// POST returning status and parsed JSON body (null when not JSON).
struct JsonResult {
  int status = 0;
  nlohmann::json body;
  std::string raw;
};
JsonResult post_json(int port, const std::string& path, const std::string& body, const httplib::Headers& headers = {});
JsonResult get_json(int port, const std::string& path, const httplib::Headers& headers = {});

// A chat body: one user message, greedy, the given budget; ignore_eos so the length is exact.
nlohmann::json chat_body(const std::string& user, int64_t max_tokens, bool stream = false);
nlohmann::json completion_body(const std::string& prompt, int64_t max_tokens, bool stream = false);

// The text and finish reason of a streamed chat or completion (checks the event sequence: chunks,
// then [DONE] last; fails the test on anything malformed).
struct Streamed {
  std::string text;
  std::string finish;
  nlohmann::json usage;  // the usage chunk's, when asked
  bool error = false;    // an error event came (then no [DONE] and no content after it)
  nlohmann::json error_body;
};
Streamed parse_stream(const SseResult& r, bool chat);

}  // namespace tandem::test
