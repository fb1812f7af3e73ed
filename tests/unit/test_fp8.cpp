// FP8 (float8_e4m3fn with block scales): decoding of all 256 codes against the format's formula,
// round-to-nearest-even encoding, the config's quantization_config, the loader's checks of FP8 weights
// and their scale grids, and the FP8 matmul on every SIMD path against a double-precision reference
// over partial blocks, row slices and block widths the SIMD paths leave to the scalar kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/fp8_weights.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace tandem {
namespace {

// The e4m3fn definition: (-1)^s · 2^(e-7) · (1 + m/8) for e > 0, (-1)^s · 2^-6 · m/8 for e = 0;
// e = 15, m = 7 is NaN (the only NaN, no infinities).
double reference_e4m3(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8, DecodesAll256CodesExactly) {
  for (int code = 0; code < 256; ++code) {
    const float got = fp8_e4m3_to_f32(uint8_t(code));
    const double want = reference_e4m3(code);
    SCOPED_TRACE(code);
    EXPECT_EQ(fp8_e4m3_is_nan(uint8_t(code)), std::isnan(want));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    EXPECT_EQ(double(got), want);
    EXPECT_EQ(std::signbit(got), code >= 128);  // -0 (0x80) keeps its sign
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0x1p-6f);
}

TEST(Fp8, EncodesToNearestEvenAndSaturates) {
  for (int code = 0; code < 256; ++code) {
    if (fp8_e4m3_is_nan(uint8_t(code))) continue;
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(code))), code) << code;  // every code round-trips
  }
  // Midpoints between neighbours round to the even significand; just off the midpoint to the nearer.
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = fp8_e4m3_to_f32(uint8_t(code)), hi = fp8_e4m3_to_f32(uint8_t(code + 1));
    const float mid = (lo + hi) / 2;
    EXPECT_EQ(f32_to_fp8_e4m3(mid), (code & 1) ? code + 1 : code) << code;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, lo)), code) << code;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, hi)), code + 1) << code;
    EXPECT_EQ(f32_to_fp8_e4m3(-mid), 0x80 | ((code & 1) ? code + 1 : code)) << code;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7e);  // past the last midpoint: still saturates, never NaN
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-11f), 0x00);  // below half the smallest subnormal
  EXPECT_TRUE(fp8_e4m3_is_nan(f32_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN())));
}

// ---- quantization_config -------------------------------------------------------------------------

nlohmann::json qwen3(nlohmann::json quant) {
  nlohmann::json j = {{"model_type", "qwen3_moe"}, {"vocab_size", 512}, {"hidden_size", 64},
                      {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"moe_intermediate_size", 32}, {"num_experts", 4}, {"num_experts_per_tok", 2}};
  j["quantization_config"] = quant;
  return j;
}

std::string config_error(const nlohmann::json& quant) {
  try {
    parse_config(qwen3(quant), "cfg.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Fp8, ConfigReadsBlockScaledFp8) {
  ModelConfig c = parse_config(qwen3({{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                      {"weight_block_size", {128, 64}}}),
                               "cfg.json");
  EXPECT_TRUE(c.quant.fp8);
  EXPECT_EQ(c.quant.block_rows, 128);
  EXPECT_EQ(c.quant.block_cols, 64);
  nlohmann::json plain = qwen3(nullptr);
  EXPECT_FALSE(parse_config(plain, "cfg.json").quant.fp8);
}

TEST(Fp8, ConfigRefusesWhatIsNotSupported) {
  EXPECT_NE(config_error({{"quant_method", "gptq"}, {"bits", 4}}).find("'gptq' is not supported"), std::string::npos);
  EXPECT_NE(config_error({{"quant_method", "fp8"}}).find("per-tensor and per-channel FP8 scales are not supported"),
            std::string::npos);
  EXPECT_NE(config_error({{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}})
                .find("fmt 'e5m2' is not supported"),
            std::string::npos);
  EXPECT_NE(config_error({{"quant_method", "fp8"}, {"activation_scheme", "static"}, {"weight_block_size", {128, 128}}})
                .find("static activation scales"),
            std::string::npos);
  for (nlohmann::json bad : {nlohmann::json{128}, nlohmann::json{0, 128}, nlohmann::json{128, -1},
                             nlohmann::json{128.5, 128}, nlohmann::json("128")})
    EXPECT_NE(config_error({{"quant_method", "fp8"}, {"weight_block_size", bad}}).find("weight_block_size"),
              std::string::npos)
        << bad.dump();
  EXPECT_NE(config_error("fp8").find("must be an object"), std::string::npos);
}

// ---- the loader's checks -------------------------------------------------------------------------

struct Fp8File {
  test::TempDir dir;
  TensorStore store;
};

// One weight "w.weight" [rows, cols] in `dtype` (bytes from `codes`, cycled), optionally with scales
// "w.weight_scale_inv" of `scale_shape` filled with `scale`.
std::unique_ptr<Fp8File> fp8_file(DType dtype, int64_t rows, int64_t cols, std::vector<uint8_t> codes,
                                  std::optional<Shape> scale_shape, float scale = 0.5f, DType scale_dtype = DType::kF32) {
  auto f = std::make_unique<Fp8File>();
  std::vector<TensorSpec> specs;
  specs.push_back({"w.weight", dtype, Shape{rows, cols}, [codes](uint8_t* dst, size_t n) {
                     for (size_t i = 0; i < n; ++i) dst[i] = codes[i % codes.size()];
                   }});
  if (scale_shape)
    specs.push_back({"w.weight_scale_inv", scale_dtype, *scale_shape, [scale, scale_dtype](uint8_t* dst, size_t n) {
                       for (size_t i = 0; i < n; i += dtype_size(scale_dtype)) {
                         if (scale_dtype == DType::kF32) std::memcpy(dst + i, &scale, 4);
                         else std::memset(dst + i, 0, dtype_size(scale_dtype));
                       }
                     }});
  write_safetensors(f->dir.file("model.safetensors"), specs);
  f->store = TensorStore::open_dir(f->dir.path);
  return f;
}

const QuantConfig kBlock{true, 128, 128};

std::string load_error(const Fp8File& f, const QuantConfig& q, int64_t rows, int64_t cols) {
  try {
    require_linear(f.store, q, "w.weight", {rows, cols});
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Fp8, LoaderAttachesScalesOfPartialBlocks) {
  // 160 x 320: two row blocks (128 + 32), three column blocks (128 + 128 + 64).
  auto f = fp8_file(DType::kF8E4M3, 160, 320, {0x38, 0xb8, 0x01}, Shape{2, 3});
  TensorView v = require_linear(f->store, kBlock, "w.weight", {160, 320});
  ASSERT_FALSE(v.scale.empty());
  EXPECT_EQ(v.scale.stride, 3);
  EXPECT_EQ(v.scale_nbytes(), 2u * 3u * 4u);
  EXPECT_EQ(load_f32(v, 0), 0.5f);            // 0x38 = 1.0, times the scale 0.5
  EXPECT_EQ(load_f32(v, 1), -0.5f);           // 0xb8 = -1.0
  EXPECT_EQ(load_f32(v, 2), 0x1p-9f * 0.5f);  // smallest subnormal
}

TEST(Fp8, LoaderRefusesBadScalesAndCodes) {
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, {0x38}, std::nullopt), kBlock, 160, 320)
                .find("block scales 'w.weight_scale_inv' are missing"),
            std::string::npos);
  // Per-channel ([rows, 1]) and per-tensor ([1]) scales are not the block grid.
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, {0x38}, Shape{160, 1}), kBlock, 160, 320)
                .find("have shape [160, 1], expected [2, 3]"),
            std::string::npos);
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, {0x38}, Shape{1}), kBlock, 160, 320)
                .find("per-tensor or per-channel scales are not supported"),
            std::string::npos);
  // Floor-divided grid ([1, 2]) is wrong: edge blocks have their own scale.
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, {0x38}, Shape{1, 2}), kBlock, 160, 320).find("expected [2, 3]"),
            std::string::npos);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0x1p101f})
    EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, {0x38}, Shape{2, 3}, bad), kBlock, 160, 320)
                  .find("expected a finite value in (0, 2^100]"),
              std::string::npos)
        << bad;
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, {0x38}, Shape{2, 3}, 1.0f, DType::kBF16), kBlock, 160, 320)
                .find("have dtype BF16, expected F32"),
            std::string::npos);
  // A NaN code anywhere (here at element 4·320 + 7) is refused, naming where.
  std::vector<uint8_t> codes(size_t(160 * 320), 0x38);
  codes[4 * 320 + 7] = 0xff;
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, codes, Shape{2, 3}), kBlock, 160, 320)
                .find("NaN code 0xff at row 4, column 7"),
            std::string::npos);
  codes[4 * 320 + 7] = 0x7f;
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, codes, Shape{2, 3}), kBlock, 160, 320).find("0x7f"),
            std::string::npos);
  // FP8 without an FP8 quantization_config; a float weight with scales; a wrong shape.
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, {0x38}, Shape{2, 3}), QuantConfig{}, 160, 320)
                .find("has no FP8 quantization_config"),
            std::string::npos);
  EXPECT_NE(load_error(*fp8_file(DType::kBF16, 160, 320, {0x38}, Shape{2, 3}), kBlock, 160, 320)
                .find("scales are only read for F8_E4M3 weights"),
            std::string::npos);
  EXPECT_NE(load_error(*fp8_file(DType::kF8E4M3, 160, 320, {0x38}, Shape{2, 3}), kBlock, 320, 160).find("expected [320, 160]"),
            std::string::npos);
  // Norms, embeddings, routers and lm_head go through store.require, which says where FP8 is read.
  auto f = fp8_file(DType::kF8E4M3, 160, 320, {0x38}, Shape{2, 3});
  try {
    f->store.require("w.weight", {160, 320});
    FAIL() << "FP8 accepted by require";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("FP8 is read for attention, MLP and expert projections only"), std::string::npos);
  }
}

// ---- matmul --------------------------------------------------------------------------------------

constexpr cpu::SimdPath kAllPaths[] = {cpu::SimdPath::kScalar, cpu::SimdPath::kAvx2, cpu::SimdPath::kAvx512};

class PathScope {
 public:
  explicit PathScope(cpu::SimdPath p) : saved_(cpu::current_simd_path()) { cpu::set_simd_path(p); }
  ~PathScope() { cpu::set_simd_path(saved_); }

 private:
  cpu::SimdPath saved_;
};

// An FP8 weight [m, k] with random codes (no NaN) and random scales over blocks br x bc.
struct Fp8Weight {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  TensorView view;
};

Fp8Weight random_fp8(int64_t m, int64_t k, int64_t br, int64_t bc, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp8Weight w;
  w.codes.resize(size_t(m * k) + 1);
  for (auto& c : w.codes) {
    do c = uint8_t(rng()); while (fp8_e4m3_is_nan(c));
  }
  const int64_t gr = (m + br - 1) / br, gc = (k + bc - 1) / bc;
  std::uniform_real_distribution<float> d(0.001f, 0.01f);
  w.scales.resize(size_t(gr * gc));
  for (auto& s : w.scales) s = d(rng);
  w.view.data = w.codes.data();
  w.view.dtype = DType::kF8E4M3;
  w.view.shape = Shape{m, k};
  w.view.scale = BlockScales{w.scales.data(), gc, br, bc, 0};
  return w;
}

// y = x · Wᵀ in double from the dequantized weights.
std::vector<double> reference(const std::vector<float>& x, int64_t n, const TensorView& w) {
  const int64_t m = w.rows(), k = w.cols();
  std::vector<double> y(size_t(n * m));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < m; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += double(x[size_t(r * k + i)]) * double(load_f32(w, j * k + i));
      y[size_t(r * m + j)] = acc;
    }
  return y;
}

TEST(Fp8, MatmulMatchesDequantizedReferenceOnEveryPath) {
  ThreadPool pool(2);
  struct Case {
    int64_t n, m, k, br, bc;
  };
  // Partial blocks on both edges, k tails below one vector, block widths that are not a multiple of 16
  // (the scalar kernel), decode-sized and prefill-sized n.
  const Case cases[] = {{1, 160, 320, 128, 128}, {3, 144, 256, 128, 128}, {9, 33, 200, 16, 32},
                        {17, 40, 72, 8, 48},     {5, 24, 50, 7, 10},      {2, 70, 13, 64, 128}};
  for (const Case& c : cases) {
    Fp8Weight w = random_fp8(c.m, c.k, c.br, c.bc, uint32_t(c.m * 31 + c.k));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> x(size_t(c.n * c.k));
    for (auto& v : x) v = d(rng);
    const std::vector<double> want = reference(x, c.n, w.view);
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    for (cpu::SimdPath p : kAllPaths) {
      if (!cpu::simd_supported(p)) continue;
      PathScope ps(p);
      std::vector<float> y(size_t(c.n * c.m), 1.0f);
      cpu::matmul(x.data(), c.n, w.view, y.data(), pool);
      double err = 0;
      for (size_t i = 0; i < y.size(); ++i) err = std::max(err, std::fabs(double(y[i]) - want[i]));
      // f32 accumulation over k products of order |x|·|w|: a few ulps of the largest output.
      EXPECT_LE(err, 1e-5 * scale) << cpu::simd_path_name(p) << " n=" << c.n << " m=" << c.m << " k=" << c.k;
      std::vector<float> acc(size_t(c.n * c.m), 1.0f);
      cpu::matmul_acc(x.data(), c.n, w.view, acc.data(), pool);
      for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(acc[i], y[i] + 1.0f, 1e-5f * float(scale) + 1e-6f);
    }
  }
}

TEST(Fp8, RowSlicesKeepTheirScaleRows) {
  // Rows [37, 101) of a 160-row tensor with 32-row blocks: the slice's first row sits mid-block.
  Fp8Weight w = random_fp8(160, 256, 32, 128, 3);
  TensorView slice = w.view;
  slice.data = w.view.row_ptr(37);
  slice.shape.dims[0] = 101 - 37;
  slice.scale.row0 = 37;
  EXPECT_EQ(slice.scale_nbytes(), size_t(3) * 2 * 4);  // grid rows 1..3
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3) * 0.25f;
  ThreadPool pool(1);
  for (cpu::SimdPath p : kAllPaths) {
    if (!cpu::simd_supported(p)) continue;
    PathScope ps(p);
    std::vector<float> full(160), part(64);
    cpu::matmul(x.data(), 1, w.view, full.data(), pool);
    cpu::matmul(x.data(), 1, slice, part.data(), pool);
    for (int64_t j = 0; j < 64; ++j) EXPECT_EQ(part[size_t(j)], full[size_t(37 + j)]) << cpu::simd_path_name(p) << j;
  }
}

// ---- quantizing -----------------------------------------------------------------------------------

TEST(Fp8, QuantizeBlocksIsWithinHalfASpacing) {
  const int64_t rows = 200, cols = 300, br = 128, bc = 128;  // partial blocks on both edges
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(size_t(rows * cols));
  for (auto& v : w) v = d(rng);
  for (int64_t r = 128; r < rows; ++r)  // one all-zero block: scale 1, codes 0
    for (int64_t c = 256; c < cols; ++c) w[size_t(r * cols + c)] = 0.0f;
  std::vector<uint8_t> codes(w.size());
  std::vector<float> scales(2 * 3);
  quantize_fp8_blocks(w.data(), rows, cols, br, bc, codes.data(), scales.data());
  EXPECT_EQ(scales[1 * 3 + 2], 1.0f);
  TensorView v;
  v.data = codes.data();
  v.dtype = DType::kF8E4M3;
  v.shape = Shape{rows, cols};
  v.scale = BlockScales{scales.data(), 3, br, bc, 0};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float x = w[size_t(r * cols + c)], s = v.scale.at(r, c), got = load_f32(v, r * cols + c);
      ASSERT_FALSE(fp8_e4m3_is_nan(codes[size_t(r * cols + c)]));
      // Half the spacing: 2^-4 relative for normals (3 mantissa bits), 2^-10 · scale for subnormals;
      // plus the f32 roundings of x / scale and of the product.
      ASSERT_LE(std::fabs(got - x), std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f) * 1.0001f + 1e-12f) << r << "," << c;
    }
  // Each block's largest magnitude lands on ±448 (the scale is chosen for it).
  float amax = 0;
  int64_t at = 0;
  for (int64_t r = 0; r < 128; ++r)
    for (int64_t c = 0; c < 128; ++c)
      if (std::fabs(w[size_t(r * cols + c)]) > amax) amax = std::fabs(w[size_t(r * cols + c)]), at = r * cols + c;
  EXPECT_EQ(codes[size_t(at)] & 0x7f, 0x7e);
  EXPECT_FLOAT_EQ(scales[0], amax / 448.0f);
}

}  // namespace
}  // namespace tandem
