// The operator's page that `tandem serve` answers at `/`: the lane at a glance (state, throughput,
// waits, KV use, cold share; refreshed from /metrics and /health) and a chat box that streams from
// /v1/chat/completions. Its source is src/server/page/index.html (HTML, CSS and JS in one file, no
// CDN); cmake/embed.cmake compiles its bytes into the binary, so a server needs no files beside it.
#pragma once

#include <string_view>

namespace tandem::server {

// The page, byte for byte as checked in (UTF-8 HTML, text/html). Valid for the program's life.
std::string_view page_index_html();

}  // namespace tandem::server
