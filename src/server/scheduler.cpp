// Continuous batching (see scheduler.h).
#include "server/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "server/metrics.h"

namespace tandem::server {

using Clock = std::chrono::steady_clock;

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kNone: return "";
    case Finish::kStop: return "stop";
    case Finish::kLength: return "length";
    case Finish::kError: return "error";
  }
  return "";
}

bool Stream::wait(std::vector<GenToken>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !tokens_.empty() || finish_ != Finish::kNone; });
  for (auto& t : tokens_) out.push_back(std::move(t));
  tokens_.clear();
  return finish_ != Finish::kNone;
}

void Stream::cancel() {
  cancelled_.store(true);
  if (wake_) wake_();
}

Finish Stream::finish() const {
  std::lock_guard lock(mu_);
  return finish_;
}

std::string Stream::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

void Stream::push(GenToken t) {
  {
    std::lock_guard lock(mu_);
    tokens_.push_back(std::move(t));
  }
  cv_.notify_all();
}

void Stream::end(Finish f, std::string error) {
  {
    std::lock_guard lock(mu_);
    if (finish_ != Finish::kNone) return;
    finish_ = f;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

// A request admitted to the engine (engine thread only).
struct Scheduler::Live {
  GenRequest req;
  std::shared_ptr<Stream> stream;
  Sampler sampler;
  int seq = -1;
  int64_t prefilled = 0;  // prompt rows appended so far
  int64_t generated = 0;
  int32_t last = -1;      // the token the next decode step appends
  int64_t blocks = 0;     // KV blocks reserved
  Clock::time_point submitted, first_token, last_token;
  bool finished = false;
  Finish ending = Finish::kNone;  // how it ended, told to its stream once its sequence is gone
  bool timed = false;     // its time per output token went to the metrics
  Live(GenRequest r, std::shared_ptr<Stream> s) : req(std::move(r)), stream(std::move(s)), sampler(req.sampling) {}
};

Scheduler::Scheduler(Engine* engine, SchedulerOptions options, LaneStatus* lane, Metrics* metrics)
    : options_(options), metrics_(metrics) {
  if (options_.max_seqs < 1) fail("--max-seqs {}: give 1 or more", options_.max_seqs);
  if (options_.max_queue < 0) fail("--max-queue {}: give 0 or more", options_.max_queue);
  if (options_.prefill_chunk < 1) fail("--prefill-chunk {}: give 1 or more", options_.prefill_chunk);
  snap_.state = "starting";
  snap_.lane.serving = false;
  snap_.lane.state = "starting";
  if (engine) {
    engine_ = engine;
    lane_ = lane;
    max_ctx_ = engine->max_ctx();
    vocab_ = engine->vocab_size();
    kv_at_start_ = engine->kv_usage();
    snap_.kv = kv_at_start_;
    snap_.lane = lane_ ? lane_->snapshot() : LaneSnapshot{};
  }
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
  std::lock_guard lock(mu_);
  if (started_) return;
  started_ = true;
  if (engine_ && !failed_) snap_.state = "serving";
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  installed_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  for (auto& [req, stream] : waiting_) stream->end(Finish::kError, "the server is shutting down");
  waiting_.clear();
}

int64_t Scheduler::blocks_for(const GenRequest& r) const {
  if (kv_at_start_.blocks_total <= 0) return 0;
  const int64_t tokens = int64_t(r.prompt.size()) + r.max_tokens;
  return (tokens + kv_at_start_.block_tokens - 1) / kv_at_start_.block_tokens;
}

int64_t Scheduler::token_limit() const {
  std::lock_guard lock(mu_);
  int64_t limit = max_ctx_;
  if (kv_at_start_.blocks_total > 0)
    limit = std::min(limit, kv_at_start_.blocks_total * kv_at_start_.block_tokens);
  return limit;
}

std::shared_ptr<Stream> Scheduler::submit(GenRequest request, Submit& result) {
  int64_t ctx = 0, vocab = 0;
  KvUsage kv;
  {
    std::lock_guard lock(mu_);
    if (!engine_) {
      result = Submit::kUnhealthy;
      return nullptr;
    }
    ctx = max_ctx_;
    vocab = vocab_;
    kv = kv_at_start_;
  }
  const int64_t prompt = int64_t(request.prompt.size());
  if (prompt == 0) fail("the prompt is empty: give at least one token");
  if (request.max_tokens < 1) fail("max_tokens {}: give 1 or more", request.max_tokens);
  if (prompt + request.max_tokens > ctx)
    fail("the prompt has {} tokens and max_tokens is {}: together more than this server's context of {} tokens",
         prompt, request.max_tokens, ctx);
  if (kv.blocks_total > 0 && blocks_for(request) > kv.blocks_total)
    fail("the prompt has {} tokens and max_tokens is {}: more than the KV pool's {} tokens", prompt,
         request.max_tokens, kv.blocks_total * kv.block_tokens);
  for (int32_t t : request.prompt)
    if (t < 0 || t >= vocab) fail("prompt token id {} is outside the vocabulary [0, {})", t, vocab);
  Sampler check(request.sampling);  // InputError on invalid parameters
  auto stream = std::make_shared<Stream>();
  stream->prompt_tokens_ = prompt;
  stream->wake_ = [this] { cv_.notify_all(); };
  stream->submitted_ = Clock::now();
  {
    std::lock_guard lock(mu_);
    if (!started_ || !engine_ || failed_ || stopping_ || !snap_.lane.serving) {
      result = Submit::kUnhealthy;
      return nullptr;
    }
    if (int64_t(waiting_.size()) >= options_.max_queue + std::max<int64_t>(0, options_.max_seqs - live_n_)) {
      result = Submit::kQueueFull;
      return nullptr;
    }
    waiting_.emplace_back(std::move(request), stream);
  }
  cv_.notify_all();
  result = Submit::kOk;
  return stream;
}

SchedulerSnapshot Scheduler::snapshot() const {
  std::lock_guard lock(mu_);
  SchedulerSnapshot s = snap_;
  s.waiting = int64_t(waiting_.size());
  s.healthy = started_ && engine_ && !failed_ && !stopping_ && snap_.lane.serving;
  return s;
}

bool Scheduler::healthy() const { return snapshot().healthy; }

bool Scheduler::install(Engine& engine, LaneStatus* lane) {
  std::unique_lock lock(mu_);
  if (engine_) {
    const KvUsage kv = engine.kv_usage();
    if (engine.max_ctx() != max_ctx_ || engine.vocab_size() != vocab_ || kv.blocks_total != kv_at_start_.blocks_total ||
        kv.block_tokens != kv_at_start_.block_tokens)
      fail("the restarted engine differs from the first (context {} vs {}, vocabulary {} vs {}, KV pool {}x{} vs {}x{})",
           engine.max_ctx(), max_ctx_, engine.vocab_size(), vocab_, kv.blocks_total, kv.block_tokens,
           kv_at_start_.blocks_total, kv_at_start_.block_tokens);
  }
  if (stopping_) return false;
  install_engine_ = &engine;
  install_lane_ = lane;
  installing_ = true;
  if (!thread_.joinable()) {  // not started: nothing runs on the old engine
    lock.unlock();
    take_install();
    return true;
  }
  cv_.notify_all();
  installed_cv_.wait(lock, [&] { return !installing_ || stopping_; });
  return !installing_;
}

void Scheduler::hold(std::string state, std::string reason) {
  std::lock_guard lock(mu_);
  failed_ = true;
  snap_.state = std::move(state);
  snap_.reason = std::move(reason);
}

void Scheduler::take_install() {
  Engine* engine = nullptr;
  LaneStatus* lane = nullptr;
  {
    std::lock_guard lock(mu_);
    if (!installing_) return;
    engine = install_engine_;
    lane = install_lane_;
  }
  // Whatever still runs on the old engine ends here, with an error (never a truncated answer).
  for (auto& l : live_) {
    l->stream->end(Finish::kError, "the lane was restarted under this request");
    try {
      engine_->remove_sequence(l->seq);
    } catch (const std::exception&) {
    }
  }
  live_.clear();
  reserved_blocks_ = 0;
  LaneSnapshot ls = lane ? lane->snapshot() : LaneSnapshot{};
  const KvUsage kv = engine->kv_usage();
  {
    std::lock_guard lock(mu_);
    if (!engine_) {
      max_ctx_ = engine->max_ctx();
      vocab_ = engine->vocab_size();
      kv_at_start_ = kv;
    }
    engine_ = engine;
    lane_ = lane;
    failed_ = false;
    failure_.clear();
    snap_.state = started_ ? "serving" : "starting";
    snap_.reason.clear();
    snap_.lane = std::move(ls);
    snap_.kv = kv;
    snap_.running = 0;
    live_n_ = 0;
    installing_ = false;
    install_engine_ = nullptr;
    install_lane_ = nullptr;
  }
  installed_cv_.notify_all();
}

void Scheduler::loop() {
  auto last_lane = Clock::now();
  for (;;) {
    {
      std::unique_lock lock(mu_);
      // Idle: sleep until work comes, refreshing the lane's state now and then (a peer that died
      // while nothing ran turns /health 503 without a request having to fail first).
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] {
        if (stopping_ || installing_) return true;
        if (!engine_) return false;
        if (!waiting_.empty() && !failed_) return true;
        for (const auto& l : live_)
          if (l->stream->cancelled()) return true;
        return !live_.empty();
      });
      if (stopping_) break;
    }
    take_install();
    if (!engine_) continue;
    admit();
    if (!live_.empty()) step();
    if (lane_ && (live_.empty() || Clock::now() - last_lane > std::chrono::milliseconds(200))) {
      LaneSnapshot ls = lane_->snapshot();
      std::lock_guard lock(mu_);
      snap_.lane = std::move(ls);
      last_lane = Clock::now();
    }
    std::lock_guard lock(mu_);
    snap_.running = int64_t(live_.size());
    live_n_ = snap_.running;
    snap_.kv = engine_->kv_usage();
    snap_.kv_blocks_reserved = reserved_blocks_;
    snap_.steps = steps_;
  }
  // Shutting down: every live request ends now.
  for (auto& l : live_) {
    l->stream->end(Finish::kError, "the server is shutting down");
    engine_->remove_sequence(l->seq);
  }
  live_.clear();
}

void Scheduler::retire() {
  std::vector<std::pair<std::shared_ptr<Stream>, Finish>> ends;
  for (auto& l : live_)
    if (l->finished) {
      engine_->remove_sequence(l->seq);
      reserved_blocks_ -= l->blocks;
      observe_tpot(*l);
      if (l->ending != Finish::kNone) ends.emplace_back(l->stream, l->ending);
    }
  std::erase_if(live_, [](const auto& l) { return l->finished; });
  {
    std::lock_guard lock(mu_);
    live_n_ = int64_t(live_.size());
    snap_.running = live_n_;
    snap_.kv = engine_->kv_usage();
    snap_.kv_blocks_reserved = reserved_blocks_;
  }
  // Only now: a client that sees its answer end finds its sequence gone and its KV free.
  for (auto& [stream, finish] : ends) stream->end(finish);
}

void Scheduler::admit() {
  // Drop the cancelled ones first (their KV comes back before anything is admitted).
  for (auto& l : live_)
    if (l->stream->cancelled()) l->finished = true;
  retire();
  std::lock_guard lock(mu_);
  std::erase_if(waiting_, [](const auto& w) {
    if (!w.second->cancelled()) return false;
    w.second->end(Finish::kError, "cancelled");
    return true;
  });
  if (failed_) return;
  while (!waiting_.empty() && int64_t(live_.size()) < options_.max_seqs) {
    auto& [req, stream] = waiting_.front();
    const int64_t blocks = blocks_for(req);
    if (kv_at_start_.blocks_total > 0 && reserved_blocks_ + blocks > kv_at_start_.blocks_total) break;  // waits
    auto l = std::make_unique<Live>(std::move(req), stream);
    l->submitted = stream->submitted_;
    l->blocks = blocks;
    l->seq = engine_->add_sequence();
    reserved_blocks_ += blocks;
    live_.push_back(std::move(l));
    waiting_.pop_front();
  }
  live_n_ = int64_t(live_.size());
}

void Scheduler::sample_into(Live& s, const float* logits) {
  const int64_t vocab = engine_->vocab_size();
  GenToken t;
  t.id = s.sampler.sample(logits, vocab);
  if (s.req.top_logprobs >= 0) {
    float mx = logits[0];
    for (int64_t i = 1; i < vocab; ++i) mx = std::max(mx, logits[i]);
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i] - mx));
    const float lse = mx + float(std::log(sum));
    t.logprob = logits[t.id] - lse;
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) order[size_t(i)] = int32_t(i);
    const size_t k = std::min<size_t>(size_t(s.req.top_logprobs), order.size());
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(k), order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (size_t i = 0; i < k; ++i) t.top.push_back({order[i], logits[order[i]] - lse});
  }
  const auto now = Clock::now();
  if (s.generated == 0) {
    s.first_token = now;
    if (metrics_) metrics_->observe_ttft(std::chrono::duration<double>(now - s.submitted).count());
  }
  s.last_token = now;
  ++s.generated;
  if (metrics_) metrics_->add_generated_tokens(1);
  s.last = t.id;
  const bool eos = std::find(s.req.stop_ids.begin(), s.req.stop_ids.end(), t.id) != s.req.stop_ids.end();
  if (!eos) s.stream->push(std::move(t));
  if (eos || s.generated >= s.req.max_tokens) {
    s.finished = true;
    observe_tpot(s);  // before the end, so a client that saw its answer end finds it in /metrics
    s.ending = eos ? Finish::kStop : Finish::kLength;  // told by retire()
  }
}

void Scheduler::observe_tpot(Live& s) {
  if (s.timed || !metrics_ || s.generated < 2) return;
  s.timed = true;
  const double span = std::chrono::duration<double>(s.last_token - s.first_token).count();
  metrics_->observe_tpot(span / double(s.generated - 1));
}

void Scheduler::step() {
  std::vector<Engine::Item> items;
  std::vector<Live*> owners;
  std::vector<bool> yields;  // the item's logits give its sequence's next token
  for (auto& l : live_)
    if (l->prefilled == int64_t(l->req.prompt.size())) {
      items.push_back({l->seq, std::span<const int32_t>(&l->last, 1)});
      owners.push_back(l.get());
      yields.push_back(true);
    }
  // Whole chunks only (cut at multiples of prefill_chunk from the prompt's start), at least one.
  int64_t budget = options_.prefill_chunk;
  bool any = false;
  for (auto& l : live_) {
    const int64_t left = int64_t(l->req.prompt.size()) - l->prefilled;
    if (left == 0) continue;
    const int64_t n = std::min(left, options_.prefill_chunk);
    if (any && n > budget) break;
    items.push_back({l->seq, std::span<const int32_t>(l->req.prompt.data() + l->prefilled, size_t(n))});
    owners.push_back(l.get());
    yields.push_back(n == left);
    budget -= n;
    any = true;
  }
  const std::vector<float>* logits = nullptr;
  try {
    logits = &engine_->forward(items);
  } catch (const std::exception& e) {
    fail_all(e.what());
    return;
  }
  ++steps_;
  const int64_t vocab = engine_->vocab_size();
  for (size_t i = 0; i < items.size(); ++i) {
    Live& l = *owners[i];
    if (l.prefilled < int64_t(l.req.prompt.size())) {
      l.prefilled += int64_t(items[i].tokens.size());
      if (metrics_) metrics_->add_prompt_tokens(int64_t(items[i].tokens.size()));
    }
    if (yields[i] && !l.stream->cancelled()) sample_into(l, logits->data() + int64_t(i) * vocab);
  }
  retire();
}

void Scheduler::fail_all(const std::string& why) {
  spdlog::error("serve: the engine step failed, every request in flight ends with an error and the server "
                "answers 503 from now on: {}", why);
  std::lock_guard lock(mu_);
  failed_ = true;
  failure_ = why;
  snap_.state = "failed";
  snap_.reason = why;
  for (auto& l : live_) {
    l->stream->end(Finish::kError, "the lane failed: " + why);
    try {
      engine_->remove_sequence(l->seq);
    } catch (const std::exception&) {
    }
  }
  live_.clear();
  live_n_ = 0;
  reserved_blocks_ = 0;
  for (auto& [req, stream] : waiting_) stream->end(Finish::kError, "the lane failed: " + why);
  waiting_.clear();
}

}  // namespace tandem::server
