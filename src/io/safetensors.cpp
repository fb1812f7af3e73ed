// safetensors: header validation, read-only mapping, model-folder stores and a streaming writer
// (see safetensors.h). All offsets are checked in uint64 with explicit overflow tests, so a hostile
// header can only ever produce an InputError, never an out-of-bounds view.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace tandem {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; so is this reader");

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kAlign = alignof(uint64_t);  // every dtype's size divides 8

std::string_view json_type(const json& j) { return j.type_name(); }

// A JSON integer that fits uint64 (not a float, not negative), else nullopt.
std::optional<uint64_t> as_u64(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v >= 0) return uint64_t(v);
  }
  return std::nullopt;
}

// A short, UTF-8-safe rendering of a JSON value for error messages.
std::string show(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A parser message with the raw bytes it quotes made printable (they may be any binary garbage).
std::string printable(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return out;
}

TensorInfo parse_entry(const std::string& name, const json& e, uint64_t data_size, std::string_view source) {
  if (!e.is_object())
    fail("{}: tensor '{}' must be a JSON object with dtype, shape and data_offsets, found {}", source, name,
         json_type(e));
  TensorInfo t;
  t.name = name;

  auto dt = e.find("dtype");
  if (dt == e.end()) fail("{}: tensor '{}' has no \"dtype\"", source, name);
  if (!dt->is_string()) fail("{}: tensor '{}' dtype must be a string, found {}", source, name, show(*dt));
  auto dtype = dtype_from_name(dt->get_ref<const std::string&>());
  if (!dtype)
    fail("{}: tensor '{}' has unknown dtype {} (expected F32, F16, BF16, F64, I8, U8, I16, I32, I64, BOOL or F8_E4M3)",
         source, name, show(*dt));
  t.dtype = *dtype;

  auto sh = e.find("shape");
  if (sh == e.end()) fail("{}: tensor '{}' has no \"shape\"", source, name);
  if (!sh->is_array()) fail("{}: tensor '{}' shape must be an array, found {}", source, name, show(*sh));
  if (sh->size() > size_t(kMaxDims))
    fail("{}: tensor '{}' shape has {} dims, at most {} are supported", source, name, sh->size(), kMaxDims);
  // Size checked over the non-zero dims, so numel() and nbytes() can never overflow on any view,
  // whatever order the dims come in; a zero dim then makes the tensor empty.
  uint64_t nbytes = dtype_size(t.dtype);
  bool overflow = false, any_zero = false;
  for (const json& d : *sh) {
    auto v = as_u64(d);
    if (!v || *v > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{}: tensor '{}' shape {} must hold non-negative integers, found {}", source, name, show(*sh), show(d));
    t.shape.dims[t.shape.ndim++] = int64_t(*v);
    any_zero = any_zero || *v == 0;
    if (*v != 0) overflow = overflow || __builtin_mul_overflow(nbytes, *v, &nbytes);
  }
  if (overflow || nbytes > uint64_t(std::numeric_limits<int64_t>::max()))
    fail("{}: tensor '{}' shape {} overflows: its byte size does not fit 63 bits", source, name, t.shape.str());
  if (any_zero) nbytes = 0;

  auto off = e.find("data_offsets");
  if (off == e.end()) fail("{}: tensor '{}' has no \"data_offsets\"", source, name);
  if (!off->is_array() || off->size() != 2)
    fail("{}: tensor '{}' data_offsets must be [begin, end], found {}", source, name, show(*off));
  auto begin = as_u64((*off)[0]), end = as_u64((*off)[1]);
  if (!begin || !end)
    fail("{}: tensor '{}' data_offsets must be non-negative integers, found {}", source, name, show(*off));
  if (*begin > *end)
    fail("{}: tensor '{}' data_offsets [{}, {}] end before they begin", source, name, *begin, *end);
  t.begin = *begin;
  t.end = *end;
  if (t.end - t.begin != nbytes)
    fail("{}: tensor '{}' is {} {} = {} bytes, but its data_offsets [{}, {}] span {} bytes", source, name,
         dtype_name(t.dtype), t.shape.str(), nbytes, t.begin, t.end, t.end - t.begin);
  if (t.end > data_size)
    fail("{}: tensor '{}' data_offsets [{}, {}] run past the end of the file (data area holds {} bytes; "
         "file truncated?)",
         source, name, t.begin, t.end, data_size);
  return t;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, uint64_t file_size,
                                           std::string_view source) {
  if (file_size == 0) fail("{}: empty file, not a safetensors file", source);
  if (file_size < 8 || size < 8)
    fail("{}: file is {} bytes, too short for the 8-byte safetensors header length (truncated?)", source,
         file_size);
  SafetensorsHeader h;
  std::memcpy(&h.header_len, data, 8);
  if (h.header_len > kSafetensorsMaxHeader)
    fail("{}: header length {} exceeds the {} byte (100 MB) limit; not a safetensors file?", source,
         h.header_len, kSafetensorsMaxHeader);
  if (8 + h.header_len > file_size)
    fail("{}: header length {} runs past the end of the file ({} bytes; truncated?)", source, h.header_len,
         file_size);
  if (8 + h.header_len > size)
    fail("{}: only {} bytes of the {}-byte header were read", source, size - 8, h.header_len);
  uint64_t data_size = file_size - 8 - h.header_len;

  json j;
  try {
    j = json::parse(data + 8, data + 8 + h.header_len);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", source, printable(e.what()));
  }
  if (!j.is_object()) fail("{}: header must be a JSON object, found {}", source, json_type(j));

  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail("{}: __metadata__ must be an object of strings, found {}", source, json_type(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail("{}: __metadata__ entry '{}' must be a string, found {}", source, mk, show(mv));
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, data_size, source));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin < expected)
      fail("{}: tensor '{}' data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", source, t.name, t.begin, t.end,
           prev->name, prev->begin, prev->end);
    if (t.begin > expected)
      fail("{}: gap of {} bytes before tensor '{}' (data_offsets begin at {}, expected {})", source,
           t.begin - expected, t.name, t.begin, expected);
    expected = t.end;
    prev = &t;
  }
  if (expected != data_size)
    fail("{}: tensors cover {} bytes but the data area holds {} bytes ({} trailing bytes belong to no tensor)",
         source, expected, data_size, data_size - expected);
  return h;
}

// ---- SafetensorsFile ----

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{} is not a regular file", path);
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_size_ = size_t(st.st_size);
  if (f->map_size_ > 0) {
    void* p = mmap(nullptr, f->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      f->map_size_ = 0;
      fail("cannot map {}: {}", path, std::strerror(err));
    }
    f->map_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);

  f->header_ = parse_safetensors_header(f->map_, f->map_size_, f->map_size_, path);
  const uint8_t* area = f->map_ ? f->map_ + 8 + f->header_.header_len : nullptr;
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) {
    const TensorInfo& t = f->header_.tensors[i];
    f->index_.emplace(t.name, i);
    const uint8_t* src = area + t.begin;
    size_t nbytes = size_t(t.end - t.begin);
    if (reinterpret_cast<uintptr_t>(src) % dtype_size(t.dtype) != 0 && nbytes > 0) {
      f->copies_.emplace_back(new uint64_t[(nbytes + kAlign - 1) / kAlign]);
      std::memcpy(f->copies_.back().get(), src, nbytes);
      src = reinterpret_cast<const uint8_t*>(f->copies_.back().get());
    }
    f->data_.push_back(src);
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), map_size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  size_t i = size_t(&info - header_.tensors.data());
  TANDEM_ASSERT(&info >= header_.tensors.data() && i < header_.tensors.size(),
                "view() of tensor '{}' that is not from {}", info.name, path_);
  TensorView v;
  v.data = data_[i];
  v.dtype = info.dtype;
  v.shape = info.shape;
  return v;
}

// ---- TensorStore ----

void TensorStore::add_file(std::shared_ptr<SafetensorsFile> file) {
  size_t index = files_.size();
  files_.push_back(file);
  for (const TensorInfo& t : file->header().tensors) {
    auto [it, inserted] = tensors_.emplace(t.name, Entry{file->view(t), index});
    if (!inserted)
      fail("tensor '{}' appears in both {} and {}", t.name, files_[it->second.file_index]->path(), file->path());
  }
}

TensorStore TensorStore::open_file(const std::string& path) {
  TensorStore s;
  s.source_ = path;
  s.add_file(SafetensorsFile::open(path));
  return s;
}

TensorStore TensorStore::open_dir(const std::string& dir) {
  std::error_code ec;
  auto st = fs::status(dir, ec);
  if (!fs::exists(st)) fail("model folder {} does not exist", dir);
  if (!fs::is_directory(st)) fail("{} is not a folder (expected a model folder with *.safetensors)", dir);
  TensorStore s;
  s.source_ = dir;
  fs::path root(dir);

  if (fs::exists(root / "model.safetensors")) {
    s.add_file(SafetensorsFile::open((root / "model.safetensors").string()));
    return s;
  }

  fs::path index_path = root / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    std::string ipath = index_path.string();
    std::ifstream in(index_path, std::ios::binary);
    if (!in) fail("cannot open {}: {}", ipath, std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    json j;
    try {
      j = json::parse(text.str());
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", ipath, printable(e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: expected an object with a \"weight_map\" object of tensor name -> shard file", ipath);
    const json& map = j["weight_map"];
    if (map.empty()) fail("{}: weight_map lists no tensors", ipath);
    std::map<std::string, std::vector<std::string>> by_shard;  // shard -> listed tensors
    for (const auto& [name, shard] : map.items()) {
      if (!shard.is_string())
        fail("{}: weight_map entry '{}' must be a shard file name, found {}", ipath, name, show(shard));
      const std::string& file = shard.get_ref<const std::string&>();
      if (file.empty() || fs::path(file).is_absolute() || file.find("..") != std::string::npos)
        fail("{}: weight_map entry '{}' names shard '{}', expected a file name inside {}", ipath, name, file, dir);
      by_shard[file].push_back(name);
    }
    for (const auto& [shard, names] : by_shard) {
      fs::path p = root / shard;
      if (!fs::is_regular_file(p))
        fail("{}: weight_map names shard '{}' (for tensor '{}'), but {} does not exist", ipath, shard, names[0],
             p.string());
      auto file = std::shared_ptr<SafetensorsFile>(SafetensorsFile::open(p.string()));
      for (const std::string& name : names)
        if (!file->find(name))
          fail("{}: tensor '{}' is listed in shard {}, but that shard does not contain it", ipath, name,
               p.string());
      s.add_file(std::move(file));
    }
    return s;
  }

  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file()) shards.push_back(e.path());
  if (ec) fail("cannot list {}: {}", dir, ec.message());
  if (shards.empty())
    fail("{}: no model.safetensors, model.safetensors.index.json or *.safetensors file in this folder", dir);
  std::sort(shards.begin(), shards.end());
  for (const auto& p : shards) s.add_file(SafetensorsFile::open(p.string()));
  return s;
}

const TensorView* TensorStore::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.view;
}

TensorView TensorStore::require(std::string_view name, std::initializer_list<int64_t> shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("tensor '{}' missing from {}", name, source_);
  const TensorView& v = it->second.view;
  const std::string& file = files_[it->second.file_index]->path();
  Shape want(shape);
  if (!(v.shape == want))
    fail("tensor '{}' in {} has shape {}, expected {}", name, file, v.shape.str(), want.str());
  if (!dtype_is_float_weight(v.dtype))
    fail("tensor '{}' in {} has dtype {}, expected a float dtype (F32, BF16 or F16){}", name, file,
         dtype_name(v.dtype),
         v.dtype == DType::kF8E4M3 ? " (FP8 is read for attention, MLP and expert projections only)" : "");
  return v;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;
}

const std::string& TensorStore::file_of(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? source_ : files_[it->second.file_index]->path();
}

size_t TensorStore::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, entry] : tensors_) n += entry.view.nbytes();
  return n;
}

// ---- writer ----

namespace {

// Owns the temporary file until commit(); removes it on any failure.
class TempFile {
 public:
  explicit TempFile(const std::string& path) : path_(path), tmp_(path + ".tmp." + std::to_string(getpid())) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot write {}: {}", path_, std::strerror(errno));
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  // Refuses before the first byte when the file system cannot hold `bytes` (a synthetic model of tens
  // of GB would otherwise fail at the end of its write, after minutes, having filled the disk).
  void reserve(uint64_t bytes) {
    struct statvfs st {};
    if (::fstatvfs(fd_, &st) != 0) return;  // unknown: the writes still report a full disk
    const uint64_t avail = uint64_t(st.f_bavail) * st.f_frsize;
    if (bytes > avail)
      fail("cannot write {}: it takes {:.2f} GB and its file system has {:.2f} GB free", path_, double(bytes) / 1e9,
           double(avail) / 1e9);
  }
  void write(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("cannot write {}: {}", path_, std::strerror(w < 0 ? errno : ENOSPC));
      c += w;
      n -= size_t(w);
    }
  }
  void commit() {
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) fail("cannot write {}: {}", path_, std::strerror(errno));
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
      fail("cannot write {}: rename from {} failed: {}", path_, tmp_, std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  json meta = json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  if (!meta.contains("format")) meta["format"] = "pt";
  header["__metadata__"] = meta;

  std::vector<uint64_t> sizes;
  uint64_t offset = 0, largest = 0;
  for (const TensorSpec& t : tensors) {
    TANDEM_ASSERT(t.fill != nullptr, "tensor '{}' has no fill callback", t.name);
    if (t.name == "__metadata__" || header.contains(t.name))
      fail("cannot write {}: tensor name '{}' is {}", path, t.name,
           t.name == "__metadata__" ? "reserved" : "used twice");
    uint64_t nbytes = dtype_size(t.dtype);
    json shape = json::array();
    for (int i = 0; i < t.shape.ndim; ++i) {
      if (t.shape[i] < 0) fail("cannot write {}: tensor '{}' has negative shape {}", path, t.name, t.shape.str());
      shape.push_back(t.shape[i]);
      if (__builtin_mul_overflow(nbytes, uint64_t(t.shape[i]), &nbytes))
        fail("cannot write {}: tensor '{}' shape {} overflows", path, t.name, t.shape.str());
    }
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    largest = std::max(largest, nbytes);
    sizes.push_back(nbytes);
  }

  std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  text.append((kAlign - (8 + text.size()) % kAlign) % kAlign, ' ');
  uint64_t header_len = text.size();

  TempFile out(path);
  out.reserve(8 + header_len + offset);
  out.write(&header_len, 8);
  out.write(text.data(), text.size());
  std::vector<uint8_t> buffer(size_t(std::max<uint64_t>(largest, 1)));  // never a null dst
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].fill(buffer.data(), size_t(sizes[i]));
    out.write(buffer.data(), size_t(sizes[i]));
  }
  out.commit();
}

}  // namespace tandem
