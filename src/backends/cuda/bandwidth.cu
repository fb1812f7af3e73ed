// Measured read bandwidths of the device (HBM) and of the link (mapped pinned host memory): the bounds of
// bench_gpu_decode and `tandem bench`. Declared in cuda_engine.h (nvcc compiles kernels and launchers only).
#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_common.cuh"

namespace tandem {
namespace cuda {
namespace {

// Every thread reads 16-byte words grid-strided and folds them into one value; a word equal to the
// (never stored) sentinel would be written out, so the loads cannot be dropped.
__global__ void read_kernel(const uint4* p, size_t n, uint4* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);  // streaming: read once, not kept in L2
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = make_uint4(acc, 0, 0, 0);
}

// GB/s of read_kernel over [p, p + bytes) (device-accessible, bytes a multiple of 16 with 16 more
// after it for the sink): the best of five timed passes after a warm-up.
double time_reads(int device, void* buf, size_t bytes) {
  int sms = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaEvent_t t0, t1;
  TANDEM_CUDA_CHECK(cudaEventCreate(&t0));
  TANDEM_CUDA_CHECK(cudaEventCreate(&t1));
  const auto* p = static_cast<const uint4*>(buf);
  auto* sink = reinterpret_cast<uint4*>(static_cast<char*>(buf) + bytes);
  float best = 0;
  for (int i = 0; i < 6; ++i) {  // the first pass warms up, the best of the other five counts
    TANDEM_CUDA_CHECK(cudaEventRecord(t0));
    read_kernel<<<4 * sms, 512>>>(p, bytes / 16, sink);
    TANDEM_CUDA_LAUNCH_CHECK();
    TANDEM_CUDA_CHECK(cudaEventRecord(t1));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    if (i > 0 && (best == 0 || ms < best)) best = ms;
  }
  TANDEM_CUDA_CHECK(cudaEventDestroy(t0));
  TANDEM_CUDA_CHECK(cudaEventDestroy(t1));
  return double(bytes) / (double(best) * 1e-3) / 1e9;
}

}  // namespace
}  // namespace cuda

double cuda_read_bandwidth_gbps(int device, size_t bytes) {
  using namespace cuda;
  TANDEM_CUDA_CHECK(cudaSetDevice(device));
  bytes = std::max<size_t>(bytes / 16 * 16, 16);
  void* buf = device_alloc(bytes + 16, "the HBM bandwidth probe");
  TANDEM_CUDA_CHECK(cudaMemset(buf, 0x5a, bytes + 16));
  const double gbps = time_reads(device, buf, bytes);
  TANDEM_CUDA_CHECK(cudaFree(buf));
  return gbps;
}

double cuda_host_read_bandwidth_gbps(int device, size_t bytes) {
  using namespace cuda;
  TANDEM_CUDA_CHECK(cudaSetDevice(device));
  bytes = std::max<size_t>(bytes / 16 * 16, 16);
  void* host = host_alloc(bytes + 16, cudaHostAllocMapped | cudaHostAllocPortable, "the link bandwidth probe");
  std::memset(host, 0x5a, bytes + 16);
  void* dev = nullptr;
  TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
  const double gbps = time_reads(device, dev, bytes);
  TANDEM_CUDA_CHECK(cudaFreeHost(host));
  return gbps;
}

void cuda_release_device(int device) {
  TANDEM_CUDA_CHECK(cudaSetDevice(device));
  TANDEM_CUDA_CHECK(cudaDeviceReset());
}

}  // namespace tandem
