// Routed-expert execution on the CPU (see experts.h). Rows are grouped by expert so each touched
// expert's weights are streamed once per call, however many rows use it. All touched experts of a call
// are spread over the pool in two parallel regions (gate+up with SwiGLU, then down), each task owning a
// block of one expert's output features, so a step with a few small experts still keeps every core
// streaming weights and pays two dispatches, not three per expert.
#include "moe/experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "core/error.h"

namespace tandem {

namespace {

// Output features per task: a multiple of the kernels' 16-row tiles, small enough to balance.
constexpr int64_t kBlock = 16;

// Rows [r0, r1) of a 2-D weight view.
TensorView row_slice(const TensorView& w, int64_t r0, int64_t r1) {
  TensorView v = w;
  v.data = w.row_ptr(r0);
  v.shape.dims[0] = r1 - r0;
  v.scale.row0 += r0;  // FP8: the same scale grid, looked up from the slice's first row
  return v;
}

ThreadPool& serial_pool() {
  thread_local ThreadPool pool(1);
  return pool;
}

struct Scratch {
  std::vector<std::vector<int64_t>> by_expert;  // [n_expert] slots (row * k + j)
  std::vector<int32_t> active;                  // experts with at least one slot
  std::vector<int64_t> offset;                  // [active] first packed row of each active expert
  std::vector<float> xs, gate, up, ys;          // packed rows: [total, H], [total, inter] x2, [total, H]
};

}  // namespace

int64_t split_column(int64_t inter, double fraction) {
  if (!(fraction > 0.0 && fraction < 1.0)) fail("split fraction {} is outside (0, 1)", fraction);
  if (inter < 16) fail("experts of {} intermediate features are too small to split (need 16)", inter);
  const int64_t a = int64_t(std::llround(fraction * double(inter) / 8.0)) * 8;
  return std::clamp<int64_t>(a, 8, (inter - 8) / 8 * 8);
}

double split_share_for(double link_gbps, double dram_gbps) {
  for (double g : {link_gbps, dram_gbps})
    if (!(g > 0) || !std::isfinite(g))
      fail("split share: bandwidths must be positive, got link {} and DRAM {} GB/s", link_gbps, dram_gbps);
  return link_gbps / (link_gbps + dram_gbps);
}

namespace {
size_t align64(size_t n) { return (n + 63) / 64 * 64; }
}  // namespace

namespace {
void refuse_fp8_slice(const ExpertWeights& e) {
  for (const TensorView* v : {&e.gate, &e.up, &e.down})
    if (v->dtype == DType::kF8E4M3)
      fail("the split lane does not support FP8 (F8_E4M3) experts yet (issue 31): use the peer lane");
}
}  // namespace

size_t sliced_bytes(const ExpertWeights& e, int64_t begin, int64_t end) {
  refuse_fp8_slice(e);
  const size_t cells = size_t(end - begin) * size_t(e.gate.cols());
  return align64(cells * dtype_size(e.gate.dtype)) + align64(cells * dtype_size(e.up.dtype)) +
         align64(cells * dtype_size(e.down.dtype));
}

ExpertWeights slice_expert(const ExpertWeights& e, int64_t begin, int64_t end, uint8_t* dst) {
  refuse_fp8_slice(e);
  const int64_t inter = e.gate.rows(), hidden = e.gate.cols(), n = end - begin;
  TANDEM_ASSERT(begin >= 0 && begin < end && end <= inter && e.down.rows() == hidden && e.down.cols() == inter,
                "bad expert slice [{}, {}) of {}", begin, end, inter);
  ExpertWeights out;
  TensorView* views[2] = {&out.gate, &out.up};
  const TensorView* srcs[2] = {&e.gate, &e.up};
  for (int i = 0; i < 2; ++i) {
    const size_t part = size_t(n) * size_t(hidden) * dtype_size(srcs[i]->dtype);
    std::memcpy(dst, srcs[i]->row_ptr(begin), part);
    *views[i] = *srcs[i];
    views[i]->data = dst;
    views[i]->shape.dims[0] = n;
    dst += align64(part);
  }
  const size_t des = dtype_size(e.down.dtype), row = size_t(n) * des;
  for (int64_t m = 0; m < hidden; ++m)
    std::memcpy(dst + size_t(m) * row, static_cast<const uint8_t*>(e.down.row_ptr(m)) + size_t(begin) * des, row);
  out.down = e.down;
  out.down.data = dst;
  out.down.shape.dims[1] = n;
  return out;
}

void run_mlp_cpu(const ExpertWeights& mlp, const float* x, int64_t n_rows, int64_t hidden, float* out,
                 ThreadPool& pool) {
  const int64_t inter = mlp.gate.rows();
  thread_local std::vector<float> g, u;
  g.resize(size_t(n_rows * inter));
  u.resize(size_t(n_rows * inter));
  cpu::matmul(x, n_rows, mlp.gate, g.data(), pool);
  cpu::matmul(x, n_rows, mlp.up, u.data(), pool);
  cpu::silu_mul(g.data(), u.data(), n_rows * inter);
  cpu::matmul(g.data(), n_rows, mlp.down, out, pool);
}

void run_experts_cpu(std::span<const ExpertWeights> experts, const float* x, int64_t n_rows, int64_t hidden,
                     const int32_t* ids, const float* weights, int64_t k, float* out, ThreadPool& pool) {
  // A reference, not the thread_local itself: the lambdas below run on pool threads, where the name
  // would denote those threads' own (empty) scratch.
  thread_local Scratch scratch;
  Scratch& s = scratch;
  std::fill(out, out + n_rows * hidden, 0.0f);
  s.by_expert.resize(experts.size());
  for (auto& v : s.by_expert) v.clear();
  s.active.clear();
  for (int64_t i = 0; i < n_rows * k; ++i) {
    int32_t e = ids[i];
    if (e < 0) continue;
    TANDEM_ASSERT(size_t(e) < experts.size() && experts[size_t(e)].present(), "expert {} not present", e);
    if (s.by_expert[size_t(e)].empty()) s.active.push_back(e);
    s.by_expert[size_t(e)].push_back(i);
  }
  if (s.active.empty()) return;
  std::sort(s.active.begin(), s.active.end());
  const int64_t inter = experts[size_t(s.active[0])].gate.rows();
  s.offset.resize(s.active.size());
  int64_t total = 0;
  for (size_t a = 0; a < s.active.size(); ++a) {
    TANDEM_ASSERT(experts[size_t(s.active[a])].gate.rows() == inter, "experts of one layer differ in width");
    s.offset[a] = total;
    total += int64_t(s.by_expert[size_t(s.active[a])].size());
  }
  s.xs.resize(size_t(total * hidden));
  s.gate.resize(size_t(total * inter));
  s.up.resize(size_t(total * inter));
  s.ys.resize(size_t(total * hidden));
  for (size_t a = 0; a < s.active.size(); ++a) {
    const auto& slots = s.by_expert[size_t(s.active[a])];
    for (size_t i = 0; i < slots.size(); ++i) {
      const int64_t row = slots[i] / k;
      std::copy(x + row * hidden, x + (row + 1) * hidden, s.xs.begin() + (s.offset[a] + int64_t(i)) * hidden);
    }
  }
  const int64_t n_active = int64_t(s.active.size());
  const int64_t up_blocks = (inter + kBlock - 1) / kBlock, down_blocks = (hidden + kBlock - 1) / kBlock;
  // Phase 1: gate and up projections and SwiGLU, one (expert, feature block) per task.
  pool.parallel_for(n_active * up_blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t a = t / up_blocks, f0 = (t % up_blocks) * kBlock, f1 = std::min(inter, f0 + kBlock);
      const ExpertWeights& e = experts[size_t(s.active[size_t(a)])];
      const int64_t m = int64_t(s.by_expert[size_t(s.active[size_t(a)])].size()), off = s.offset[size_t(a)];
      float* g = s.gate.data() + off * inter + f0;
      float* u = s.up.data() + off * inter + f0;
      const float* xa = s.xs.data() + off * hidden;
      cpu::matmul(xa, m, row_slice(e.gate, f0, f1), g, serial_pool(), hidden, inter);
      cpu::matmul(xa, m, row_slice(e.up, f0, f1), u, serial_pool(), hidden, inter);
      for (int64_t r = 0; r < m; ++r) cpu::silu_mul(g + r * inter, u + r * inter, f1 - f0);
    }
  });
  // Phase 2: down projection, one (expert, output block) per task.
  pool.parallel_for(n_active * down_blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t a = t / down_blocks, h0 = (t % down_blocks) * kBlock, h1 = std::min(hidden, h0 + kBlock);
      const ExpertWeights& e = experts[size_t(s.active[size_t(a)])];
      const int64_t m = int64_t(s.by_expert[size_t(s.active[size_t(a)])].size()), off = s.offset[size_t(a)];
      cpu::matmul(s.gate.data() + off * inter, m, row_slice(e.down, h0, h1), s.ys.data() + off * hidden + h0,
                  serial_pool(), inter, hidden);
    }
  });
  // Combine in expert order (deterministic for any thread count).
  for (size_t a = 0; a < s.active.size(); ++a) {
    const auto& slots = s.by_expert[size_t(s.active[a])];
    for (size_t i = 0; i < slots.size(); ++i) {
      const int64_t slot = slots[i], row = slot / k;
      cpu::axpy(weights[slot], s.ys.data() + (s.offset[a] + int64_t(i)) * hidden, out + row * hidden, hidden);
    }
  }
}

}  // namespace tandem
