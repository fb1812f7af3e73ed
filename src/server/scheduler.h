// Continuous batching. One engine thread owns the Engine; HTTP handler threads submit requests and
// read their tokens from a per-request Stream. Between steps the thread drops cancelled requests,
// admits waiting ones (up to max_seqs live, and only when the KV pool's free blocks cover the
// request's prompt + max_tokens beside what admitted requests reserved), then runs one forward call:
// one decode row for every decoding sequence plus whole prefill chunks (each request's prompt is cut
// at multiples of prefill_chunk, whatever else runs, so batching never changes a request's
// numerics) up to prefill_chunk prefill rows. A failed forward (a lane trip, any exception) ends
// every request with kError, nothing after it, and leaves the scheduler unhealthy until install()
// gives it a fresh engine (a restarted lane). Without an engine it is "starting": submit says kUnhealthy.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "server/lane_status.h"

namespace tandem::server {

class Metrics;

enum class Finish { kNone, kStop, kLength, kError };  // kStop: an end-of-sequence token
const char* finish_name(Finish f);                     // "", "stop", "length", "error"

struct GenRequest {
  std::vector<int32_t> prompt;  // non-empty
  int64_t max_tokens = 16;      // >= 1; prompt + max_tokens <= the engine's context (checked by submit)
  SamplerParams sampling;
  std::vector<int32_t> stop_ids;  // end-of-sequence tokens: generation ends on one (not passed on)
  int top_logprobs = -1;          // -1: no logprobs; 0..20: the chosen token's and this many others
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;  // log-softmax of the model's logits (before temperature)
};
struct GenToken {
  int32_t id = 0;
  float logprob = 0;               // when the request asked for logprobs
  std::vector<TokenLogprob> top;   // [top_logprobs], most likely first
};

// One request's link between its handler and the engine thread.
class Stream {
 public:
  // Handler side: waits up to `timeout` for tokens or the end; appends what came to `out`. Returns
  // true once the request has ended (and every token was taken).
  bool wait(std::vector<GenToken>& out, std::chrono::milliseconds timeout);
  // Handler side: the client is gone or needs no more tokens; the engine thread drops the sequence
  // before its next step (its KV freed).
  void cancel();
  bool cancelled() const { return cancelled_.load(); }
  Finish finish() const;
  std::string error() const;  // the failure's message for kError
  int64_t prompt_tokens() const { return prompt_tokens_; }

 private:
  friend class Scheduler;
  void push(GenToken t);
  void end(Finish f, std::string error = {});

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<GenToken> tokens_;
  Finish finish_ = Finish::kNone;
  std::string error_;
  std::atomic<bool> cancelled_{false};
  int64_t prompt_tokens_ = 0;
  std::chrono::steady_clock::time_point submitted_;
  std::function<void()> wake_;  // wakes the engine thread (cancel)
};

struct SchedulerOptions {
  int64_t max_seqs = 32;        // live sequences; the engine must accept this many
  int64_t max_queue = 64;       // waiting (not admitted) requests beyond which submit says kQueueFull
  int64_t prefill_chunk = 256;  // prompt rows per step
};

struct SchedulerSnapshot {
  int64_t running = 0, waiting = 0;
  KvUsage kv;
  int64_t kv_blocks_reserved = 0;
  bool healthy = false;
  std::string state;  // "starting", "serving", "failed", or what hold() set ("restarting")
  std::string reason;
  LaneSnapshot lane;
  uint64_t steps = 0;
};

class Scheduler {
 public:
  // engine null: "starting" until install(). lane may be null (a local lane: always serving). metrics
  // may be null.
  Scheduler(Engine* engine, SchedulerOptions options, LaneStatus* lane, Metrics* metrics);
  ~Scheduler();  // stop()

  void start();  // starts the engine thread: healthy from here until a failure
  void stop();   // ends every request (kError "server shutting down") and joins the thread

  enum class Submit { kOk, kQueueFull, kUnhealthy };
  // A request that fits the limits; InputError (a client's fault, naming the numbers) for an empty
  // prompt, max_tokens < 1, prompt + max_tokens past the context or more KV than the pool holds.
  std::shared_ptr<Stream> submit(GenRequest request, Submit& result);
  // The largest prompt + max_tokens one request may have: the context, or the KV pool when smaller.
  int64_t token_limit() const;

  SchedulerSnapshot snapshot() const;
  bool healthy() const;

  // Any thread: gives the scheduler a (new) engine and its lane, which must outlive the scheduler or
  // the next install. Requests still on the old engine end with kError first; then the scheduler is
  // serving again. Returns once the engine thread took it (false: the scheduler stopped meanwhile),
  // after which the old engine is no longer touched. Every engine after the first must have the first
  // one's context, vocabulary and KV pool (InputError otherwise: answers already checked against them).
  bool install(Engine& engine, LaneStatus* lane);
  // Any thread: not serving (submit says kUnhealthy, /health 503) with this state and reason until
  // install(); requests in flight keep running (a broken lane fails them by itself).
  void hold(std::string state, std::string reason);

 private:
  struct Live;
  void loop();
  void take_install();
  void admit();
  void step();
  void fail_all(const std::string& why);
  int64_t blocks_for(const GenRequest& r) const;
  void retire();  // drops finished sequences, then ends their streams
  void sample_into(Live& s, const float* logits);
  void observe_tpot(Live& s);

  SchedulerOptions options_;
  Metrics* metrics_;

  mutable std::mutex mu_;  // guards everything below but live_ (engine thread only)
  std::condition_variable cv_;
  Engine* engine_ = nullptr;      // written by the engine thread (or before start), under mu_
  LaneStatus* lane_ = nullptr;
  int64_t max_ctx_ = 0, vocab_ = 0;  // the first engine's
  KvUsage kv_at_start_;
  Engine* install_engine_ = nullptr;  // pending install
  LaneStatus* install_lane_ = nullptr;
  bool installing_ = false;
  std::condition_variable installed_cv_;
  std::deque<std::pair<GenRequest, std::shared_ptr<Stream>>> waiting_;
  bool started_ = false, stopping_ = false, failed_ = false;
  std::string failure_;
  SchedulerSnapshot snap_;  // refreshed by the engine thread
  int64_t live_n_ = 0;      // live_.size(), for submit's queue limit
  std::thread thread_;

  std::vector<std::unique_ptr<Live>> live_;
  int64_t reserved_blocks_ = 0;  // engine thread
  uint64_t steps_ = 0;
};

}  // namespace tandem::server
