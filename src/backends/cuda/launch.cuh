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

// The calling thread's kernel profile (kernel_profile.cu; null unless a KernelProfile is alive):
// launch_kernel() brackets each launch with its events.
class LaunchTrace;
LaunchTrace* launch_trace();
void trace_before(LaunchTrace* t, const void* kernel, dim3 grid, cudaStream_t stream);
void trace_after(LaunchTrace* t, cudaStream_t stream);
// One thread spinning for `cycles` SM clock cycles (kernel_profile's head start for the host).
void launch_delay(long long cycles, cudaStream_t stream);
// The shared-memory / L1 split every launch_kernel() asks for, in percent of the most shared memory
// (CudaKernelPolicy::smem_carveout; -1: the driver's choice per kernel, the default). An SM runs blocks
// of one split at a time, so two kernels in a row with different splits cannot share SMs: the next
// one's blocks wait for the SMs to drain even under PDL. A diagnostic knob: one split for every kernel
// measured no faster at one sequence on an H100 (bench/RESULTS.md, 2026-12-06).
void set_smem_carveout(int percent);
int smem_carveout();
// Sets the kernel's carveout attribute to smem_carveout() if it was last set to something else.
void apply_smem_carveout(const void* kernel);

// How many times launch_kernel() issues this kernel on this grid: 1, or 2 while a KernelRepeat
// (cuda_engine.h) of the calling thread names it (a diagnostic: a step's time with the kernel twice,
// less its time with it once, is the kernel's share of the step's critical path).
int launch_times(const void* kernel, dim3 grid);

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
  apply_smem_carveout(reinterpret_cast<const void*>(kernel));
  LaunchTrace* trace = launch_trace();
  const int times = launch_times(reinterpret_cast<const void*>(kernel), grid);
  for (int i = 0; i < times; ++i) {
    if (trace) trace_before(trace, reinterpret_cast<const void*>(kernel), grid, stream);
    TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
    TANDEM_CUDA_LAUNCH_CHECK();
    if (trace) trace_after(trace, stream);
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
