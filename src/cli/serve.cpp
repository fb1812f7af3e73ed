// `tandem serve`: the OpenAI-compatible HTTP server (src/server) on a model and a lane. Listens first
// (503 "starting"), then builds the runtime (build_runtime, the one place that makes the model and its
// engine) and serves until SIGINT or SIGTERM. For lanes peer and split without --peer it starts
// `tandem peer` and `tandem watchdog` as children and stops them when it stops; after a trip it starts
// a fresh pair (--restart-lane) and serves again only once a probe through the new lane passes.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <signal.h>

#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include <filesystem>
#include <thread>

#include "chat/chat_template.h"
#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "io/config.h"
#include "io/tokenizer.h"
#include "peer/segment.h"
#include "placement/memory_model.h"
#include "server/server.h"

namespace tandem::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  server::ServerOptions server;
  int64_t kv_tokens = 0, kv_block = 16;
  double kv_memory_gb = 0;  // --kv-memory: the pool in GB (1e9 bytes) of bf16 KV, turned into kv_tokens
  std::string chat_template_file;
  size_t max_body_mib = 8;
  double stall_s = 2.0;         // --stall: the child watchdog's
  std::string restart = "auto";  // --restart-lane on|off|auto (auto: on with a child peer)
  int peer_threads = 0;          // --peer-threads (child peer; 0: chosen for the machine)
};

// The lane a --lane text names (the text was checked by runtime_options before any use here).
bool has_peer(const std::string& lane) { return lane_has_peer(parse_lane(lane)); }

// The lane's counters (the peer lane's client on a CPU primary, the CUDA engine's lane) and its
// state from the lane's shared-memory header: tripped, stopped, or the peer process gone.
class RuntimeLane final : public server::LaneStatus {
 public:
  RuntimeLane(const Runtime& rt, const std::string& peer_name, uint64_t restarts) : rt_(rt), restarts_(restarts) {
    if (!peer_name.empty()) segment_ = peer::Segment::open(peer_name, 5.0);
  }
  server::LaneSnapshot snapshot() override {
    server::LaneSnapshot s;
    s.name = lane_name(rt_.lane());
    s.restarts = restarts_;
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
      s.peer_pid = pid;
      if (state == peer::LaneState::kServing && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        s.state = "peer_gone";
        s.reason = fmt::format("the peer process {} is gone", pid);
      }
      s.serving = s.state == "serving";
    }
    if (const std::optional<LaneCounters> c = rt_.lane_counters()) {
      s.has_peer = true;
      s.handoffs = c->client.handoffs;
      s.overruns = c->client.overruns;
      s.wait_ns_total = c->client.wait_ns_total;
      s.wait_hist.assign(c->client.wait_hist.begin(), c->client.wait_hist.end());
      s.rows_sent = c->rows_sent;
      s.routed_slots = c->routed_slots;
      s.cold_slots = c->cold_slots;
      s.routed_slots_by_layer = c->routed_slots_by_layer;
      s.cold_slots_by_layer = c->cold_slots_by_layer;
      for (const LayerCheck& l : c->checks)
        if (l.checks) {
          s.checks += l.checks;
          s.check_min_cosine = std::min(s.check_min_cosine, l.min_cosine);
        }
    }
    return s;
  }

 private:
  const Runtime& rt_;
  uint64_t restarts_;
  std::shared_ptr<peer::Segment> segment_;
};

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
    chat::override_chat_template(src, o.chat_template_file, "--chat-template-file");
    have = true;
  }
  server::ChatSetup c;
  c.bos_token = src.bos_token;
  c.eos_token = src.eos_token;
  if (have) c.tmpl = chat::ChatTemplate::parse(src.source, src.origin);
  return c;
}

// The model and its engine on the chosen lane, attached to lane `peer_name` for lanes with a peer. The
// one place serve builds a model: moving to the runtime library's open() changes only this function.
std::unique_ptr<Runtime> build_runtime(const ServeOptions& o, const std::string& peer_name) {
  ModelOptions mo = o.model;
  if (has_peer(mo.lane)) {
    mo.peer = peer_name;
    mo.split_peer.clear();
  }
  RuntimeOptions ro = runtime_options(mo, o.server.scheduler.max_seqs);
  if ((o.kv_tokens != 0 || o.kv_block != 16) && !ro.device.is_cpu())
    fail("--kv-tokens, --kv-memory and --kv-block size the CPU engine's paged KV cache; the CUDA engine keeps its "
         "own cache (one slot of --ctx tokens per sequence): leave them out with --device {}",
         mo.device);
  ro.kv_tokens = o.kv_tokens;
  ro.kv_block = o.kv_block;
  if (ro.device.is_cpu()) ro.kv_dtype = DType::kBF16;  // the server keeps KV in bf16: twice the tokens per byte
  return std::make_unique<Runtime>(Runtime::open(ro));
}

// Where the primary's bytes go and how many tokens of KV that leaves, by the planner's memory model
// (placement/memory_model.h): the weights every lane keeps (all but the routed experts), the hot routed
// experts, and the KV per token; then the pool (or the sequences × context a growing cache may reach).
std::string memory_report(const Runtime& rt, const ServeOptions& o) {
  const ModelConfig& cfg = rt.model->cfg;
  const ModelBytes mb = model_bytes(cfg, rt.model->store);
  const int64_t n_routed = mb.n_moe_layer * mb.n_expert;
  const int64_t n_hot = n_routed - rt.plan.n_cold();
  const uint64_t hot_bytes = uint64_t(n_hot) * mb.expert_bytes;
  const bool cpu = rt.device.is_cpu();
  const uint64_t per_token = kv_bytes_per_token(cfg, cpu ? DType::kBF16 : DType::kF32);
  std::string s = fmt::format("memory on {}: weights {} (attention, embeddings, shared experts: {}; hot routed experts "
                              "{} of {}: {}), KV {} bytes per token ({})",
                              rt.device.name(), format_bytes(mb.primary_fixed() + hot_bytes),
                              format_bytes(mb.primary_fixed()), n_hot, n_routed, format_bytes(hot_bytes), per_token,
                              cpu ? "bf16" : "f32");
  if (rt.plan.n_cold() > 0)
    s += fmt::format("; {} cold experts ({}) off the primary", rt.plan.n_cold(),
                     format_bytes(uint64_t(rt.plan.n_cold()) * mb.expert_bytes));
  const KvUsage kv = rt.engine->kv_usage();
  const int64_t ctx = rt.engine->max_ctx();
  if (!cpu)
    s += fmt::format("; KV one slot of the {}-token context per sequence, allocated at start: {} sequences take {}",
                     ctx, kv.blocks_total, format_bytes(uint64_t(kv.blocks_total) * uint64_t(ctx) * per_token));
  else if (kv.blocks_total > 0)
    s += fmt::format("; KV pool {} tokens ({}{}): {} sequences of the full {}-token context", kv.blocks_total * kv.block_tokens,
                     format_bytes(uint64_t(kv.blocks_total * kv.block_tokens) * per_token),
                     o.kv_memory_gb > 0 ? fmt::format(", --kv-memory {} GB", o.kv_memory_gb) : std::string(),
                     kv.blocks_total * kv.block_tokens / std::max<int64_t>(ctx, 1), ctx);
  else
    s += fmt::format("; KV grown on demand (no --kv-tokens): {} sequences × {} tokens would take {}",
                     o.server.scheduler.max_seqs, ctx,
                     format_bytes(uint64_t(o.server.scheduler.max_seqs) * uint64_t(ctx) * per_token));
  return s;
}

// A runtime with the view of its lane the server shows.
struct LaneSet {
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<RuntimeLane> lane;
};

// The probe a fresh lane must pass before it serves (Runtime::probe), logged when it passes.
std::string probe_lane(LaneSet& ls, double check_min) {
  const ProbeResult r = ls.rt->probe(check_min >= -1 ? check_min : 0.999);
  if (r.passed)
    spdlog::info("serve: probe through lane {} passed (logits cosine {:.6f}, {} handoffs)", lane_name(ls.rt->lane()),
                 r.cosine, r.handoffs);
  return r.why;
}

// The peer and the watchdog serve starts for lanes peer and split when no --peer is given.
class ChildLane {
 public:
  explicit ChildLane(const ServeOptions& o) : o_(o) {}
  ~ChildLane() { stop(); }

  // Starts `tandem peer` on a fresh lane and `tandem watchdog` on it; returns the lane's name.
  std::string start(uint64_t generation) {
    stop();
    lane_ = fmt::format("serve-{}-{}", getpid(), generation);
    const std::string self = self_path();
    std::vector<std::string> peer = {self, "peer", "--model", o_.model.model_dir, "--rowmap", o_.model.rowmap,
                                     "--lane", lane_, "--threads", std::to_string(peer_threads()),
                                     "--weights", o_.model.weights};
    if (parse_lane(o_.model.lane) == Lane::kSplit) peer.insert(peer.end(), {"--split-share", o_.model.split});
    if (parse_device(o_.model.device).cuda)  // behind a GPU primary (docs/operations.md)
      peer.insert(peer.end(), {"--spin-us", "50000", "--worker-spin-us", "50000"});
    peer_pid_ = spawn(peer);
    watchdog_pid_ = spawn({self, "watchdog", "--lane", lane_, "--stall", fmt::format("{}", o_.stall_s), "--grace", "1"});
    spdlog::info("serve: started peer (pid {}) and watchdog (pid {}, stall {} s) on lane {}", peer_pid_,
                 watchdog_pid_, o_.stall_s, lane_);
    // Until its lane appears: a peer that exits first (a bad rowmap, no memory) is an error now, not
    // after --peer-wait.
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(o_.model.peer_wait_s);
    while (!peer::Segment::exists(lane_)) {
      int status = 0;
      if (waitpid(peer_pid_, &status, WNOHANG) == peer_pid_) {
        peer_pid_ = 0;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        stop();
        fail("the peer serve started for lane {} exited (status {}) before serving: its error is logged above",
             o_.model.lane, code);
      }
      if (std::chrono::steady_clock::now() > end) break;  // the attach below waits no longer and says so
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return lane_;
  }

  // SIGTERM to both (the peer stops its lane, the watchdog then exits), SIGKILL after 3 s.
  void stop() {
    for (pid_t* pid : {&peer_pid_, &watchdog_pid_})
      if (*pid > 0) kill(*pid, SIGTERM);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while ((peer_pid_ > 0 || watchdog_pid_ > 0) && std::chrono::steady_clock::now() < end) {
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (pid_t* pid : {&peer_pid_, &watchdog_pid_})
      if (*pid > 0) {
        kill(*pid, SIGCONT);
        kill(*pid, SIGKILL);
        waitpid(*pid, nullptr, 0);
        *pid = 0;
      }
    if (!lane_.empty() && peer::Segment::exists(lane_)) shm_unlink(peer::shm_name(lane_).c_str());
    lane_.clear();
  }

  // Collects children that exited (so a dead peer is seen as gone, not as a zombie).
  void reap() {
    for (pid_t* pid : {&peer_pid_, &watchdog_pid_}) {
      if (*pid <= 0) continue;
      int status = 0;
      if (waitpid(*pid, &status, WNOHANG) == *pid) {
        spdlog::info("serve: {} (pid {}) exited with {}", pid == &peer_pid_ ? "peer" : "watchdog", *pid,
                     WIFEXITED(status) ? fmt::format("status {}", WEXITSTATUS(status))
                                       : fmt::format("signal {}", WTERMSIG(status)));
        *pid = 0;
      }
    }
  }

  // The peer's --threads: every core but the primary's (docs/operations.md: the two must not share cores).
  int peer_threads() const {
    if (o_.peer_threads > 0) return o_.peer_threads;
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    if (parse_device(o_.model.device).cuda) return std::max(1, cores - 2);
    return std::max(1, cores - primary_threads(o_));
  }
  // The CPU primary's threads with a child peer on the same host: --threads, else half the cores.
  static int primary_threads(const ServeOptions& o) {
    if (o.model.threads > 0) return o.model.threads;
    return std::max(1, int(std::thread::hardware_concurrency()) / 2);
  }

 private:
  static std::string self_path() {
    std::error_code ec;
    auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) fail("cannot find this program's path (/proc/self/exe) to start the peer: {}", ec.message());
    return p.string();
  }
  static pid_t spawn(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // The child starts with default signal handling and nothing blocked (serve blocks SIGINT/SIGTERM).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, argv[0], nullptr, &attr, argv.data(), environ);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) fail("cannot start {} {}: {}", args[0], args[1], std::strerror(rc));
    return pid;
  }

  const ServeOptions& o_;
  std::string lane_;
  pid_t peer_pid_ = 0, watchdog_pid_ = 0;
};

// A runtime on a lane: the child peer started first when serve owns it, then the model built and
// attached, then (lanes with a peer) the probe. `generation` names the child's lane (one per try);
// `restarts` is what the lane reports (restarts that succeeded). InputError or a failed probe: throws.
LaneSet bring_up(const ServeOptions& o, ChildLane* child, uint64_t generation, uint64_t restarts) {
  std::string peer_name =
      parse_lane(o.model.lane) == Lane::kSplit && !o.model.split_peer.empty() ? o.model.split_peer : o.model.peer;
  if (child) peer_name = child->start(generation);
  LaneSet ls;
  ls.rt = build_runtime(o, peer_name);
  ls.lane = std::make_unique<RuntimeLane>(*ls.rt, has_peer(o.model.lane) ? peer_name : std::string(), restarts);
  if (has_peer(o.model.lane))
    if (std::string why = probe_lane(ls, o.model.check_min); !why.empty()) throw std::runtime_error(why);
  return ls;
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

  // Options that need no model first.
  parse_device(o.model.device);
  const bool child_peer = has_peer(o.model.lane) && o.model.peer.empty();
  if (child_peer && o.model.rowmap.empty()) fail("--lane {} needs --rowmap R (tandem plan)", o.model.lane);
  if (!child_peer && o.peer_threads > 0) fail("--peer-threads is for the peer serve starts itself: leave out --peer");
  if (!(o.stall_s > 0)) fail("--stall {}: give a number of seconds above 0", o.stall_s);
  if (o.restart != "auto" && o.restart != "on" && o.restart != "off")
    fail("--restart-lane {}: give on, off or auto", o.restart);
  const bool restart = o.restart == "on" || (o.restart == "auto" && child_peer);
  if (restart && !has_peer(o.model.lane))
    fail("--restart-lane on: lane {} has no peer to restart (lanes peer and split)", o.model.lane);
  if (child_peer && o.model.threads == 0 && parse_device(o.model.device).is_cpu()) {
    o.model.threads = ChildLane::primary_threads(o);
    spdlog::info("serve: the primary uses {} threads and the peer the rest of the {} cores (--threads, --peer-threads)",
                 o.model.threads, std::thread::hardware_concurrency());
  }

  o.server.max_body_bytes = o.max_body_mib << 20;
  if (o.server.served_model_name.empty())
    o.server.served_model_name = std::filesystem::path(o.model.model_dir).lexically_normal().filename().string();
  if (o.server.served_model_name.empty()) o.server.served_model_name = "tandem";
  const ModelConfig cfg = load_config(o.model.model_dir);
  o.server.eos_token_ids = cfg.eos_token_ids;
  if (o.kv_memory_gb > 0) {
    if (o.kv_tokens > 0) fail("--kv-memory {} and --kv-tokens {}: give one of them", o.kv_memory_gb, o.kv_tokens);
    const uint64_t per_token = kv_bytes_per_token(cfg, DType::kBF16);
    o.kv_tokens = int64_t(o.kv_memory_gb * 1e9 / double(per_token));
    if (o.kv_tokens < o.kv_block)
      fail("--kv-memory {} GB holds {} tokens of KV at {} bytes each (bf16, all layers): less than one block of {}",
           o.kv_memory_gb, o.kv_tokens, per_token, o.kv_block);
    spdlog::info("serve: --kv-memory {} GB: a KV pool of {} tokens at {} bytes per token (bf16, {} layers)",
                 o.kv_memory_gb, o.kv_tokens, per_token, cfg.n_layer);
  }
  const Tokenizer tok = Tokenizer::load(o.model.model_dir);
  server::ChatSetup chat = load_chat(o);

  // Listening from here: 503 "starting" until the lane is up.
  server::Server srv(nullptr, tok, std::move(chat), nullptr, o.server);
  const int port = srv.start_background();
  spdlog::info("serve: listening on http://{}:{}{}; starting lane {}", o.server.host, port,
               o.server.api_key.empty() ? "" : " (API key required)", o.model.lane);

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig != 0) spdlog::info("serve: signal {}, stopping", sig);
    std::lock_guard lock(mu);
    stop = true;
    cv.notify_all();
  });
  auto stop_requested = [&] {
    std::lock_guard lock(mu);
    return stop;
  };
  auto finish = [&] {
    pthread_kill(waiter.native_handle(), SIGTERM);  // ends the waiter when we stop on our own
    waiter.join();
  };

  std::unique_ptr<ChildLane> child = child_peer ? std::make_unique<ChildLane>(o) : nullptr;
  uint64_t generation = 0, restarts = 0;
  LaneSet current;
  try {
    current = bring_up(o, child.get(), generation, restarts);
  } catch (...) {
    srv.stop();
    finish();
    throw;
  }
  srv.scheduler().install(*current.rt->engine, current.lane.get());
  const KvUsage kv = current.rt->engine->kv_usage();
  std::string kv_text = ", KV grown on demand";
  if (!current.rt->device.is_cpu())
    kv_text = fmt::format(", KV {} slots of the context", kv.blocks_total);
  else if (kv.blocks_total > 0)
    kv_text = fmt::format(", KV pool {} blocks of {} tokens", kv.blocks_total, kv.block_tokens);
  spdlog::info("serve: model {} as \"{}\" on lane {}, context {} tokens, up to {} sequences{}: serving",
               o.model.model_dir, o.server.served_model_name, o.model.lane, srv.scheduler().token_limit(),
               o.server.scheduler.max_seqs, kv_text);
  spdlog::info("serve: {}", memory_report(*current.rt, o));

  // Supervise: reap children; after a trip (a failed step, or a lane that stopped serving while idle)
  // bring a fresh lane up, retrying with a growing pause while it fails.
  double backoff_s = 1;
  auto next_try = std::chrono::steady_clock::now();
  while (!stop_requested()) {
    {
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop; });
      if (stop) break;
    }
    if (child) child->reap();
    if (!restart) continue;
    const server::SchedulerSnapshot s = srv.scheduler().snapshot();
    const bool down = s.state == "failed" || s.state == "restarting" || (s.state == "serving" && !s.lane.serving);
    if (!down || std::chrono::steady_clock::now() < next_try) continue;
    const std::string why = s.state == "failed" ? s.reason : !s.lane.serving ? s.lane.state + ": " + s.lane.reason : s.reason;
    srv.scheduler().hold("restarting", "restarting the lane after: " + why);
    spdlog::warn("serve: lane {} is down ({}): starting a fresh one", o.model.lane, why);
    try {
      LaneSet fresh = bring_up(o, child.get(), ++generation, restarts + 1);
      if (!srv.scheduler().install(*fresh.rt->engine, fresh.lane.get())) break;  // stopping
      std::swap(current, fresh);  // the old lane goes now, after the scheduler let go of it
      backoff_s = 1;
      ++restarts;
      spdlog::info("serve: lane {} restarted (restart {}): serving again", o.model.lane, restarts);
    } catch (const std::exception& e) {
      spdlog::error("serve: the fresh lane failed ({}); trying again in {} s", e.what(), backoff_s);
      srv.scheduler().hold("restarting", fmt::format("the fresh lane failed: {}", e.what()));
      next_try = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(backoff_s));
      backoff_s = std::min(backoff_s * 2, 30.0);
    }
  }
  srv.stop();
  finish();
  if (current.rt)
    if (std::string summary = current.rt->lane_summary(); !summary.empty()) fmt::print(stderr, "{}\n", summary);
  current = {};  // detach from the lane before its peer stops
  if (child) child->stop();
  return 0;
}

RunFn setup(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  add_model_options(app, o->model);
  // What serve does differently from the other commands that take these options.
  app.get_option("--threads")->description(
      "The primary's CPU threads (default: all cores; half of them with --device cpu when serve starts the peer itself)");
  app.get_option("--peer")->description(
      "Lane name of a running `tandem peer` to attach to (lanes peer and split). Without it serve starts "
      "`tandem peer` and `tandem watchdog` itself, on the rest of the cores, and stops them when it stops");
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
  app.add_option("--kv-memory", o->kv_memory_gb,
                 "KV cache pool in GB (1e9 bytes) of bf16 KV, instead of --kv-tokens (cpu)")
      ->check(CLI::Range(0.0, 1e6))
      ->group(sched);
  app.add_option("--kv-block", o->kv_block, "Tokens per KV cache block (cpu; default 16)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->group(sched);
  const std::string lane = "Lane health";
  app.add_option("--stall", o->stall_s,
                 "Lanes peer and split without --peer: seconds of pending work without progress after which the "
                 "watchdog serve starts trips the lane (default 2); /health turns 503 and answers in flight end "
                 "with an error")
      ->group(lane);
  app.add_option("--restart-lane", o->restart,
                 "on, off or auto (default: on with a peer serve started itself): after a trip, start a fresh peer "
                 "(or re-attach to --peer NAME once it is back) and serve again once a probe through it passes")
      ->group(lane);
  app.add_option("--peer-threads", o->peer_threads,
                 "Threads of the peer serve starts itself (default: the cores the primary leaves: with --device "
                 "cpu it takes half the cores unless --threads says otherwise; behind cuda, all cores but two go "
                 "to the peer)")
      ->check(CLI::Range(1, 4096))
      ->group(lane);
  return [o] { return run_serve(*o); };
}

}  // namespace
TANDEM_COMMAND(serve, "serve",
               "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models, /apply-template, "
               "/health, /metrics",
               setup);
}  // namespace tandem::cli
