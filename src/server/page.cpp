// The page's bytes, from the .cpp that cmake/embed.cmake generates out of src/server/page/index.html.
#include "server/page.h"

#include <cstddef>

namespace tandem::embedded {
extern const unsigned char page_index_html[];
extern const std::size_t page_index_html_size;
}  // namespace tandem::embedded

namespace tandem::server {

std::string_view page_index_html() {
  return {reinterpret_cast<const char*>(embedded::page_index_html), embedded::page_index_html_size};
}

}  // namespace tandem::server
