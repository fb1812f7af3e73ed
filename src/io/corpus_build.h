// Building a JSON-lines corpus ({"kind", "name", "text"} a line, what `tandem profile` reads) from
// text files and folders: `tandem corpus`. A document's kind comes from its file extension or from one
// kind given for all. Only UTF-8 text goes in: a binary file or one that is not UTF-8 is skipped with
// a note, never written (the JSON writer would reject it, and its bytes are not text to profile).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/corpus.h"

namespace tandem {

// The kind of a file by its extension (case-insensitive): prose (.md .txt .rst), code_python (.py),
// code_c (.c .h .cc .cpp .cxx .hpp .hh .cu .cuh), json (.json .jsonl), shell (.sh .bash), and a few
// more listed in corpus_build.cpp. nullopt for an extension not in the table.
std::optional<std::string> corpus_kind_for_path(std::string_view path);

// The extension table as text, for help and error messages: "prose: .md .txt .rst; ...".
std::string corpus_kind_table();

// "" for UTF-8 text without NUL bytes; otherwise why the bytes are not text ("NUL byte at 12",
// "not UTF-8 at byte 40").
std::string why_not_text(std::string_view bytes);

struct CorpusBuildOptions {
  std::string kind;          // one kind for every file ("" = by extension)
  int64_t max_file_bytes = 0;  // larger files are skipped with a note (0 = no limit)
};

struct CorpusBuild {
  std::vector<CorpusDoc> docs;     // in the order found (inputs in order; a folder's files sorted by path)
  std::vector<std::string> notes;  // one line per file or group of files skipped, and why
};

// Reads `inputs` (files, or folders walked recursively; hidden entries such as .git are skipped).
// A file named directly whose kind cannot be told is an InputError (give --kind); in a folder such
// files are skipped and counted in a note. An input that does not exist or a file that cannot be read
// is an InputError naming it. No documents at all is an InputError that says what was skipped.
CorpusBuild build_corpus(const std::vector<std::string>& inputs, const CorpusBuildOptions& options);

// One JSON-lines record, with its newline.
std::string corpus_line(const CorpusDoc& doc);

}  // namespace tandem
