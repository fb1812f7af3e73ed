// HTTP wiring (see server.h): routes, the API key, error bodies, health, metrics, models, the page,
// and one access-log line per request.
#include "server/server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "server/completion.h"
#include "server/openai.h"
#include "server/page.h"

namespace tandem::server {

namespace {

bool same_key(const std::string& a, const std::string& b) {  // no early exit on the first difference
  unsigned diff = unsigned(a.size() != b.size());
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

struct Server::Impl {
  const Tokenizer& tokenizer;
  ChatSetup chat;
  ServerOptions options;
  httplib::Server http;
  std::unique_ptr<CompletionContext> completion;
  int port = -1;
  std::atomic<int> listen_fd{-1};  // the listening socket, to widen its backlog
  // The access line of a generation request joins what httplib's logger knows (method, path, status)
  // with what the answer knows (tokens, finish): whichever comes second writes it. A streamed answer
  // ends after the logger ran, a whole one before.
  struct HttpSide {
    std::string method, path, remote;
    int status = 0;
  };
  std::mutex info_mu;
  std::unordered_map<std::string, RequestInfo> infos;  // answers over, logger not run yet
  std::unordered_map<std::string, HttpSide> https;     // logger ran, answer not over yet
  static void access_line(const HttpSide& h, const std::string& id, const RequestInfo& info) {
    spdlog::info("access method={} path={} status={} remote={} id={} prompt_tokens={} completion_tokens={} finish={}{}",
                 h.method, h.path, h.status, h.remote, id.empty() ? "-" : id, info.prompt_tokens,
                 info.completion_tokens, info.finish.empty() ? "-" : info.finish,
                 info.error.empty() ? "" : fmt::format(" error=\"{}\"", info.error));
  }
  Impl(const Tokenizer& t, ChatSetup c, ServerOptions o) : tokenizer(t), chat(std::move(c)), options(std::move(o)) {}
};

Server::Server(Engine* engine, const Tokenizer& tokenizer, ChatSetup chat, LaneStatus* lane, ServerOptions options)
    : impl_(std::make_unique<Impl>(tokenizer, std::move(chat), std::move(options))) {
  Impl& m = *impl_;
  if (m.options.served_model_name.empty()) m.options.served_model_name = "tandem";
  scheduler_ = std::make_unique<Scheduler>(engine, m.options.scheduler, lane, &metrics_);
  std::vector<int32_t> eos;
  if (m.options.eos_token_ids.empty() && engine) m.options.eos_token_ids = engine->model().cfg.eos_token_ids;
  for (int64_t e : m.options.eos_token_ids) eos.push_back(int32_t(e));
  if (!m.chat.eos_token.empty())
    if (auto id = tokenizer.token_to_id(m.chat.eos_token);
        id && std::find(eos.begin(), eos.end(), *id) == eos.end())
      eos.push_back(*id);
  m.completion = std::make_unique<CompletionContext>(CompletionContext{
      *scheduler_, tokenizer, m.chat, m.options.served_model_name, eos, [this, &m](const RequestInfo& info) {
        metrics_.count_answer(info.finish);
        std::lock_guard lock(m.info_mu);
        if (auto it = m.https.find(info.id); it != m.https.end()) {
          Impl::access_line(it->second, info.id, info);
          m.https.erase(it);
        } else {
          m.infos[info.id] = info;
        }
      }});

  httplib::Server& http = m.http;
  const SchedulerOptions& so = m.options.scheduler;
  const int threads = m.options.http_threads > 0 ? m.options.http_threads : int(so.max_seqs + so.max_queue + 16);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_payload_max_length(m.options.max_body_bytes);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  http.set_tcp_nodelay(true);
  // httplib listens with a backlog of 5 (compiled into Debian's library): many clients connecting at
  // once overflow it and some connections die. The socket is remembered here and listen() called
  // again with a wide backlog after bind (Linux updates the backlog of a listening socket).
  http.set_socket_options([&m](socket_t sock) {
    httplib::default_socket_options(sock);
    m.listen_fd = sock;
  });

  auto send_error = [](httplib::Response& res, const ApiError& e) {
    res.status = e.status();
    res.set_content(error_body(e), "application/json");
  };
  // Every handler's failures become OpenAI error bodies here.
  auto guarded = [send_error](auto fn) {
    return [fn, send_error](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const InputError& e) {
        send_error(res, ApiError(400, e.what()));
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, fmt::format("internal error: {}", e.what())));
      }
    };
  };

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string& key = impl_->options.api_key;
    if (key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (req.path.rfind("/v1/", 0) != 0 && req.path != "/apply-template") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0 && same_key(auth.substr(7), key)) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 401;
    res.set_content(error_body(ApiError(401, auth.empty() ? "this server needs an API key: send \"Authorization: Bearer KEY\""
                                                          : "the API key is wrong")),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Responses httplib makes itself (unknown path, body too large, ...) get an OpenAI error body too.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    switch (res.status) {
      case 404: msg = fmt::format("no such endpoint: {} {}", req.method, req.path); break;
      case 405: msg = fmt::format("method {} is not allowed on {}", req.method, req.path); break;
      case 413: msg = "the request body is too large"; break;
      default: msg = fmt::format("HTTP {}", res.status);
    }
    res.set_content(error_body(ApiError(res.status, msg)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(error_body(ApiError(500, "internal error: " + what)), "application/json");
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.count_request(req.path.rfind("/v1/", 0) == 0 || req.path == "/apply-template" || req.path == "/health" ||
                                   req.path == "/metrics" || req.path == "/"
                               ? req.path
                               : std::string("other"),
                           res.status);
    if (req.path == "/health" || req.path == "/metrics") {
      spdlog::debug("access method={} path={} status={}", req.method, req.path, res.status);
      return;
    }
    const Impl::HttpSide side{req.method, req.path, req.remote_addr, res.status};
    const std::string id = res.get_header_value("X-Request-Id");
    if (id.empty()) {  // no answer was started (refused before any work, or not a generation request)
      Impl::access_line(side, id, RequestInfo{});
      return;
    }
    std::lock_guard lock(impl_->info_mu);
    if (auto it = impl_->infos.find(id); it != impl_->infos.end()) {
      Impl::access_line(side, id, it->second);
      impl_->infos.erase(it);
    } else {
      impl_->https[id] = side;
    }
  });

  http.Post("/v1/chat/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
              handle_completion(*impl_->completion, req, res, true);
            }));
  http.Post("/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
              handle_completion(*impl_->completion, req, res, false);
            }));
  http.Post("/apply-template", guarded([this](const httplib::Request& req, httplib::Response& res) {
              ParsedRequest p = parse_apply_template(parse_body(req.body));
              ordered_json j{{"prompt", render_prompt(impl_->chat, p)}};
              res.set_content(j.dump(), "application/json");
            }));
  http.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
             ordered_json model{{"id", impl_->options.served_model_name},
                                {"object", "model"},
                                {"created", 0},
                                {"owned_by", "tandem"},
                                {"max_model_len", scheduler_->token_limit()}};
             ordered_json j{{"object", "list"}, {"data", ordered_json::array({model})}};
             res.set_content(j.dump(), "application/json");
           }));
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const SchedulerSnapshot s = scheduler_->snapshot();
    ordered_json lane{{"name", s.lane.name}, {"state", s.lane.state}, {"serving", s.lane.serving}};
    if (!s.lane.reason.empty()) lane["reason"] = s.lane.reason;
    if (s.lane.peer_pid > 0) lane["peer_pid"] = s.lane.peer_pid;
    lane["restarts"] = s.lane.restarts;
    ordered_json j{{"status", s.healthy ? "ok" : s.state == "serving" ? "unavailable" : s.state},
                   {"lane", lane},
                   {"running", s.running},
                   {"waiting", s.waiting},
                   {"kv_blocks_total", s.kv.blocks_total},
                   {"kv_blocks_used", s.kv.blocks_used}};
    if (!s.reason.empty()) j["reason"] = s.reason;
    res.status = s.healthy ? 200 : 503;
    res.set_content(j.dump(), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(scheduler_->snapshot()), "text/plain; version=0.0.4");
  });
  // The operator's page (server/page.h): compiled into the binary, open like /health and /metrics.
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(page_index_html()), "text/html; charset=utf-8");
  });
}

Server::~Server() { stop(); }

int Server::bind() {
  Impl& m = *impl_;
  if (m.options.port == 0) {
    m.port = m.http.bind_to_any_port(m.options.host);
  } else if (m.http.bind_to_port(m.options.host, m.options.port)) {
    m.port = m.options.port;
  }
  if (m.port <= 0) fail("cannot listen on {}:{} (address in use, or not an address of this machine)", m.options.host, m.options.port);
  if (m.listen_fd >= 0 && ::listen(m.listen_fd, SOMAXCONN) != 0)
    spdlog::warn("serve: cannot widen the listen backlog: {}", std::strerror(errno));
  return m.port;
}

void Server::run() {
  scheduler_->start();
  impl_->http.listen_after_bind();
}

int Server::start_background() {
  const int port = bind();
  scheduler_->start();
  thread_ = std::thread([this] { impl_->http.listen_after_bind(); });
  while (!impl_->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return port;
}

void Server::stop() {
  if (!impl_) return;
  scheduler_->stop();  // answers end first, so handlers waiting on them return
  impl_->http.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tandem::server
