// Helpers for the GPU tests: device buffers that free themselves, random data, host copies.
#pragma once

#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "core/dtype.h"

namespace tandem::test {

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { TANDEM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& v) : DevBuf(v.size()) { upload(v); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& v) {
    TANDEM_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  // Poison: NaN bytes for floats, -1 for ints, so unwritten outputs show.
  void poison() { TANDEM_CUDA_CHECK(cudaMemset(p, 0xff, n * sizeof(T))); }
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& f : v) f = d(rng);
  return v;
}

// Weight bytes of `f` in dtype t (F32/BF16/F16); `f` is rounded in place to what the dtype holds.
inline std::vector<uint8_t> to_dtype(std::vector<float>& f, DType t) {
  std::vector<uint8_t> out(f.size() * dtype_size(t));
  for (size_t i = 0; i < f.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&out[i * 4], &f[i], 4);
    } else {
      uint16_t h = t == DType::kBF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
      f[i] = t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
    r = std::max(r, std::fabs(double(b[i])));
  }
  return r > 0 ? d / r : d;
}

}  // namespace tandem::test
