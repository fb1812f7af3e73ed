// RMSNorm kernel (see norm.cuh).
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/norm.cuh"

namespace tandem::cuda {

namespace {

__global__ void rms_norm_kernel(const float* x, int64_t x_stride, const int32_t* rows, int d, const float* w,
                                float eps, float* out, int64_t out_stride) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ double red[32];
  const int r = blockIdx.x;
  const float* xr = x + int64_t(rows ? rows[r] : r) * x_stride;
  float* o = out + int64_t(r) * out_stride;
  double ss = 0.0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += double(xr[i]) * xr[i];
  ss = block_sum(ss, red);
  const float scale = float(1.0 / sqrt(ss / double(d) + double(eps)));
  for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

}  // namespace

void launch_rms_norm(const float* x, int64_t x_stride, const int32_t* rows, int n, int d, const float* w,
                     float eps, float* out, int64_t out_stride, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = d >= 1024 ? 512 : d >= 256 ? 256 : 64;
  launch_kernel(rms_norm_kernel, n, threads, 0, stream, x, x_stride, rows, d, w, eps, out, out_stride);
}

}  // namespace tandem::cuda
