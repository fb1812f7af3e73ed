// The operator's page compiled into the binary (cmake/embed.cmake): the bytes `tandem serve` answers at
// `/` are the checked-in src/server/page/index.html, whole, and the page loads nothing from outside
// the server (issue 28: no CDN), so it works on a machine without the internet.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "server/page.h"
#include "test_util.h"

namespace tandem {
namespace {

TEST(Page, EmbeddedBytesEqualTheSourceFile) {
  const std::string source = test::read_file(TANDEM_SOURCE_DIR "/src/server/page/index.html");
  const std::string_view page = server::page_index_html();
  ASSERT_EQ(page.size(), source.size()) << "rebuild: the embedded page is stale";
  EXPECT_TRUE(page == source);
  EXPECT_EQ(page.data()[page.size()], '\0') << "embed.cmake ends the bytes with one 0 (not counted)";
  EXPECT_EQ(page.substr(0, 15), "<!doctype html>");
}

TEST(Page, LoadsNothingFromOutsideTheServer) {
  const std::string page(server::page_index_html());
  // src=, href=, url(), fetch(), import and @import naming a scheme or a protocol-relative host.
  const std::regex external(R"((src|href)\s*=\s*["']?\s*(https?:)?//|url\(\s*["']?\s*(https?:)?//|)"
                            R"(fetch\(\s*["'`](https?:)?//|import[^;\n]*["'](https?:)?//)",
                            std::regex::icase);
  std::smatch m;
  EXPECT_FALSE(std::regex_search(page, m, external)) << "the page loads from outside: " << m.str();
  // Its own endpoints are asked for by relative URLs, so a proxy may serve it under a path prefix.
  for (const char* rel : {"fetch(\"metrics\"", "fetch(\"health\"", "fetch(\"v1/models\"", "fetch(\"v1/chat/completions\""})
    EXPECT_NE(page.find(rel), std::string::npos) << rel;
}

}  // namespace
}  // namespace tandem
