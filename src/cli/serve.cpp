// `tandem serve`: the OpenAI-compatible HTTP server (src/server) on a model and a lane. Builds the
// runtime as the other commands do, loads the tokenizer and the chat template, and serves until
// SIGINT or SIGTERM, when answers in flight end with an error and the lane is shut down.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <signal.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "chat/chat_template.h"
#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "io/tokenizer.h"
#include "peer/segment.h"
#include "server/server.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"
#endif

namespace tandem::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  server::ServerOptions server;
  int64_t kv_tokens = 0, kv_block = 16;
  std::string chat_template_file;
  size_t max_body_mib = 8;
};

// The lane's counters (the peer lane's client on a CPU primary, the CUDA engine's lane) and its
// state from the lane's shared-memory header: tripped, stopped, or the peer process gone.
class RuntimeLane final : public server::LaneStatus {
 public:
  RuntimeLane(const Runtime& rt, std::string peer_name) : rt_(rt) {
    if (!peer_name.empty()) segment_ = peer::Segment::open(peer_name, 5.0);
  }
  server::LaneSnapshot snapshot() override {
    server::LaneSnapshot s;
    s.name = rt_.lane;
    if (segment_) {
      peer::Header& h = segment_->header();
      const auto state = peer::LaneState(h.state.load(std::memory_order_acquire));
      switch (state) {
        case peer::LaneState::kStarting: s.state = "starting"; break;
        case peer::LaneState::kServing: s.state = "serving"; break;
        case peer::LaneState::kTripped:
          s.state = "tripped";
          s.reason = std::string(h.trip_reason, strnlen(h.trip_reason, sizeof h.trip_reason));
          break;
        case peer::LaneState::kRefused: s.state = "refused"; break;
        case peer::LaneState::kStopped: s.state = "stopped"; break;
      }
      const int32_t pid = h.peer_pid.load();
      if (state == peer::LaneState::kServing && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        s.state = "peer_gone";
        s.reason = fmt::format("the peer process {} is gone", pid);
      }
      s.serving = s.state == "serving";
    }
    auto fill = [&](const peer::ClientStats& st, uint64_t rows, uint64_t routed, uint64_t cold,
                    const std::vector<LayerCheck>& checks) {
      s.has_peer = true;
      s.handoffs = st.handoffs;
      s.overruns = st.overruns;
      s.wait_ns_total = st.wait_ns_total;
      s.wait_hist.assign(st.wait_hist.begin(), st.wait_hist.end());
      s.rows_sent = rows;
      s.routed_slots = routed;
      s.cold_slots = cold;
      for (const auto& c : checks)
        if (c.checks) {
          s.checks += c.checks;
          s.check_min_cosine = std::min(s.check_min_cosine, c.min_cosine);
        }
    };
    if (rt_.peer) fill(rt_.peer->stats(), rt_.peer->rows_sent(), rt_.peer->routed_slots(), rt_.peer->cold_slots(), rt_.peer->checks());
#ifdef TANDEM_HAVE_CUDA
    else if (rt_.engine)
      if (auto st = cuda_peer_stats(*rt_.engine)) fill(st->client, st->rows_sent, st->routed_slots, st->cold_slots, st->checks);
#endif
    return s;
  }

 private:
  const Runtime& rt_;
  std::shared_ptr<peer::Segment> segment_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--chat-template-file {}: cannot read the file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

server::ChatSetup load_chat(const ServeOptions& o) {
  chat::ModelChatTemplate src;
  bool have = false;
  try {
    src = chat::load_model_chat_template(o.model.model_dir);
    have = true;
  } catch (const InputError& e) {
    if (o.chat_template_file.empty())
      spdlog::warn("serve: no chat template ({}): /v1/chat/completions and /apply-template answer 400; give "
                   "--chat-template-file FILE to serve chat",
                   e.what());
  }
  if (!o.chat_template_file.empty()) {
    src.source = read_file(o.chat_template_file);
    src.origin = o.chat_template_file;
    have = true;
  }
  server::ChatSetup c;
  c.bos_token = src.bos_token;
  c.eos_token = src.eos_token;
  if (have) c.tmpl = chat::ChatTemplate::parse(src.source, src.origin);
  return c;
}

int run_serve(ServeOptions& o) {
  // SIGINT/SIGTERM go to one thread that stops the server: blocked here, before any thread starts
  // (the lane's heartbeat thread included), so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that left: the write fails instead

  o.server.max_body_bytes = o.max_body_mib << 20;
  if (o.server.served_model_name.empty())
    o.server.served_model_name = std::filesystem::path(o.model.model_dir).lexically_normal().filename().string();
  if (o.server.served_model_name.empty()) o.server.served_model_name = "tandem";
  Runtime rt = make_runtime(o.model, o.server.scheduler.max_seqs);
  if (o.kv_tokens != 0 || o.kv_block != 16) {
    // The runtime takes no KV options yet: rebuild the CPU engine with them (same lane executor).
    if (parse_device(o.model.device))
      fail("--kv-tokens and --kv-block are not passed to the CUDA engine by this build: leave them out with --device cuda");
    EngineOptions eo;
    eo.max_seqs = o.server.scheduler.max_seqs;
    eo.max_ctx = o.model.max_ctx;
    eo.kv_block = o.kv_block;
    eo.kv_tokens = o.kv_tokens;
    rt.engine = std::make_unique<CpuEngine>(*rt.model, eo, rt.peer.get());
  }
  const Tokenizer tok = Tokenizer::load(o.model.model_dir);
  server::ChatSetup chat = load_chat(o);
  const std::string peer_name =
      o.model.lane == "split" && !o.model.split_peer.empty() ? o.model.split_peer
      : (o.model.lane == "peer" || o.model.lane == "split") ? o.model.peer : std::string();
  RuntimeLane lane(rt, peer_name);
  server::Server srv(*rt.engine, tok, std::move(chat), &lane, o.server);
  const int port = srv.bind();
  const KvUsage kv = rt.engine->kv_usage();
  spdlog::info("serve: model {} as \"{}\" on lane {}, context {} tokens, up to {} sequences{}; listening on http://{}:{}{}",
               o.model.model_dir, o.server.served_model_name, o.model.lane, srv.scheduler().token_limit(),
               o.server.scheduler.max_seqs,
               kv.blocks_total > 0 ? fmt::format(", KV pool {} blocks of {} tokens", kv.blocks_total, kv.block_tokens)
                                   : std::string(", KV grown on demand"),
               o.server.host, port, o.server.api_key.empty() ? "" : " (API key required)");
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig != 0) spdlog::info("serve: signal {}, stopping", sig);
    srv.stop();
  });
  srv.run();
  srv.stop();
  pthread_kill(waiter.native_handle(), SIGTERM);  // run() may return on its own (listen failure)
  waiter.join();
  if (std::string summary = rt.lane_summary(); !summary.empty()) fmt::print(stderr, "{}\n", summary);
  return 0;
}

RunFn setup(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  add_model_options(app, o->model);
  const std::string http = "HTTP";
  app.add_option("--host", o->server.host, "Address to listen on (default 127.0.0.1; 0.0.0.0: every interface)")->group(http);
  app.add_option("--port", o->server.port, "Port (default 8080; 0: any free port, logged at start)")
      ->check(CLI::Range(0, 65535))
      ->group(http);
  app.add_option("--api-key", o->server.api_key,
                 "Require \"Authorization: Bearer KEY\" on /v1/* and /apply-template (401 otherwise); /health, "
                 "/metrics and / stay open")
      ->group(http);
  app.add_option("--served-model-name", o->server.served_model_name,
                 "The model id in /v1/models and the only `model` requests may name (default: the model folder's "
                 "name; requests may also leave `model` out)")
      ->group(http);
  app.add_option("--chat-template-file", o->chat_template_file,
                 "Jinja chat template replacing the model's (chat_template.jinja or tokenizer_config.json). With "
                 "neither, chat requests answer 400 (no built-in fallback); /v1/completions still works")
      ->group(http);
  app.add_option("--max-body", o->max_body_mib, "Largest request body in MiB (default 8; larger: 413)")
      ->check(CLI::Range(size_t(1), size_t(1024)))
      ->group(http);
  const std::string sched = "Scheduling";
  app.add_option("--max-seqs", o->server.scheduler.max_seqs,
                 "Sequences decoded together (default 32); more requests wait in the queue")
      ->check(CLI::Range(int64_t(1), int64_t(4096)))
      ->group(sched);
  app.add_option("--max-queue", o->server.scheduler.max_queue,
                 "Requests that may wait for a sequence beyond the free ones (default 64); past it: 429")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))
      ->group(sched);
  app.add_option("--prefill-chunk", o->server.scheduler.prefill_chunk,
                 "Prompt rows prefilled per step beside the decode rows (default 256): long prompts do not stall "
                 "the others")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->group(sched);
  app.add_option("--kv-tokens", o->kv_tokens,
                 "KV cache pool in tokens (cpu; 0, default: grown on demand). With a pool, a request is admitted "
                 "only when the pool's free blocks cover its prompt + max_tokens")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->group(sched);
  app.add_option("--kv-block", o->kv_block, "Tokens per KV cache block (cpu; default 16)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->group(sched);
  return [o] { return run_serve(*o); };
}

}  // namespace
TANDEM_COMMAND(serve, "serve",
               "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models, /apply-template, "
               "/health, /metrics",
               setup);
}  // namespace tandem::cli
