// `tandem serve` as a user starts it: the local lane with --chat-template-file and --api-key, one
// access-log line per request on stderr, a clean exit on SIGTERM; and a peer lane whose peer cannot
// start fails at once with exit code 2, leaving no process or lane behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "lane_tools/process.h"
#include "serve_harness.h"
#include "test_util.h"

namespace tandem::test {
namespace {

using nlohmann::json;

int port_in(const std::string& log) {
  const std::string key = "listening on http://127.0.0.1:";
  const size_t at = log.find(key);
  return at == std::string::npos ? 0 : std::atoi(log.c_str() + at + key.size());
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ServeCli, LocalLaneWithATemplateFileAndAKey) {
  TempDir dir;
  const std::string tmpl = dir.file("template.jinja");
  write_file(tmpl,
             "{%- for m in messages %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}"
             "{%- if add_generation_prompt %}[ASSISTANT] {% endif %}");
  Child srv = spawn({tandem_binary(), "serve", "--model", tiny_model_dir(), "--port", "0", "--threads", "1",
                     "--chat-template-file", tmpl, "--api-key", "k3y", "--ctx", "256"},
                    dir.file("serve.out"), dir.file("serve.err"));
  auto log = [&] { return read_file(dir.file("serve.err")); };
  ASSERT_TRUE(wait_until([&] { return port_in(log()) > 0; }, 30)) << log();
  const int port = port_in(log());
  ASSERT_TRUE(wait_until([&] { return get_json(port, "/health").status == 200; }, 60)) << log();
  const httplib::Headers key = {{"Authorization", "Bearer k3y"}};
  // The served model is named after its folder.
  auto models = get_json(port, "/v1/models", key);
  ASSERT_EQ(models.status, 200) << models.raw;
  const std::string name = models.body["data"][0]["id"];
  EXPECT_EQ(name, std::filesystem::path(tiny_model_dir()).filename().string());

  const json messages = {{{"role", "system"}, {"content", "terse"}}, {{"role", "user"}, {"content", "hi"}}};
  auto t = post_json(port, "/apply-template", json{{"messages", messages}}.dump(), key);
  ASSERT_EQ(t.status, 200) << t.raw;
  const std::string prompt = "[SYSTEM] terse\n[USER] hi\n[ASSISTANT] ";
  EXPECT_EQ(t.body["prompt"], prompt);
  EXPECT_EQ(post_json(port, "/apply-template", json{{"messages", messages}}.dump()).status, 401);

  json chat = {{"model", name}, {"messages", messages}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};
  auto c = post_json(port, "/v1/chat/completions", chat.dump(), key);
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["usage"]["prompt_tokens"], tiny_tokenizer().encode(prompt).size());
  EXPECT_EQ(c.body["usage"]["completion_tokens"], 4);

  kill(srv.pid, SIGTERM);
  ASSERT_TRUE(wait_exit(srv, 30)) << "serve did not stop on SIGTERM";
  EXPECT_EQ(srv.exit_code, 0) << log();
  // One access line per request (health checks at debug level), with its status and tokens.
  const std::string text = log();
  EXPECT_EQ(count(text, "access method=POST path=/apply-template status=200"), 1u) << text;
  EXPECT_EQ(count(text, "access method=POST path=/apply-template status=401"), 1u) << text;
  EXPECT_EQ(count(text, "access method=GET path=/v1/models status=200"), 1u) << text;
  EXPECT_EQ(count(text, "access method=POST path=/v1/chat/completions status=200"), 1u) << text;
  EXPECT_NE(text.find("completion_tokens=4 finish=length"), std::string::npos) << text;
}

TEST(ServeCli, APeerThatCannotStartFailsAtOnce) {
  TempDir dir;
  // A broken rowmap: neither the peer serve starts nor serve itself can use it; serve must say so at
  // once (exit 2, naming the file) and stop its peer and watchdog.
  const std::string rowmap = dir.file("broken.rowmap.json");
  write_file(rowmap, "not a rowmap");
  Child srv = spawn({tandem_binary(), "serve", "--model", tiny_model_dir(), "--port", "0", "--threads", "1",
                     "--peer-threads", "1", "--lane", "peer", "--rowmap", rowmap},
                    dir.file("serve.out"), dir.file("serve.err"));
  ASSERT_TRUE(wait_exit(srv, 20)) << "serve kept waiting for a peer that cannot start";
  const std::string text = read_file(dir.file("serve.err"));
  EXPECT_EQ(srv.exit_code, 2) << text;
  EXPECT_NE(text.find(rowmap), std::string::npos) << "the error does not name the rowmap: " << text;
  const std::string prefix = "tandem-serve-" + std::to_string(srv.pid) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    EXPECT_NE(e.path().filename().string().rfind(prefix, 0), 0u) << "left behind: " << e.path();
}

}  // namespace
}  // namespace tandem::test
