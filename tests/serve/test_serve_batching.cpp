// The scheduler under load: 32 concurrent streamed answers equal each request answered alone (greedy;
// batching and chunked prefill never change an answer), a client that leaves frees its sequence at
// once, and a failing engine ends every answer in flight with an error event and turns /health 503.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "serve_harness.h"

namespace tandem::test {
namespace {

using nlohmann::json;

// A CPU engine with a fixed paged KV pool of `blocks` blocks of 16 tokens (EngineOptions::kv_tokens),
// watched: the most blocks the live sequences held at once, and that they never outgrew the pool.
class PoolEngine final : public Engine {
 public:
  PoolEngine(EngineOptions eo, int64_t blocks) {
    eo.kv_block = 16;
    eo.kv_tokens = 16 * blocks;
    inner_ = std::make_unique<CpuEngine>(tiny_model(), eo);
  }
  const Model& model() const override { return inner_->model(); }
  int add_sequence() override { return inner_->add_sequence(); }
  void remove_sequence(int seq) override { inner_->remove_sequence(seq); }
  int64_t seq_len(int seq) const override { return inner_->seq_len(seq); }
  int64_t max_ctx() const override { return inner_->max_ctx(); }
  const std::vector<float>& forward(std::span<const Item> items, bool all_logits) override {
    const auto& out = inner_->forward(items, all_logits);  // KvCacheFull if the scheduler overcommitted
    const KvUsage kv = kv_usage();
    EXPECT_LE(kv.blocks_used, kv.blocks_total);
    max_used_ = std::max(max_used_.load(), kv.blocks_used);
    return out;
  }
  KvUsage kv_usage() const override { return inner_->kv_usage(); }
  std::atomic<int64_t> max_used_{0};

 private:
  std::unique_ptr<Engine> inner_;
};

// Prompts of different lengths (some longer than a prefill chunk of 16) and budgets.
json request_for(int i, bool stream) {
  std::string user = "request " + std::to_string(i) + ": ";
  for (int k = 0; k < (i * 7) % 40; ++k) user += char('a' + (i + k) % 26);
  json b = i % 2 ? chat_body(user, 8 + i % 13, stream) : completion_body(user, 8 + i % 13, stream);
  if (stream) b["stream_options"] = {{"include_usage", true}};
  return b;
}

TEST(ServeBatching, ThirtyTwoConcurrentStreamsEqualTheirAnswersAlone) {
  server::ServerOptions o;
  o.scheduler.max_seqs = 32;
  o.scheduler.prefill_chunk = 16;
  EngineOptions eo;
  eo.max_seqs = 32;
  eo.max_ctx = 256;
  // A pool that holds them all at once (each needs at most 4 blocks), so the KV's return is checked.
  auto pool = std::make_unique<PoolEngine>(eo, 32 * 5);
  PoolEngine* engine = pool.get();
  TestServer s(o, 256, std::move(pool));
  constexpr int kClients = 32;
  std::vector<std::string> alone(kClients);
  std::vector<json> alone_usage(kClients);
  for (int i = 0; i < kClients; ++i) {
    const bool chat = i % 2;
    auto r = post_json(s.port, chat ? "/v1/chat/completions" : "/v1/completions", request_for(i, false).dump());
    ASSERT_EQ(r.status, 200) << r.raw;
    const auto& c = r.body["choices"][0];
    alone[i] = chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
    alone_usage[i] = r.body["usage"];
  }
  const uint64_t steps_alone = s.srv->scheduler().snapshot().steps;
  std::vector<Streamed> got(kClients);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kClients) std::this_thread::yield();
      const bool chat = i % 2;
      got[i] = parse_stream(post_sse(s.port, chat ? "/v1/chat/completions" : "/v1/completions", request_for(i, true)), chat);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(got[i].text, alone[i]) << "request " << i;
    EXPECT_EQ(got[i].finish, "length") << "request " << i;
    EXPECT_EQ(got[i].usage, alone_usage[i]) << "request " << i;
  }
  // The last answers were sent from the step that finished them; their sequences go before the next.
  auto snap = s.srv->scheduler().snapshot();
  for (int i = 0; i < 2000 && snap.running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    snap = s.srv->scheduler().snapshot();
  }
  EXPECT_EQ(snap.running, 0);
  EXPECT_EQ(snap.waiting, 0);
  EXPECT_EQ(snap.kv_blocks_reserved, 0);
  EXPECT_EQ(snap.kv.blocks_used, 0);
  EXPECT_GT(engine->max_used_.load(), 8) << "the answers did not hold KV blocks at once";
  // They ran batched: far fewer steps than one request after another took.
  EXPECT_LT(snap.steps - steps_alone, steps_alone / 2);
}

TEST(ServeBatching, ClientThatLeavesFreesItsSequence) {
  TestServer s({}, 2048);
  // Read the first bytes of a long streamed answer, then close the connection.
  auto r = post_sse(s.port, "/v1/completions", completion_body("leaving early", 1800, true), 200);
  EXPECT_GE(r.body.size(), 200u);
  bool freed = false;
  for (int i = 0; i < 400 && !freed; ++i) {
    freed = s.srv->scheduler().snapshot().running == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(freed) << "the sequence of a client that left is still running";
  const uint64_t steps = s.srv->scheduler().snapshot().steps;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(s.srv->scheduler().snapshot().steps, steps) << "the engine kept stepping for nobody";
  EXPECT_LT(steps, 1800u);
  EXPECT_EQ(post_json(s.port, "/v1/completions", completion_body("next", 2).dump()).status, 200);
}

// An engine whose forward throws (as a tripped lane's does) from its Nth call on.
class FailingEngine final : public Engine {
 public:
  FailingEngine(std::unique_ptr<Engine> inner, int fail_at) : inner_(std::move(inner)), fail_at_(fail_at) {}
  const Model& model() const override { return inner_->model(); }
  int add_sequence() override { return inner_->add_sequence(); }
  void remove_sequence(int seq) override { inner_->remove_sequence(seq); }
  int64_t seq_len(int seq) const override { return inner_->seq_len(seq); }
  int64_t max_ctx() const override { return inner_->max_ctx(); }
  KvUsage kv_usage() const override { return inner_->kv_usage(); }
  const std::vector<float>& forward(std::span<const Item> items, bool all_logits) override {
    if (++calls_ >= fail_at_.load()) throw std::runtime_error("injected lane failure (test)");
    return inner_->forward(items, all_logits);
  }
  std::unique_ptr<Engine> inner_;
  std::atomic<int> fail_at_;
  std::atomic<int> calls_{0};
};

TEST(ServeBatching, LaneFailureEndsEveryAnswerWithAnErrorAndHealthTurns503) {
  EngineOptions eo;
  eo.max_ctx = 256;
  auto failing = std::make_unique<FailingEngine>(std::make_unique<CpuEngine>(tiny_model(), eo), 1 << 30);
  FailingEngine* engine = failing.get();
  TestServer s({}, 256, std::move(failing));
  // A healthy answer first.
  auto ok = parse_stream(post_sse(s.port, "/v1/completions", completion_body("fine", 5, true)), false);
  EXPECT_EQ(ok.finish, "length");
  EXPECT_FALSE(ok.error);
  // Four streams in flight, then the engine fails a few calls later.
  std::vector<Streamed> got(4);
  std::vector<SseResult> raw(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      raw[i] = post_sse(s.port, i % 2 ? "/v1/chat/completions" : "/v1/completions",
                        i % 2 ? chat_body("doomed", 200, true) : completion_body("doomed", 230, true));
    });
  for (int i = 0; i < 4000 && s.srv->scheduler().snapshot().running < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(s.srv->scheduler().snapshot().running, 4);
  engine->fail_at_ = engine->calls_.load() + 5;
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    got[i] = parse_stream(raw[i], i % 2);  // also checks that nothing follows the error event
    EXPECT_TRUE(got[i].error) << "stream " << i << " did not end with an error event: " << raw[i].body;
    EXPECT_NE(got[i].finish, "length") << "stream " << i << " was cut short without saying so";
    EXPECT_EQ(raw[i].body.find("[DONE]"), std::string::npos);
    EXPECT_NE(got[i].error_body.value("message", "").find("injected lane failure"), std::string::npos);
  }
  auto h = get_json(s.port, "/health");
  EXPECT_EQ(h.status, 503) << h.raw;
  auto r = post_json(s.port, "/v1/completions", completion_body("after", 2).dump());
  EXPECT_EQ(r.status, 503) << r.raw;
  EXPECT_EQ(r.body["error"]["type"], "service_unavailable_error");
  // A whole (non-streamed) answer in flight at a failure gets 503, not a truncated 200: covered by the
  // same path (whole_answer); new requests are refused before any work, as above.
}

TEST(ServeBatching, WholeAnswerAtAFailureIs503) {
  EngineOptions eo;
  eo.max_ctx = 256;
  auto failing = std::make_unique<FailingEngine>(std::make_unique<CpuEngine>(tiny_model(), eo), 6);
  TestServer s({}, 256, std::move(failing));
  auto r = post_json(s.port, "/v1/completions", completion_body("doomed", 50).dump());
  EXPECT_EQ(r.status, 503) << r.raw;
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("injected lane failure"), std::string::npos);
  EXPECT_EQ(get_json(s.port, "/health").status, 503);
}

}  // namespace
}  // namespace tandem::test

namespace tandem::test {
namespace {

TEST(ServeBatching, AdmissionWaitsForFreeKvBlocksAndTheyAllComeBack) {
  EngineOptions eo;
  eo.max_ctx = 256;
  auto pool = std::make_unique<PoolEngine>(eo, 8);  // 128 tokens
  PoolEngine* engine = pool.get();
  TestServer s({}, 256, std::move(pool));
  EXPECT_EQ(s.srv->scheduler().token_limit(), 128);
  // Over the pool (but within the context): refused before any work.
  auto r = post_json(s.port, "/v1/completions", completion_body("too much", 150).dump());
  EXPECT_EQ(r.status, 400) << r.raw;
  // Two requests of 7 blocks each: the second waits for the first's blocks; both answer as alone.
  const std::string a_alone = post_json(s.port, "/v1/completions", completion_body("first", 100).dump()).body["choices"][0]["text"];
  const std::string b_alone = post_json(s.port, "/v1/completions", completion_body("second", 100).dump()).body["choices"][0]["text"];
  std::atomic<int64_t> max_running{0};
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done.load()) {
      max_running = std::max(max_running.load(), s.srv->scheduler().snapshot().running);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  Streamed a, b;
  std::thread ta([&] { a = parse_stream(post_sse(s.port, "/v1/completions", completion_body("first", 100, true)), false); });
  std::thread tb([&] { b = parse_stream(post_sse(s.port, "/v1/completions", completion_body("second", 100, true)), false); });
  ta.join();
  tb.join();
  done = true;
  watch.join();
  EXPECT_EQ(a.text, a_alone);
  EXPECT_EQ(b.text, b_alone);
  EXPECT_EQ(max_running.load(), 1) << "both ran at once though the pool holds only one";
  EXPECT_GT(engine->max_used_.load(), 0);
  auto snap = s.srv->scheduler().snapshot();
  for (int i = 0; i < 2000 && snap.running > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    snap = s.srv->scheduler().snapshot();
  }
  EXPECT_EQ(snap.kv.blocks_used, 0);
  EXPECT_EQ(snap.kv_blocks_reserved, 0);
  auto metrics = s.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("tandem_kv_blocks{state=\"free\"} 8"), std::string::npos) << metrics->body;
}

TEST(ServeBatching, StartingUntilInstalledAndServingAgainAfterAFreshEngine) {
  server::ChatSetup chat;
  server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.served_model_name = "tiny";
  server::Server srv(nullptr, tiny_tokenizer(), std::move(chat), nullptr, o);
  const int port = srv.start_background();
  auto h = get_json(port, "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.body["status"], "starting") << h.raw;
  EXPECT_EQ(post_json(port, "/v1/completions", completion_body("early", 2).dump()).status, 503);
  EngineOptions eo;
  eo.max_ctx = 256;
  FailingEngine first(std::make_unique<CpuEngine>(tiny_model(), eo), 3);
  ASSERT_TRUE(srv.scheduler().install(first, nullptr));
  EXPECT_EQ(get_json(port, "/health").status, 200);
  // The engine fails under a request: 503 from then on, until a fresh engine is installed.
  EXPECT_EQ(post_json(port, "/v1/completions", completion_body("doomed", 20).dump()).status, 503);
  EXPECT_EQ(get_json(port, "/health").status, 503);
  srv.scheduler().hold("restarting", "test");
  EXPECT_EQ(get_json(port, "/health").body["status"], "restarting");
  CpuEngine fresh(tiny_model(), eo);
  ASSERT_TRUE(srv.scheduler().install(fresh, nullptr));
  EXPECT_EQ(get_json(port, "/health").status, 200);
  auto r = post_json(port, "/v1/completions", completion_body("again", 5).dump());
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 5);
  // A fresh engine of another context is refused (answers were checked against the first one's).
  EngineOptions other = eo;
  other.max_ctx = 128;
  CpuEngine wrong(tiny_model(), other);
  EXPECT_THROW(srv.scheduler().install(wrong, nullptr), InputError);
  srv.stop();
}

}  // namespace
}  // namespace tandem::test
