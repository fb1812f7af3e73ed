// Serve test helpers (see serve_harness.h).
#include "serve_harness.h"

#include <signal.h>

#include <filesystem>
#include <mutex>

#include "server/text_stream.h"
#include "test_util.h"

namespace tandem::test {

namespace {
struct Tiny {
  TempDir dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  Tiny() {
    signal(SIGPIPE, SIG_IGN);
    CommandResult r = run_tandem({"synth", "--preset", "tiny", "--out", dir.path + "/tiny"});
    if (r.exit_code != 0) throw std::runtime_error("tandem synth failed: " + r.err);
    model = Model::load(dir.path + "/tiny");
    tok = std::make_unique<Tokenizer>(Tokenizer::load(dir.path + "/tiny"));
  }
};
Tiny& tiny() {
  static Tiny t;
  return t;
}
}  // namespace

const std::string& tiny_model_dir() {
  static const std::string d = tiny().dir.path + "/tiny";
  return d;
}
const Model& tiny_model() { return *tiny().model; }
const Tokenizer& tiny_tokenizer() { return *tiny().tok; }

TestServer::TestServer(server::ServerOptions options, int64_t max_ctx, std::unique_ptr<Engine> e, server::LaneStatus* lane) {
  options.host = "127.0.0.1";
  options.port = 0;
  if (options.served_model_name.empty()) options.served_model_name = "tiny";  // what chat_body() names
  if (!e) {
    EngineOptions eo;
    eo.max_seqs = options.scheduler.max_seqs;
    eo.max_ctx = max_ctx;
    e = std::make_unique<CpuEngine>(tiny_model(), eo);
  }
  engine = std::move(e);
  server::ChatSetup chat;
  auto src = chat::load_model_chat_template(tiny_model_dir());
  chat.tmpl = chat::ChatTemplate::parse(src.source, src.origin);
  chat.bos_token = src.bos_token;
  chat.eos_token = src.eos_token;
  srv = std::make_unique<server::Server>(engine.get(), tiny_tokenizer(), std::move(chat), lane, options);
  port = srv->start_background();
}

TestServer::~TestServer() { srv->stop(); }

httplib::Client TestServer::client() const {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  return c;
}

SseResult post_sse(int port, const std::string& path, const nlohmann::json& body, size_t stop_after,
                   const httplib::Headers& headers) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  SseResult out;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.body.append(data, n);
    return stop_after == 0 || out.body.size() < stop_after;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const auto t0 = std::chrono::steady_clock::now();
  c.send(req, res, err);
  out.status = res.status;
  if (err != httplib::Error::Success && stop_after == 0)
    ADD_FAILURE() << "POST " << path << ": " << httplib::to_string(err) << " after " << out.body.size() << " bytes, "
                  << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  if (out.body.empty()) out.body = res.body;
  size_t pos = 0;
  while (pos < out.body.size()) {
    size_t end = out.body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string ev = out.body.substr(pos, end - pos);
    if (ev.rfind("data: ", 0) == 0) out.events.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

namespace {
JsonResult to_json(const httplib::Result& r) {
  JsonResult out;
  if (!r) return out;
  out.status = r->status;
  out.raw = r->body;
  out.body = nlohmann::json::parse(r->body, nullptr, false);
  if (out.body.is_discarded()) out.body = nullptr;
  return out;
}
}  // namespace

JsonResult post_json(int port, const std::string& path, const std::string& body, const httplib::Headers& headers) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  return to_json(c.Post(path.c_str(), headers, body, "application/json"));
}

JsonResult get_json(int port, const std::string& path, const httplib::Headers& headers) {
  httplib::Client c("127.0.0.1", port);
  return to_json(c.Get(path.c_str(), headers));
}

nlohmann::json chat_body(const std::string& user, int64_t max_tokens, bool stream) {
  return {{"model", "tiny"},
          {"messages", {{{"role", "user"}, {"content", user}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true},
          {"stream", stream}};
}

nlohmann::json completion_body(const std::string& prompt, int64_t max_tokens, bool stream) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}};
}

Streamed parse_stream(const SseResult& r, bool chat) {
  Streamed s;
  EXPECT_EQ(r.status, 200) << r.body;
  bool done = false;
  for (size_t i = 0; i < r.events.size(); ++i) {
    const std::string& ev = r.events[i];
    EXPECT_FALSE(done) << "an event after [DONE]: " << ev;
    EXPECT_FALSE(s.error) << "an event after the error event: " << ev;
    if (ev == "[DONE]") {
      done = true;
      continue;
    }
    auto j = nlohmann::json::parse(ev, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << ev;
    if (j.is_discarded()) continue;
    if (j.contains("error")) {
      s.error = true;
      s.error_body = j["error"];
      continue;
    }
    EXPECT_EQ(j["object"], chat ? "chat.completion.chunk" : "text_completion");
    if (j.contains("usage") && !j["usage"].is_null()) s.usage = j["usage"];
    if (j["choices"].empty()) continue;
    const auto& c = j["choices"][0];
    EXPECT_TRUE(s.finish.empty()) << "a chunk after the finish reason: " << ev;
    std::string piece;
    if (chat && c["delta"].contains("content")) piece = c["delta"]["content"].get<std::string>();
    if (!chat) piece = c["text"].get<std::string>();
    EXPECT_TRUE(server::valid_utf8(piece));
    s.text += piece;
    if (!c["finish_reason"].is_null()) s.finish = c["finish_reason"].get<std::string>();
  }
  if (!s.error) {
    EXPECT_TRUE(done) << "no [DONE]: " << r.body;
  }
  return s;
}

}  // namespace tandem::test
