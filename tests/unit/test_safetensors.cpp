// safetensors: writer/reader round trip, the oracle fixture, sharded folders, and every malformed
// input the header validation must reject with an InputError that says what is wrong.
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace tandem {
namespace {

using test::TempDir;

// Runs `f`, which must throw an InputError whose message contains every word of `words`.
template <class F>
void expect_input_error(F&& f, std::initializer_list<std::string> words) {
  try {
    f();
    ADD_FAILURE() << "no InputError thrown; expected one mentioning '" << *words.begin() << "'";
  } catch (const InputError& e) {
    std::string msg = e.what();
    for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
  }
}

// A file made of an explicit header text and `data_bytes` bytes of data.
std::string raw_file(const std::string& header, size_t data_bytes) {
  uint64_t n = header.size();
  std::string s(reinterpret_cast<const char*>(&n), 8);
  s += header;
  s.append(data_bytes, '\x01');
  return s;
}

std::string write_raw(const TempDir& dir, const std::string& content, const std::string& name = "bad.safetensors") {
  std::string path = dir.file(name);
  test::write_file(path, content);
  return path;
}

TensorSpec f32_spec(const std::string& name, Shape shape, float base) {
  return {name, DType::kF32, shape, [base](uint8_t* dst, size_t n) {
            for (size_t i = 0; i < n / 4; ++i) {
              float v = base + float(i);
              std::memcpy(dst + 4 * i, &v, 4);
            }
          }};
}

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir dir;
  std::string path = dir.file("rt.safetensors");
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, 7.0f};
  std::vector<uint16_t> bf16, f16;
  for (float v : f32) {
    bf16.push_back(f32_to_bf16(v));
    f16.push_back(f32_to_f16(v));
  }
  std::vector<int32_t> i32 = {-7, 0, 42, 1 << 30};
  auto copy_from = [](const void* src) {
    return [src](uint8_t* dst, size_t n) {
      if (n > 0) std::memcpy(dst, src, n);
    };
  };
  write_safetensors(path,
                    {{"a.f32", DType::kF32, {2, 3}, copy_from(f32.data())},
                     {"b.bf16", DType::kBF16, {6}, copy_from(bf16.data())},
                     {"c.f16", DType::kF16, {3, 2}, copy_from(f16.data())},
                     {"d.i32", DType::kI32, {4}, copy_from(i32.data())},
                     {"e.empty", DType::kF32, {0, 5}, copy_from(nullptr)}},
                    {{"origin", "test"}});

  auto file = SafetensorsFile::open(path);
  EXPECT_EQ((8 + file->header().header_len) % 8, 0u) << "writer must pad the header to 8 bytes";
  EXPECT_EQ(file->header().metadata.at("origin"), "test");
  EXPECT_EQ(file->header().metadata.at("format"), "pt");
  ASSERT_EQ(file->header().tensors.size(), 5u);

  TensorView a = file->view(*file->find("a.f32"));
  EXPECT_EQ(a.shape, (Shape{2, 3}));
  EXPECT_EQ(to_f32(a), f32);
  TensorView b = file->view(*file->find("b.bf16"));
  EXPECT_EQ(b.dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(b.data, bf16.data(), bf16.size() * 2), 0);
  TensorView c = file->view(*file->find("c.f16"));
  EXPECT_EQ(std::memcmp(c.data, f16.data(), f16.size() * 2), 0);
  TensorView d = file->view(*file->find("d.i32"));
  EXPECT_EQ(d.dtype, DType::kI32);
  EXPECT_EQ(std::vector<int32_t>(d.as<int32_t>(), d.as<int32_t>() + 4), i32);
  EXPECT_EQ(file->view(*file->find("e.empty")).numel(), 0);
  EXPECT_EQ(file->find("nope"), nullptr);

  // The writer leaves no temporary file behind.
  size_t n_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) n_files += e.is_regular_file();
  EXPECT_EQ(n_files, 1u);
}

TEST(Safetensors, MisalignedDataAreaIsCopiedAligned) {
  // Header of 9 bytes: the data area starts at offset 17, misaligned for F32 in the mapping.
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - (8 + header.size()) % 8) % 8 + 1, ' ');
  std::string content = raw_file(header, 0);
  float vals[2] = {3.5f, -1.0f};
  content.append(reinterpret_cast<const char*>(vals), 8);
  TempDir dir;
  auto file = SafetensorsFile::open(write_raw(dir, content));
  TensorView v = file->view(*file->find("w"));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % alignof(float), 0u);
  EXPECT_EQ(to_f32(v), (std::vector<float>{3.5f, -1.0f}));
}

TEST(Safetensors, OracleFixtureThroughOpenDir) {
  TensorStore store = TensorStore::open_dir(test::oracle_dir("qwen3moe_f32"));
  ASSERT_TRUE(store.has("model.embed_tokens.weight"));
  const TensorView* emb = store.find("model.embed_tokens.weight");
  EXPECT_EQ(emb->shape.ndim, 2);
  EXPECT_EQ(emb->dtype, DType::kF32);
  TensorView again = store.require("model.embed_tokens.weight", {emb->shape[0], emb->shape[1]});
  EXPECT_EQ(again.data, emb->data);
  EXPECT_GT(store.total_bytes(), 0u);
  EXPECT_NE(store.file_of("model.embed_tokens.weight").find("model.safetensors"), std::string::npos);
  // Copies share the mapping, which outlives the original.
  const void* emb_data = emb->data;
  TensorStore copy = store;
  store = TensorStore();
  EXPECT_EQ(copy.find("model.embed_tokens.weight")->data, emb_data);
  EXPECT_EQ(load_f32(*copy.find("model.embed_tokens.weight"), 0), load_f32(again, 0));
}

TEST(Safetensors, ShardedFolderWithIndex) {
  TempDir dir;
  write_safetensors(dir.file("s-1.safetensors"), {f32_spec("x", {2, 2}, 1.0f), f32_spec("y", {3}, 10.0f)});
  write_safetensors(dir.file("s-2.safetensors"), {f32_spec("z", {4}, 100.0f)});
  test::write_file(dir.file("model.safetensors.index.json"),
                   R"({"metadata":{},"weight_map":{"x":"s-1.safetensors","y":"s-1.safetensors","z":"s-2.safetensors"}})");
  TensorStore store = TensorStore::open_dir(dir.path);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(load_f32(store.require("z", {4}), 3), 103.0f);
  EXPECT_NE(store.file_of("y").find("s-1.safetensors"), std::string::npos);
  EXPECT_EQ(store.total_bytes(), 4u * (4 + 3 + 4));
}

TEST(Safetensors, FolderOfShardsWithoutIndex) {
  TempDir dir;
  write_safetensors(dir.file("b.safetensors"), {f32_spec("b", {1}, 2.0f)});
  write_safetensors(dir.file("a.safetensors"), {f32_spec("a", {1}, 1.0f)});
  TensorStore store = TensorStore::open_dir(dir.path);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(load_f32(*store.find("b"), 0), 2.0f);
}

// ---- malformed headers ----

void expect_bad_file(const std::string& content, std::initializer_list<std::string> words) {
  TempDir dir;
  std::string path = write_raw(dir, content);
  expect_input_error([&] { SafetensorsFile::open(path); }, words);
  // The message names the file.
  try {
    SafetensorsFile::open(path);
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
}

TEST(SafetensorsBad, HeaderLengthOver100MB) {
  uint64_t n = kSafetensorsMaxHeader + 1;
  expect_bad_file(std::string(reinterpret_cast<const char*>(&n), 8) + "{}", {"header length", "100 MB"});
}

TEST(SafetensorsBad, HeaderLengthBeyondFileEnd) {
  uint64_t n = 1000;
  expect_bad_file(std::string(reinterpret_cast<const char*>(&n), 8) + "{}", {"1000", "past the end"});
}

TEST(SafetensorsBad, MalformedJson) { expect_bad_file(raw_file(R"({"w": {"dtype": )", 0), {"not valid JSON"}); }

TEST(SafetensorsBad, NonObjectJson) { expect_bad_file(raw_file("[1, 2]", 0), {"JSON object", "array"}); }

TEST(SafetensorsBad, EntryNotObject) { expect_bad_file(raw_file(R"({"w": 3})", 0), {"'w'", "JSON object"}); }

TEST(SafetensorsBad, MetadataNotStrings) {
  expect_bad_file(raw_file(R"({"__metadata__": {"k": 1}})", 0), {"__metadata__", "'k'", "string"});
}

TEST(SafetensorsBad, UnknownDtype) {
  expect_bad_file(raw_file(R"({"w":)" + entry("F8_E9", "[2]", "[0,2]") + "}", 2), {"'w'", "unknown dtype", "F8_E9"});
}

TEST(SafetensorsBad, MissingField) {
  expect_bad_file(raw_file(R"({"w":{"dtype":"F32","shape":[1]}})", 4), {"'w'", "data_offsets"});
}

TEST(SafetensorsBad, NegativeShape) {
  expect_bad_file(raw_file(R"({"w":)" + entry("F32", "[2,-1]", "[0,8]") + "}", 8), {"'w'", "non-negative", "-1"});
}

TEST(SafetensorsBad, NonIntegerShape) {
  expect_bad_file(raw_file(R"({"w":)" + entry("F32", "[2.5]", "[0,8]") + "}", 8), {"'w'", "non-negative", "2.5"});
}

TEST(SafetensorsBad, TooManyDims) {
  expect_bad_file(raw_file(R"({"w":)" + entry("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") + "}", 4), {"'w'", "9 dims"});
}

TEST(SafetensorsBad, OffsetsOutOfFile) {
  expect_bad_file(raw_file(R"({"w":)" + entry("F32", "[4]", "[100,116]") + "}", 16), {"'w'", "past the end"});
}

TEST(SafetensorsBad, OffsetsReversed) {
  expect_bad_file(raw_file(R"({"w":)" + entry("U8", "[0]", "[8,4]") + "}", 8), {"'w'", "[8, 4]", "before"});
}

TEST(SafetensorsBad, OverlappingOffsets) {
  std::string h = R"({"a":)" + entry("F32", "[2]", "[0,8]") + R"(,"b":)" + entry("F32", "[2]", "[4,12]") + "}";
  expect_bad_file(raw_file(h, 12), {"'b'", "overlap", "'a'"});
}

TEST(SafetensorsBad, GapBetweenTensors) {
  std::string h = R"({"a":)" + entry("F32", "[2]", "[0,8]") + R"(,"b":)" + entry("F32", "[2]", "[12,20]") + "}";
  expect_bad_file(raw_file(h, 20), {"gap of 4 bytes", "'b'"});
}

TEST(SafetensorsBad, TrailingBytesBelongToNoTensor) {
  expect_bad_file(raw_file(R"({"a":)" + entry("F32", "[2]", "[0,8]") + "}", 9), {"1 trailing bytes"});
}

TEST(SafetensorsBad, SizeInconsistentWithDtypeAndShape) {
  expect_bad_file(raw_file(R"({"w":)" + entry("BF16", "[3,2]", "[0,24]") + "}", 24),
                  {"'w'", "BF16 [3, 2] = 12 bytes", "span 24 bytes"});
}

TEST(SafetensorsBad, ShapeProductOverflow) {
  expect_bad_file(raw_file(R"({"w":)" + entry("F32", "[1099511627776,1099511627776]", "[0,4]") + "}", 4),
                  {"'w'", "overflow"});
  // A zero dim after the overflowing ones still must not make numel() overflow.
  expect_bad_file(raw_file(R"({"w":)" + entry("F32", "[1099511627776,1099511627776,0]", "[0,0]") + "}", 0),
                  {"'w'", "overflow"});
}

TEST(SafetensorsBad, TruncatedFile) {
  TempDir dir;
  std::string path = dir.file("t.safetensors");
  write_safetensors(path, {f32_spec("a", {4}, 0.0f), f32_spec("b", {3}, 0.0f)});
  std::string content = test::read_file(path);
  content.pop_back();
  expect_bad_file(content, {"past the end", "truncated"});
}

TEST(SafetensorsBad, EmptyFile) { expect_bad_file("", {"empty file"}); }

TEST(SafetensorsBad, ThreeByteFile) { expect_bad_file("abc", {"3 bytes", "too short"}); }

TEST(SafetensorsBad, MissingFileAndFolderAsFile) {
  TempDir dir;
  expect_input_error([&] { SafetensorsFile::open(dir.file("none.safetensors")); }, {"cannot open", "none.safetensors"});
  expect_input_error([&] { SafetensorsFile::open(dir.path); }, {"not a regular file"});
}

TEST(SafetensorsBad, ParseHeaderRejectsShortBuffer) {
  // The pure parser, as the fuzz target calls it: a buffer cut inside the header.
  std::string content = raw_file("{}", 0);
  expect_input_error(
      [&] { parse_safetensors_header(reinterpret_cast<const uint8_t*>(content.data()), 9, content.size(), "buf"); },
      {"buf", "header"});
  auto h = parse_safetensors_header(reinterpret_cast<const uint8_t*>(content.data()), content.size(),
                                    content.size(), "buf");
  EXPECT_TRUE(h.tensors.empty());
}

// ---- model folders ----

TEST(TensorStoreBad, NonexistentFolder) {
  TempDir dir;
  expect_input_error([&] { TensorStore::open_dir(dir.file("nope")); }, {"does not exist", "nope"});
}

TEST(TensorStoreBad, EmptyFolder) {
  TempDir dir;
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {dir.path, "no model.safetensors"});
  test::write_file(dir.file("config.json"), "{}");
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {dir.path, "*.safetensors"});
}

TEST(TensorStoreBad, IndexNamesMissingShard) {
  TempDir dir;
  write_safetensors(dir.file("s-1.safetensors"), {f32_spec("x", {1}, 0.0f)});
  test::write_file(dir.file("model.safetensors.index.json"),
                   R"({"weight_map":{"x":"s-1.safetensors","y":"s-9.safetensors"}})");
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {"s-9.safetensors", "'y'", "does not exist"});
}

TEST(TensorStoreBad, IndexNamesTensorAbsentFromShard) {
  TempDir dir;
  write_safetensors(dir.file("s-1.safetensors"), {f32_spec("x", {1}, 0.0f)});
  test::write_file(dir.file("model.safetensors.index.json"),
                   R"({"weight_map":{"x":"s-1.safetensors","ghost":"s-1.safetensors"}})");
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {"'ghost'", "s-1.safetensors", "does not contain"});
}

TEST(TensorStoreBad, DuplicateTensorAcrossShards) {
  TempDir dir;
  write_safetensors(dir.file("s-1.safetensors"), {f32_spec("x", {1}, 0.0f)});
  write_safetensors(dir.file("s-2.safetensors"), {f32_spec("x", {1}, 1.0f), f32_spec("y", {1}, 0.0f)});
  test::write_file(dir.file("model.safetensors.index.json"),
                   R"({"weight_map":{"x":"s-1.safetensors","y":"s-2.safetensors"}})");
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {"'x'", "s-1.safetensors", "s-2.safetensors"});
  // The same without an index.
  std::filesystem::remove(dir.file("model.safetensors.index.json"));
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {"'x'", "appears in both"});
}

TEST(TensorStoreBad, MalformedIndex) {
  TempDir dir;
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": [1]})");
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {"index.json", "weight_map"});
  test::write_file(dir.file("model.safetensors.index.json"), "{");
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {"index.json", "not valid JSON"});
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map":{"x":"../x.safetensors"}})");
  expect_input_error([&] { TensorStore::open_dir(dir.path); }, {"'x'", "inside"});
}

TEST(TensorStoreBad, RequireMissingWrongShapeWrongDtype) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"),
                    {f32_spec("w", {2, 3}, 0.0f), {"ids", DType::kI32, {2}, [](uint8_t* d, size_t n) {
                                                    std::memset(d, 0, n);
                                                  }}});
  TensorStore store = TensorStore::open_dir(dir.path);
  expect_input_error([&] { store.require("v", {2, 3}); }, {"tensor 'v' missing from " + dir.path});
  expect_input_error([&] { store.require("w", {3, 2}); },
                     {"tensor 'w' in " + dir.file("model.safetensors"), "has shape [2, 3], expected [3, 2]"});
  expect_input_error([&] { store.require("ids", {2}); }, {"'ids'", "I32", "float"});
  EXPECT_EQ(store.require("w", {2, 3}).numel(), 6);
}

TEST(WriteSafetensors, UnwritablePathAndBadNames) {
  TempDir dir;
  expect_input_error([&] { write_safetensors(dir.file("no/such/dir/x.safetensors"), {f32_spec("a", {1}, 0.0f)}); },
                     {"cannot write", "x.safetensors"});
  expect_input_error(
      [&] { write_safetensors(dir.file("d.safetensors"), {f32_spec("a", {1}, 0.0f), f32_spec("a", {1}, 0.0f)}); },
      {"'a'", "twice"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.safetensors")));
}

TEST(WriteSafetensors, FileLargerThanTheFreeSpaceIsRefusedBeforeItsFirstByte) {
  TempDir dir;
  struct statvfs st {};
  ASSERT_EQ(::statvfs(dir.path.c_str(), &st), 0);
  const int64_t avail = int64_t(st.f_bavail) * int64_t(st.f_frsize);
  bool filled = false;
  TensorSpec big{"big", DType::kU8, {avail + (int64_t(1) << 20)}, [&](uint8_t*, size_t) { filled = true; }};
  expect_input_error([&] { write_safetensors(dir.file("big.safetensors"), {big}); },
                     {"cannot write", "big.safetensors", "GB free"});
  EXPECT_FALSE(filled) << "the check must come before any tensor is produced";
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

TEST(WriteSafetensors, FailingFillLeavesNoFile) {
  TempDir dir;
  std::string path = dir.file("f.safetensors");
  TensorSpec bad{"b", DType::kF32, {2}, [](uint8_t*, size_t) { fail("fill failed"); }};
  EXPECT_THROW(write_safetensors(path, {f32_spec("a", {1}, 0.0f), bad}), InputError);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

}  // namespace
}  // namespace tandem
