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

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
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

// Reads element i of a float view (F32/BF16/F16) widened to f32. For references and tests, not hot loops.
float load_f32(const TensorView& v, int64_t i);
// Copies a float view (F32/BF16/F16) into f32.
std::vector<float> to_f32(const TensorView& v);

}  // namespace tandem
