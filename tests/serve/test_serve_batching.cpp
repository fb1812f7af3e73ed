// The scheduler under load: 32 concurrent streamed answers equal each request answered alone (greedy;
// batching and chunked prefill never change an answer), a client that leaves frees its sequence at
// once, and a failing engine ends every answer in flight with an error event and turns /health 503.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "serve_harness.h"

namespace tandem::test {
namespace {

using nlohmann::json;

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
  TestServer s(o);
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
  const auto snap = s.srv->scheduler().snapshot();
  EXPECT_EQ(snap.running, 0);
  EXPECT_EQ(snap.waiting, 0);
  EXPECT_EQ(snap.kv_blocks_reserved, 0);
  EXPECT_EQ(snap.kv.blocks_used, 0);
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
