// The launch hooks behind cuda_diagnostics.h (per-kernel GPU times, repeated kernels; launch.cuh calls
// them only while one of them is alive on the launching thread).
#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_diagnostics.h"
#include "backends/cuda/launch.cuh"
#include "core/error.h"

namespace tandem {

namespace cuda {

namespace {

// "void tandem::cuda::(anonymous namespace)::linear_kernel<__nv_bfloat16>(tandem::cuda::LinearArgs, bool)"
// -> "linear_kernel<__nv_bfloat16>".
std::string short_name(const char* mangled) {
  std::string name = mangled ? mangled : "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status == 0 && d) {
    name = d;
    std::free(d);
  }
  // Drop the parameter list: the last top-level "(...)".
  int depth = 0;
  for (size_t i = name.size(); i-- > 0;) {
    if (name[i] == ')') ++depth;
    if (name[i] == '(' && --depth == 0) {
      name.resize(i);
      break;
    }
  }
  for (const std::string ns : {"tandem::cuda::(anonymous namespace)::", "tandem::cuda::", "void "}) {
    for (size_t at; (at = name.find(ns)) != std::string::npos;) name.erase(at, ns.size());
  }
  return name;
}

}  // namespace

class LaunchTrace {
 public:
  struct Pending {
    const void* kernel;
    dim3 grid;
    cudaEvent_t a, b;
  };
  bool delay_next = false;
  std::vector<Pending> pending;
  std::vector<cudaEvent_t> spare;
  std::map<const void*, std::string> names;
  std::map<std::string, KernelTime> totals;
  int64_t steps = 0;

  cudaEvent_t event() {
    if (!spare.empty()) {
      cudaEvent_t e = spare.back();
      spare.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
};

namespace {

// KernelRepeat's state: the text a kernel's short name must contain, and each kernel's verdict.
struct LaunchRepeat {
  std::string part;
  std::map<std::tuple<const void*, unsigned, unsigned, unsigned>, bool> twice;  // per kernel and grid
};

// "linear_kernel<float> [8x1x1]": a kernel on one grid, as KernelTime names it.
std::string grid_label(const std::string& name, dim3 grid) {
  return fmt::format("{} [{}x{}x{}]", name, grid.x, grid.y, grid.z);
}

std::string kernel_name(const void* kernel) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, kernel) != cudaSuccess) mangled = nullptr;
  return short_name(mangled);
}

}  // namespace

// The calling thread's live diagnostics (the innermost KernelProfile and KernelRepeat).
class LaunchDiagnostics {
 public:
  LaunchTrace* trace = nullptr;
  LaunchRepeat* repeat = nullptr;
};

namespace {
thread_local LaunchDiagnostics t_diag;
}  // namespace

LaunchDiagnostics* launch_diagnostics() { return t_diag.trace || t_diag.repeat ? &t_diag : nullptr; }

int launch_times(LaunchDiagnostics* d, const void* kernel, dim3 grid) {
  LaunchRepeat* rep = d->repeat;
  if (!rep) return 1;
  const auto key = std::make_tuple(kernel, grid.x, grid.y, grid.z);
  auto it = rep->twice.find(key);
  if (it == rep->twice.end()) {
    const std::string name = kernel_name(kernel);
    const std::string label = grid_label(name, grid);
    // The peer lane's handoff kernels count their requests: never issued twice.
    const bool twice = label.find(rep->part) != std::string::npos && name.find("peer_") == std::string::npos;
    it = rep->twice.emplace(key, twice).first;
  }
  return it->second ? 2 : 1;
}

void launch_before(LaunchDiagnostics* d, const void* kernel, dim3 grid, cudaStream_t stream) {
  LaunchTrace* t = d->trace;
  if (!t) return;
  if (t->delay_next) {
    launch_delay(20'000'000, stream);  // ~10 ms: ample for a step's launches
    t->delay_next = false;
  }
  LaunchTrace::Pending p{kernel, grid, t->event(), t->event()};
  TANDEM_CUDA_CHECK(cudaEventRecord(p.a, stream));
  t->pending.push_back(p);
}

void launch_after(LaunchDiagnostics* d, cudaStream_t stream) {
  if (LaunchTrace* t = d->trace) TANDEM_CUDA_CHECK(cudaEventRecord(t->pending.back().b, stream));
}

}  // namespace cuda

struct KernelProfile::Impl {
  cuda::LaunchTrace trace;
  cuda::LaunchTrace* prev = nullptr;
};

KernelProfile::KernelProfile() : impl_(std::make_unique<Impl>()) {
  impl_->prev = cuda::t_diag.trace;
  cuda::t_diag.trace = &impl_->trace;
}

KernelProfile::~KernelProfile() {
  cuda::t_diag.trace = impl_->prev;
  auto& t = impl_->trace;
  cudaDeviceSynchronize();  // events still pending must not be destroyed under the device
  for (auto& p : t.pending) t.spare.push_back(p.a), t.spare.push_back(p.b);
  for (cudaEvent_t e : t.spare) cudaEventDestroy(e);
}

void KernelProfile::begin_step() { impl_->trace.delay_next = true; }

void KernelProfile::end_step() {
  auto& t = impl_->trace;
  for (auto& p : t.pending) {
    TANDEM_CUDA_CHECK(cudaEventSynchronize(p.b));
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, p.a, p.b));
    auto it = t.names.find(p.kernel);
    if (it == t.names.end()) it = t.names.emplace(p.kernel, cuda::kernel_name(p.kernel)).first;
    // Launches of one kernel on different grids (a projection's shape) are told apart.
    const std::string label = cuda::grid_label(it->second, p.grid);
    KernelTime& k = t.totals[label];
    k.name = label;
    ++k.calls;
    k.total_us += double(ms) * 1e3;
    t.spare.push_back(p.a);
    t.spare.push_back(p.b);
  }
  t.pending.clear();
  ++t.steps;
}

std::vector<KernelTime> KernelProfile::totals() const {
  std::vector<KernelTime> out;
  for (const auto& [name, k] : impl_->trace.totals) out.push_back(k);
  std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) { return a.total_us > b.total_us; });
  return out;
}

int64_t KernelProfile::steps() const { return impl_->trace.steps; }

struct KernelRepeat::Impl {
  cuda::LaunchRepeat repeat;
  cuda::LaunchRepeat* prev = nullptr;
};

KernelRepeat::KernelRepeat(std::string name_part) : impl_(std::make_unique<Impl>()) {
  if (name_part.empty()) fail("KernelRepeat: empty kernel name");
  impl_->repeat.part = std::move(name_part);
  impl_->prev = cuda::t_diag.repeat;
  cuda::t_diag.repeat = &impl_->repeat;
}

KernelRepeat::~KernelRepeat() { cuda::t_diag.repeat = impl_->prev; }

}  // namespace tandem
