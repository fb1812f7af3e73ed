// safetensors files, memory-mapped and used in place. The header is validated by the format's own
// rules before any tensor is handed out: 8-byte little-endian header length <= 100 MB and inside the
// file, a JSON object of {name: {dtype, shape, data_offsets}} (+ optional __metadata__ of strings),
// known dtypes, non-negative shapes whose byte size (overflow-checked) equals end - begin, and offsets
// that are contiguous from 0, non-overlapping and cover the data area exactly. Any violation is an
// InputError naming the file and the tensor. Every TensorView handed out is aligned for its dtype:
// tensors whose mapped bytes are misaligned (the format doesn't promise alignment; HF's writer and
// write_safetensors pad the header to 8 bytes, so it is rare) are copied once into aligned memory.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace tandem {

inline constexpr uint64_t kSafetensorsMaxHeader = 100u * 1000u * 1000u;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data area (after the header)
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t header_len = 0;                        // bytes of JSON after the 8-byte length
  std::vector<TensorInfo> tensors;                // sorted by begin offset
  std::map<std::string, std::string> metadata;    // __metadata__
};

// Parses and validates a header from the first bytes of a file. `data` holds at least
// min(size, 8 + header_len) bytes; `file_size` is the whole file's size. `source` names the file in
// errors. Pure function: the fuzz target calls it on arbitrary bytes.
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, uint64_t file_size,
                                           std::string_view source);

class SafetensorsFile {
 public:
  // Maps and validates the file. Throws InputError (naming the path) on any problem.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  // `info` must be one of header().tensors. Valid while this file lives.
  TensorView view(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<const uint8_t*> data_;                 // [tensors]: aligned bytes of each tensor
  std::vector<std::unique_ptr<uint64_t[]>> copies_;  // aligned copies of misaligned tensors
};

// All tensors of a model folder: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` (weight_map: name -> file; every listed tensor must exist in its
// shard), or else every *.safetensors file in the folder. A tensor name found twice is an error.
class TensorStore {
 public:
  static TensorStore open_dir(const std::string& dir);
  static TensorStore open_file(const std::string& path);

  // nullptr when absent.
  const TensorView* find(std::string_view name) const;
  // The tensor, which must exist with exactly this shape and a float dtype (F32/BF16/F16);
  // otherwise an InputError naming the tensor, its file, and what was expected.
  TensorView require(std::string_view name, std::initializer_list<int64_t> shape) const;
  bool has(std::string_view name) const { return find(name) != nullptr; }
  std::vector<std::string> names() const;
  // The file a tensor came from (for error messages); the store's folder or file when absent.
  const std::string& file_of(std::string_view name) const;
  size_t total_bytes() const;
  // The folder (open_dir) or file (open_file) the store was opened from.
  const std::string& source() const { return source_; }

 private:
  struct Entry {
    TensorView view;
    size_t file_index;
  };
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
  std::string source_;

  void add_file(std::shared_ptr<SafetensorsFile> file);  // all its tensors; a duplicate name fails
};

// Writes a safetensors file: header first, then each tensor's bytes produced by its `fill`
// callback (called once per tensor, in order, with a buffer of the tensor's byte size), so
// multi-gigabyte files stream through a buffer as large as the largest tensor. The header JSON
// (with __metadata__, plus "format": "pt" unless given) is padded with spaces so the data area starts
// at a multiple of 8 bytes. Written to a temporary name and renamed at the end, so `path` never holds a
// half-written file. Names must be unique (and not __metadata__); an unwritable path, or a file system
// without room for the whole file (checked before the first byte), is an InputError.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  Shape shape;
  std::function<void(uint8_t* dst, size_t nbytes)> fill;
};
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem
