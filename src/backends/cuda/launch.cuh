// Kernel launches with programmatic dependent launch (PDL, sm_90): a kernel launched with
// launch_kernel() while PDL is on may be scheduled before its predecessor in the stream has finished,
// so its launch latency hides behind the predecessor's tail. In exchange every such kernel must call
// pdl_wait() before it writes anything, reads anything a kernel of the step writes (only weights,
// constant during a step, may be touched before: linear's L2 prefetch), or returns early: the wait
// returns once the predecessor grid has completed and its memory is visible. Because every kernel
// waits unconditionally, completion is transitive: a kernel that finished implies all earlier ones did.
// Works eagerly and inside stream capture (graphs get programmatic edges, CUDA 12.3+). Off, the launch
// is an ordinary one and pdl_wait()/pdl_launch_dependents() are no-ops.
#pragma once

#include <utility>

#include "backends/cuda/cuda_common.cuh"

namespace tandem::cuda {

// Whether launch_kernel() on this thread sets the PDL attribute (off unless a PdlScope says so). The
// engine turns it on around its step (CudaOptions::pdl); op tests launch without it.
bool pdl_enabled();
class PdlScope {
 public:
  explicit PdlScope(bool on);
  ~PdlScope();
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool prev_;
};

// Diagnostics of the calling thread's launches (cuda_diagnostics.h: KernelProfile, KernelRepeat):
// null unless one is alive, so an ordinary launch pays one call and a null check for them.
// launch_times: how many times to issue this kernel on this grid (1, or 2 where a KernelRepeat names
// it); launch_before / launch_after bracket each issue (a KernelProfile's events).
class LaunchDiagnostics;
LaunchDiagnostics* launch_diagnostics();
int launch_times(LaunchDiagnostics* d, const void* kernel, dim3 grid);
void launch_before(LaunchDiagnostics* d, const void* kernel, dim3 grid, cudaStream_t stream);
void launch_after(LaunchDiagnostics* d, cudaStream_t stream);
// One thread spinning for `cycles` SM clock cycles (KernelProfile's head start for the host).
void launch_delay(long long cycles, cudaStream_t stream);

// kernel<<<grid, block, smem, stream>>>(args...) in clusters of cluster_x blocks along x (1: none;
// sm_90, grid.x a multiple of it), with programmatic stream serialization when pdl_enabled(). The
// kernel must begin with pdl_wait(). Checked like every launch.
template <class... P, class... A>
void launch_kernel_cluster(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, unsigned cluster_x,
                           cudaStream_t stream, A&&... args) {
  cudaLaunchAttribute attr[2] = {};
  unsigned n_attr = 0;
  if (pdl_enabled()) {
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = cluster_x;
    attr[n_attr].val.clusterDim.y = 1;
    attr[n_attr++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n_attr;
  LaunchDiagnostics* diag = launch_diagnostics();
  if (!diag) {
    TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
    TANDEM_CUDA_LAUNCH_CHECK();
    return;
  }
  const void* k = reinterpret_cast<const void*>(kernel);
  const int times = launch_times(diag, k, grid);
  for (int i = 0; i < times; ++i) {
    launch_before(diag, k, grid, stream);
    TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
    TANDEM_CUDA_LAUNCH_CHECK();
    launch_after(diag, stream);
  }
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
// pdl_enabled(). The kernel must begin with pdl_wait(). Checked like every launch.
template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  launch_kernel_cluster(kernel, grid, block, smem, 1u, stream, std::forward<A>(args)...);
}

#ifdef __CUDACC__
// Waits until the predecessor grid completed and its writes are visible (no-op without PDL).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel in the stream be scheduled now (its blocks then sit in their pdl_wait() until
// this grid completes). Only a scheduling hint: it publishes no memory.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
#endif

}  // namespace tandem::cuda
