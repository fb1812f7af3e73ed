// The delay kernel behind KernelProfile (see launch.cuh).
#include "backends/cuda/launch.cuh"

namespace tandem::cuda {

namespace {

__global__ void delay_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

}  // namespace

void launch_delay(long long cycles, cudaStream_t stream) {
  delay_kernel<<<1, 1, 0, stream>>>(cycles);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda
