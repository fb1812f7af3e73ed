// Non-owning typed views of tensor memory (weights mapped from safetensors, activations in buffers).
// A view never frees what it points at; the owner (a mapped file, a Buffer) must outlive it.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

inline constexpr int kMaxDims = 8;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    TANDEM_ASSERT(d.size() <= kMaxDims, "too many dims");
    for (int64_t v : d) dims[ndim++] = v;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const;  // "[2, 11, 512]"
};

// The block scales of an F8_E4M3 weight [rows, cols]: w[i, j] = fp8[i, j] · data[(row0 + i) / block_rows,
// j / block_cols] (DeepSeek's `weight_scale_inv`; each partial edge block has its own scale). row0 is
// the first row's index in the checkpoint's tensor, so a view of rows [r0, r1) keeps the full grid.
struct BlockScales {
  const float* data = nullptr;  // [ceil(rows / block_rows), stride] of the whole tensor, finite and > 0
  int64_t stride = 0;           // scales per grid row: ceil(cols / block_cols)
  int64_t block_rows = 0, block_cols = 0;
  int64_t row0 = 0;
  bool empty() const { return data == nullptr; }
  float at(int64_t row, int64_t col) const { return data[(row0 + row) / block_rows * stride + col / block_cols]; }
};

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  BlockScales scale;  // F8_E4M3 weights only; empty otherwise

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }  // the elements only
  // Bytes of the scale grid rows this view's rows use (0 without scales).
  size_t scale_nbytes() const {
    if (scale.empty() || rows() == 0) return 0;
    const int64_t first = scale.row0 / scale.block_rows, last = (scale.row0 + rows() - 1) / scale.block_rows;
    return size_t(last - first + 1) * size_t(scale.stride) * sizeof(float);
  }
  int64_t rows() const { return shape.ndim >= 2 ? shape[0] : 1; }   // weights: [out, in]
  int64_t cols() const { return shape.ndim >= 1 ? shape[shape.ndim - 1] : 1; }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
  // Row r of a 2-D view (or element-row of an N-D view flattened to [rows, cols]).
  const void* row_ptr(int64_t r) const {
    return static_cast<const char*>(data) + size_t(r) * size_t(cols()) * dtype_size(dtype);
  }
};

// Reads element i of a float view (F32/BF16/F16, or F8_E4M3 dequantized with its block scale) widened to
// f32. For references and tests, not hot loops.
float load_f32(const TensorView& v, int64_t i);
// Copies a float view (as load_f32) into f32.
std::vector<float> to_f32(const TensorView& v);

}  // namespace tandem
