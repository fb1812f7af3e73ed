// Text files and folders → JSON-lines corpus documents (see corpus_build.h).
#include "io/corpus_build.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/tokenizer_text.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct KindExtensions {
  const char* kind;
  std::vector<std::string_view> extensions;
};

// The five kinds of shared/corpus/public.jsonl first, then a few more that are common in a repository.
const std::vector<KindExtensions>& kind_table() {
  static const std::vector<KindExtensions> table = {
      {"prose", {".md", ".markdown", ".txt", ".rst", ".adoc"}},
      {"code_python", {".py", ".pyi"}},
      {"code_c", {".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".cu", ".cuh", ".inl"}},
      {"json", {".json", ".jsonl"}},
      {"shell", {".sh", ".bash", ".zsh"}},
      {"code_rust", {".rs"}},
      {"code_go", {".go"}},
      {"code_js", {".js", ".mjs", ".ts", ".jsx", ".tsx"}},
      {"code_java", {".java", ".kt"}},
      {"yaml", {".yaml", ".yml"}},
      {"toml", {".toml"}},
      {"html", {".html", ".htm"}},
  };
  return table;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.size() > 1 && name[0] == '.' && name != "..";
}

// Reads a whole file; InputError naming it when it cannot be opened or read.
std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}: {}", path.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read {}: read error", path.string());
  return ss.str();
}

struct Skipped {
  std::map<std::string, int64_t> unknown_ext;  // extension ("(none)" without one) → files
  std::vector<std::string> notes;
};

void add_file(const fs::path& path, bool named, const CorpusBuildOptions& o, CorpusBuild& out, Skipped& skipped) {
  std::string kind = o.kind;
  if (kind.empty()) {
    std::optional<std::string> k = corpus_kind_for_path(path.string());
    if (!k) {
      if (named)
        fail("{}: cannot tell its kind from the extension \"{}\"; give --kind NAME (known extensions: {})",
             path.string(), path.extension().string(), corpus_kind_table());
      const std::string ext = path.extension().empty() ? "(none)" : lower(path.extension().string());
      ++skipped.unknown_ext[ext];
      return;
    }
    kind = *k;
  }
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && o.max_file_bytes > 0 && size > uintmax_t(o.max_file_bytes)) {
    skipped.notes.push_back(fmt::format("skipped {}: {} bytes, over --max-file-bytes {}", path.string(), size,
                                        o.max_file_bytes));
    return;
  }
  std::string text = read_all(path);
  if (text.empty()) {
    skipped.notes.push_back(fmt::format("skipped {}: empty", path.string()));
    return;
  }
  if (std::string why = why_not_text(text); !why.empty()) {
    skipped.notes.push_back(fmt::format("skipped {}: binary, not text ({})", path.string(), why));
    return;
  }
  out.docs.push_back(CorpusDoc{std::move(kind), path.generic_string(), std::move(text)});
}

void add_folder(const fs::path& dir, const CorpusBuildOptions& o, CorpusBuild& out, Skipped& skipped) {
  std::vector<fs::path> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
  if (ec) fail("cannot read folder {}: {}", dir.string(), ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fail("cannot read folder {}: {}", dir.string(), ec.message());
    const fs::path& p = it->path();
    if (hidden(p)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) files.push_back(p);
  }
  if (ec) fail("cannot read folder {}: {}", dir.string(), ec.message());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) add_file(f, false, o, out, skipped);
}

}  // namespace

std::optional<std::string> corpus_kind_for_path(std::string_view path) {
  const std::string ext = lower(fs::path(path).extension().string());
  if (ext.empty()) return std::nullopt;
  for (const auto& k : kind_table())
    if (std::find(k.extensions.begin(), k.extensions.end(), ext) != k.extensions.end()) return std::string(k.kind);
  return std::nullopt;
}

std::string corpus_kind_table() {
  std::string s;
  for (const auto& k : kind_table()) {
    s += fmt::format("{}{}:", s.empty() ? "" : "; ", k.kind);
    for (auto e : k.extensions) s += fmt::format(" {}", e);
  }
  return s;
}

std::string why_not_text(std::string_view b) {
  for (size_t i = 0; i < b.size();) {
    if (b[i] == '\0') return fmt::format("NUL byte at {}", i);
    const size_t n = tok::utf8_valid_len(b, i);  // well-formed UTF-8 only: no overlong forms or surrogates
    if (n == 0) {
      // Cut off by the end of the file: what is there would start a valid character.
      const bool truncated = b.size() - i < 4 && tok::utf8_valid_len(std::string(b.substr(i)) + "\x80\x80\x80", 0) > 0;
      return fmt::format("not UTF-8 at byte {}{}", i, truncated ? " (truncated character)" : "");
    }
    i += n;
  }
  return "";
}

CorpusBuild build_corpus(const std::vector<std::string>& inputs, const CorpusBuildOptions& o) {
  if (inputs.empty()) fail("no input: give text files or folders");
  CorpusBuild out;
  Skipped skipped;
  for (const auto& in : inputs) {
    const fs::path p(in);
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st)) fail("{}: no such file or folder", in);
    if (fs::is_directory(st))
      add_folder(p, o, out, skipped);
    else
      add_file(p, true, o, out, skipped);
  }
  out.notes = std::move(skipped.notes);
  if (!skipped.unknown_ext.empty()) {
    int64_t files = 0;
    std::string exts;
    for (const auto& [ext, count] : skipped.unknown_ext) {
      files += count;
      exts += fmt::format("{}{} {}", exts.empty() ? "" : ", ", ext, count);
    }
    out.notes.push_back(fmt::format("skipped {} file(s) of no known kind ({}); --kind NAME takes every file", files, exts));
  }
  if (out.docs.empty()) {
    std::string why;
    for (const auto& n : out.notes) why += "\n  " + n;
    fail("no text documents found in {}{}", fmt::join(inputs, ", "), why.empty() ? "" : ":" + why);
  }
  return out;
}

std::string corpus_line(const CorpusDoc& doc) {
  nlohmann::json j = {{"kind", doc.kind}, {"name", doc.name}, {"text", doc.text}};
  return j.dump() + "\n";
}

}  // namespace tandem
