// The backend tests' gate: without a CUDA device (or in a build without the CUDA backend) every test
// binary run exits with 77, which CTest reports as skipped. Listing tests needs no device.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"
#endif

namespace {

class GpuEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
#ifdef TANDEM_HAVE_CUDA
    if (tandem::cuda_device_count() > 0) return;
    std::fprintf(stderr, "no CUDA device: backend tests skipped\n");
#else
    std::fprintf(stderr, "built without the CUDA backend: backend tests skipped\n");
#endif
    std::exit(77);
  }
};

[[maybe_unused]] ::testing::Environment* const g_env = ::testing::AddGlobalTestEnvironment(new GpuEnvironment);

TEST(CudaBackend, DeviceIsPresent) { SUCCEED(); }

}  // namespace
