// `tandem serve`'s HTTP API on the tiny synthetic model: chat and text completions, streamed and not,
// usage, stop strings, max_tokens, every error status, the API key, health, metrics, /apply-template.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <thread>

#include "serve_harness.h"
#include "server/page.h"
#include "server/text_stream.h"

namespace tandem::test {
namespace {

using nlohmann::json;

TEST(ServeApi, ChatWholeAnswer) {
  TestServer s;
  auto r = post_json(s.port, "/v1/chat/completions", chat_body("hello", 8).dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["object"], "chat.completion");
  EXPECT_EQ(r.body["choices"].size(), 1u);
  EXPECT_EQ(r.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 8);
  // The prompt is the ChatML rendering of the message, one token per byte plus the specials.
  const std::string prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], tiny_tokenizer().encode(prompt).size());
  EXPECT_EQ(r.body["usage"]["total_tokens"], r.body["usage"]["prompt_tokens"].get<int>() + 8);
  EXPECT_TRUE(r.body["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
}

TEST(ServeApi, StreamedEqualsWholeAndCarriesUsage) {
  TestServer s;
  for (bool chat : {true, false}) {
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    json body = chat ? chat_body("the same question", 20) : completion_body("the same prompt", 20);
    auto whole = post_json(s.port, path, body.dump());
    ASSERT_EQ(whole.status, 200) << whole.raw;
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    Streamed st = parse_stream(post_sse(s.port, path, body), chat);
    const auto& c = whole.body["choices"][0];
    EXPECT_EQ(st.text, chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>());
    EXPECT_EQ(st.finish, "length");
    EXPECT_EQ(st.usage, whole.body["usage"]);
  }
}

TEST(ServeApi, MaxTokensAndMaxCompletionTokens) {
  TestServer s;
  json b = chat_body("x", 100);
  b.erase("max_tokens");
  b["max_completion_tokens"] = 3;
  auto r = post_json(s.port, "/v1/chat/completions", b.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  // No budget: up to the context (256 tokens here), ending with "length".
  json c = completion_body("abc", 1);
  c.erase("max_tokens");
  r = post_json(s.port, "/v1/completions", c.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["total_tokens"], 256);
}

TEST(ServeApi, StopStringsEndTheAnswerAndAreNotSent) {
  TestServer s;
  // The greedy answer without a stop string, then stop strings cut from its middle.
  auto full = post_json(s.port, "/v1/completions", completion_body("stop strings", 60).dump());
  ASSERT_EQ(full.status, 200);
  const std::string text = full.body["choices"][0]["text"];
  // A stop string from the middle of the text, starting on an ASCII character (a character boundary).
  size_t at = text.size() / 2;
  while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0x80)) ++at;
  ASSERT_LT(at + 2, text.size()) << "the model's answer is too short for this test: " << text;
  size_t len = 1;
  while (at + len < text.size() && len < 3 && !(static_cast<unsigned char>(text[at + len]) & 0x80)) ++len;
  const std::string stop = text.substr(at, len);
  const std::string want = text.substr(0, text.find(stop));
  for (bool stream : {false, true}) {
    json b = completion_body("stop strings", 60, stream);
    b["stop"] = json::array({"never-in-the-output-\xE2\x82\xAC", stop});
    if (!stream) {
      auto r = post_json(s.port, "/v1/completions", b.dump());
      ASSERT_EQ(r.status, 200) << r.raw;
      EXPECT_EQ(r.body["choices"][0]["text"], want) << "stop " << json(stop).dump();
      EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
    } else {
      Streamed st = parse_stream(post_sse(s.port, "/v1/completions", b), false);
      EXPECT_EQ(st.text, want);
      EXPECT_EQ(st.finish, "stop");
    }
  }
  // A single string works too.
  json b = completion_body("stop strings", 60);
  b["stop"] = stop;
  auto r = post_json(s.port, "/v1/completions", b.dump());
  EXPECT_EQ(r.body["choices"][0]["text"], want);
}

TEST(ServeApi, LogprobsAreNormalisedAndTopSorted) {
  TestServer s;
  json b = chat_body("lp", 4);
  b["logprobs"] = true;
  b["top_logprobs"] = 3;
  auto r = post_json(s.port, "/v1/chat/completions", b.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  const auto& content = r.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (const auto& e : content) {
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_FLOAT_EQ(e["logprob"].get<float>(), e["top_logprobs"][0]["logprob"].get<float>());
    EXPECT_LE(e["logprob"].get<float>(), 0.0f);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<float>(), e["top_logprobs"][1]["logprob"].get<float>());
  }
  json c = completion_body("lp", 2);
  c["logprobs"] = 2;
  r = post_json(s.port, "/v1/completions", c.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["logprobs"]["token_logprobs"].size(), 2u);
  EXPECT_EQ(r.body["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
}

TEST(ServeApi, ModelsHealthMetricsTemplateAndPage) {
  TestServer s;
  auto m = get_json(s.port, "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.body["data"][0]["id"], "tiny");
  auto h = get_json(s.port, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body["status"], "ok");
  EXPECT_EQ(h.body["lane"]["name"], "local");
  auto t = post_json(s.port, "/apply-template",
                     json{{"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}}}
                         .dump());
  ASSERT_EQ(t.status, 200) << t.raw;
  EXPECT_EQ(t.body["prompt"], "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  t = post_json(s.port, "/apply-template",
                json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", false}}.dump());
  EXPECT_EQ(t.body["prompt"], "<|im_start|>user\nhi<|im_end|>\n");
  ASSERT_EQ(post_json(s.port, "/v1/chat/completions", chat_body("m", 2).dump()).status, 200);
  auto c = s.client();
  // The request counter is written by the access logger, after the answer went out: wait for it.
  auto metrics = c.Get("/metrics");
  for (int i = 0; i < 200 && metrics && metrics->body.find("/v1/chat/completions\",status=\"200\"} 1") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    metrics = c.Get("/metrics");
  }
  ASSERT_TRUE(metrics);
  for (const char* want : {"tandem_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
                           "tandem_generated_tokens_total 2", "tandem_answers_total{finish=\"length\"} 1", "tandem_time_to_first_token_seconds_count 1",
                           "tandem_time_per_output_token_seconds_count 1", "tandem_running_sequences 0",
                           "tandem_kv_blocks{state=\"free\"}", "tandem_lane_serving{lane=\"local\",state=\"serving\"} 1"})
    EXPECT_NE(metrics->body.find(want), std::string::npos) << want << "\n" << metrics->body;
  // The operator's page at /, the bytes compiled into the binary, without the API key.
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->body, std::string(server::page_index_html()));
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
}

// Each bad request gets its 4xx in OpenAI's shape, and the server keeps serving.
TEST(ServeApi, BadRequestsGetTheirStatusAndTheServerKeepsServing) {
  TestServer s;
  auto expect_error = [&](int status, const std::string& path, const std::string& body, const std::string& what) {
    auto r = post_json(s.port, path, body);
    EXPECT_EQ(r.status, status) << what << ": " << r.raw;
    ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << what << ": " << r.raw;
    for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(r.body["error"].contains(k)) << what << " " << k;
    EXPECT_FALSE(r.body["error"]["message"].get<std::string>().empty());
  };
  const std::string chat = "/v1/chat/completions";
  // An answer streams meanwhile, and must come out whole and as it does alone.
  const json other = completion_body("the others keep being served", 150);
  auto alone = post_json(s.port, "/v1/completions", other.dump());
  ASSERT_EQ(alone.status, 200) << alone.raw;
  json streamed_body = other;
  streamed_body["stream"] = true;
  Streamed streamed;
  std::thread meanwhile([&] { streamed = parse_stream(post_sse(s.port, "/v1/completions", streamed_body), false); });
  expect_error(400, chat, "{\"messages\": [", "malformed JSON");
  expect_error(400, chat, "[1, 2]", "not an object");
  expect_error(400, chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}", "invalid UTF-8");
  json b = chat_body("x", 4);
  b["temperature"] = "hot";
  expect_error(400, chat, b.dump(), "temperature as a string");
  b = chat_body("x", 4);
  b["messages"] = "hello";
  expect_error(400, chat, b.dump(), "messages as a string");
  b = chat_body("x", -1);
  expect_error(400, chat, b.dump(), "negative max_tokens");
  b = chat_body("x", 0);
  expect_error(400, chat, b.dump(), "zero max_tokens");
  b = chat_body("x", int64_t(1) << 40);
  expect_error(400, chat, b.dump(), "huge max_tokens");
  b = chat_body("x", 4);
  b["n"] = 2;
  expect_error(400, chat, b.dump(), "n = 2");
  b = chat_body("x", 4);
  b["stop"] = json::array({"a", "b", "c", "d", "e"});
  expect_error(400, chat, b.dump(), "five stop strings");
  b = chat_body(std::string(300, 'a'), 4);  // 300 byte tokens + the template: past the 256-token context
  expect_error(400, chat, b.dump(), "prompt over the context");
  expect_error(400, "/v1/completions", completion_body(std::string(250, 'a'), 10).dump(), "prompt + max_tokens over the context");
  expect_error(400, "/v1/completions", json{{"prompt", {1, -5}}}.dump(), "negative token id");
  expect_error(400, "/v1/completions", json{{"prompt", {1, 100000}}}.dump(), "token id past the vocab");
  b = chat_body("x", 4);
  b["model"] = "gpt-17";
  expect_error(404, chat, b.dump(), "unknown model");
  expect_error(404, "/v1/nothing-here", "{}", "unknown path");
  expect_error(413, chat, std::string(10 << 20, ' '), "a 10 MB body");
  // Still serving.
  auto ok = post_json(s.port, chat, chat_body("still there?", 3).dump());
  EXPECT_EQ(ok.status, 200) << ok.raw;
  meanwhile.join();
  EXPECT_EQ(streamed.finish, "length");
  EXPECT_EQ(streamed.text, alone.body["choices"][0]["text"].get<std::string>());
}

TEST(ServeApi, ApiKey) {
  server::ServerOptions o;
  o.api_key = "sesame";
  TestServer s(o);
  const std::string body = chat_body("k", 2).dump();
  auto r = post_json(s.port, "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_TRUE(r.body["error"].contains("message"));
  r = post_json(s.port, "/v1/chat/completions", body, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(get_json(s.port, "/v1/models").status, 401);
  r = post_json(s.port, "/v1/chat/completions", body, {{"Authorization", "Bearer sesame"}});
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(get_json(s.port, "/health").status, 200);  // health stays open for load balancers
}

TEST(ServeApi, QueueFullIs429) {
  server::ServerOptions o;
  o.scheduler.max_seqs = 1;
  o.scheduler.max_queue = 0;
  TestServer s(o, 2048);
  // One long answer holds the only sequence; the next request finds no room and no queue.
  // (its answer ends with an error when the server stops: no byte limit, and no check of the ending)
  std::thread holder([&] { post_sse(s.port, "/v1/completions", completion_body("hold", 1500, true), SIZE_MAX); });
  for (int i = 0; i < 2000 && s.srv->scheduler().snapshot().running == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(s.srv->scheduler().snapshot().running, 1);
  auto r = post_json(s.port, "/v1/completions", completion_body("no room", 2).dump());
  EXPECT_EQ(r.status, 429) << r.raw;
  EXPECT_EQ(r.body["error"]["type"], "rate_limit_error");
  s.srv->stop();  // ends the holder's answer
  holder.join();
}

}  // namespace
}  // namespace tandem::test
