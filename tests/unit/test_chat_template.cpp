// Chat template tests: the 96 fixture cases of tests/fixtures/chat_templates (four real templates,
// rendered by jinja2 as transformers does) byte for byte, including the two where the template raises.
// The interpreter's pieces are in test_chat_template_pieces.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <set>

#include "chat/chat_template.h"
#include "test_util.h"

namespace tandem {
namespace {

using nlohmann::ordered_json;

const std::string kFixtureDir = TANDEM_SOURCE_DIR "/tests/fixtures/chat_templates";

// Reads a fixture file; a missing one fails the test by name (never a skip).
bool read_fixture(const std::string& name, std::string* out) {
  std::string path = kFixtureDir + "/" + name;
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "missing fixture file: " << path;
    return false;
  }
  *out = test::read_file(path);
  return true;
}

// strftime_now's clock as the fixtures were made: 2026-12-02 09:30.
std::tm fixture_now() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 11;
  tm.tm_mday = 2;
  tm.tm_hour = 9;
  tm.tm_min = 30;
  tm.tm_wday = 3;
  tm.tm_yday = 335;
  return tm;
}

TEST(ChatTemplateFixture, AllCasesMatchTransformers) {
  std::string text;
  ASSERT_TRUE(read_fixture("cases.json", &text));
  ordered_json cases = ordered_json::parse(text);
  ASSERT_EQ(cases.size(), 96u);
  std::map<std::string, chat::ChatTemplate> templates;
  std::set<std::string> missing;
  chat::RenderOptions options;
  options.now = fixture_now;
  int passed = 0;
  for (const auto& c : cases) {
    const std::string id = c.at("id").get<std::string>();
    const std::string name = c.at("template").get<std::string>();
    if (missing.count(name)) continue;  // reported once
    if (!templates.count(name)) {
      std::string source;
      if (!read_fixture(name, &source)) {
        missing.insert(name);
        continue;
      }
      templates.emplace(name, chat::ChatTemplate::parse(source, name));
    }
    const auto& tmpl = templates.at(name);
    ordered_json tools = c.contains("tools") ? c["tools"] : ordered_json();
    ordered_json extra = c.contains("extra") ? c["extra"] : ordered_json::object();
    auto render = [&] {
      return chat::render_chat(tmpl, c.at("messages"), tools, c.at("add_generation_prompt").get<bool>(), extra,
                               c.at("bos_token").get<std::string>(), c.at("eos_token").get<std::string>(), options);
    };
    if (c.contains("error")) {
      std::string want = c["error"].get<std::string>();
      const std::string prefix = "TemplateError: ";
      if (want.starts_with(prefix)) want = want.substr(prefix.size());
      try {
        std::string got = render();
        ADD_FAILURE() << id << ": expected the error \"" << want << "\", rendered " << ordered_json(got).dump();
      } catch (const chat::ChatTemplateError& e) {
        EXPECT_TRUE(e.raised()) << id << ": " << e.what();
        EXPECT_EQ(e.message(), want) << id;
        if (e.raised() && e.message() == want) ++passed;
      }
      continue;
    }
    std::string want = c.at("expected").get<std::string>();
    try {
      std::string got = render();
      EXPECT_EQ(got, want) << id << "\n want " << ordered_json(want).dump() << "\n got  " << ordered_json(got).dump();
      if (got == want) ++passed;
    } catch (const std::exception& e) {
      ADD_FAILURE() << id << ": " << e.what();
    }
  }
  EXPECT_EQ(passed, 96);
}

}  // namespace
}  // namespace tandem
