// MoE kernels (see moe.cuh).
#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/moe.cuh"

namespace tandem::cuda {

namespace {

constexpr int kRouteWarps = 4;

// Routes row r with the calling warp, exactly as moe/router.cpp. Lane `lane` holds experts e = lane +
// 32 i (i < PL, so E ≤ 32 · PL) in registers: their logits (and bias) are loaded together up front, and
// the top-k runs on the lanes' own maxima (a round's winner rescans only its PL values). score:
// [E] floats of the warp's shared memory (the weights are read from it), pick: [E] more (group
// selection only). Sums run in the same order as a sequential loop over j (ksum) or over each lane's
// experts then warp_sum (softmax), whatever the kernel. ids_sm (optional): the row's ids again, at
// ids_sm[r · kS ...] in shared memory.
template <int PL>
__device__ void route_row(const RouteArgs& a, int r, float* score, float* pick, int32_t* ids_sm = nullptr) {
  const int lane = threadIdx.x % kWarp;
  const int E = a.n_expert, kS = a.k + (a.shared_slot ? 1 : 0);
  const float* l = a.logits + int64_t(r) * E;
  float pv[PL];  // the values the selection runs on (picked ones become -inf)
  float lv[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int e = lane + kWarp * i;
    lv[i] = e < E ? l[e] : -INFINITY;
  }
  if (a.kind == RouteKind::kSoftmaxTopK) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PL; ++i) mx = fmaxf(mx, lv[i]);
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; ++i)
      if (lane + kWarp * i < E) sum += (lv[i] = expf(lv[i] - mx));
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      const int e = lane + kWarp * i;
      pv[i] = -INFINITY;
      if (e < E) score[e] = pv[i] = lv[i] / sum;
    }
  } else {
    float bv[PL];
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      const int e = lane + kWarp * i;
      bv[i] = a.bias && e < E ? a.bias[e] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      const int e = lane + kWarp * i;
      pv[i] = -INFINITY;
      if (e < E) {
        const float sg = 1.0f / (1.0f + expf(-lv[i]));
        score[e] = sg;
        pick[e] = pv[i] = sg + bv[i];
      }
    }
    __syncwarp();
    // Group scores (sum of the group's top two picks): lpg lanes per group scan it in turn, then merge
    // their top twos with shuffles; every lane of a group's segment ends with the group's score.
    const int per_group = E / a.n_group;
    int lpg = 1;
    while (lpg * 2 * a.n_group <= kWarp) lpg *= 2;
    const int g = lane / lpg, sub = lane % lpg;
    float b1 = -INFINITY, b2 = -INFINITY;
    if (g < a.n_group)
      for (int i = sub; i < per_group; i += lpg) {
        const float c = pick[g * per_group + i];
        if (c > b1) b2 = b1, b1 = c;
        else if (c > b2) b2 = c;
      }
    for (int o = 1; o < lpg; o <<= 1) {
      const float o1 = __shfl_xor_sync(0xffffffffu, b1, o), o2 = __shfl_xor_sync(0xffffffffu, b2, o);
      const float lo = fminf(b1, o1);
      b1 = fmaxf(b1, o1);
      b2 = fmaxf(lo, fmaxf(b2, o2));
    }
    float gs = 0.0f;
    gs += b1;
    if (per_group > 1) gs += b2;
    // Group g is chosen when fewer than topk_group groups beat it (higher score, or equal and lower
    // id): the same groups as picking the best one topk_group times.
    int rank = 0;
    for (int h = 0; h < a.n_group; ++h) {
      const float o = __shfl_sync(0xffffffffu, gs, h * lpg);
      rank += (o > gs || (o == gs && h < g)) ? 1 : 0;
    }
    const uint32_t chosen = __ballot_sync(0xffffffffu, sub == 0 && g < a.n_group && rank < a.topk_group);
    // Experts outside the chosen groups score 0.0 (not -inf), as the reference masks them.
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      const int e = lane + kWarp * i;
      if (e < E && !(chosen >> (e / per_group * lpg) & 1u)) pv[i] = 0.0f;
    }
  }
  __syncwarp();
  // Top-k: each lane's best (lowest id on ties: i ascending is e ascending), then the warp's.
  float lb = -INFINITY;
  int li = INT_MAX;
#pragma unroll
  for (int i = 0; i < PL; ++i)
    if (pv[i] > lb) lb = pv[i], li = lane + kWarp * i;
  float ksum = 0.0f, my_w = 0.0f;
  int my_id = 0;
  for (int j = 0; j < a.k; ++j) {
    float best = lb;
    int id = li;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, id, o);
      if (ov > best || (ov == best && oi < id)) best = ov, id = oi;
    }
    const float w = score[id];
    ksum += w;
    if (lane == j) my_id = id, my_w = w;
    if (li == id) {  // the winner drops it and rescans its own
      lb = -INFINITY, li = INT_MAX;
#pragma unroll
      for (int i = 0; i < PL; ++i) {
        if (lane + kWarp * i == id) pv[i] = -INFINITY;
        if (pv[i] > lb) lb = pv[i], li = lane + kWarp * i;
      }
    }
  }
  int32_t* ids = a.ids + int64_t(r) * kS;
  float* wts = a.weights + int64_t(r) * kS;
  if (lane < a.k) {
    float w = my_w;
    if (a.kind == RouteKind::kSoftmaxTopK) {
      w = a.norm_topk ? w / ksum : w;
    } else {
      if (a.norm_topk) w /= (ksum + 1e-20f);
      w = float(double(w) * a.routed_scaling);
    }
    ids[lane] = my_id;
    wts[lane] = w;
    if (ids_sm) ids_sm[r * kS + lane] = my_id;
  } else if (lane == a.k && a.shared_slot) {
    ids[lane] = E;
    wts[lane] = 1.0f;
    if (ids_sm) ids_sm[r * kS + lane] = E;
  }
}

// Calls f(std::integral_constant<int, PL>) with the fewest experts per lane route_row needs for E.
template <class F>
void with_route_pl(int E, F&& f) {
  if (E <= 2 * kWarp) f(std::integral_constant<int, 2>{});
  else if (E <= 4 * kWarp) f(std::integral_constant<int, 4>{});
  else if (E <= 8 * kWarp) f(std::integral_constant<int, 8>{});
  else if (E <= 12 * kWarp) f(std::integral_constant<int, 12>{});
  else if (E <= 16 * kWarp) f(std::integral_constant<int, 16>{});
  else f(std::integral_constant<int, 32>{});
}

template <int PL>
__global__ void route_kernel(RouteArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];  // [kRouteWarps][2 · n_expert]
  const int warp = threadIdx.x / kWarp;
  const int r = blockIdx.x * kRouteWarps + warp;
  if (r >= a.n) return;
  float* score = sm + warp * 2 * a.n_expert;
  route_row<PL>(a, r, score, score + a.n_expert);
}

constexpr int kGroupThreads = 1024;
constexpr int kGroupItems = kMaxGroupExperts / kGroupThreads;

// Groups the slots with the whole block (kGroupThreads threads). local_pos: [n_slots] ints of shared
// memory.
__device__ void group_block(const int32_t* ids, int n_slots, int n_experts, const uint8_t* cold_mask,
                            const MoeWork& w, int* local_pos) {
  using Scan = cub::BlockScan<int, kGroupThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int count[kMaxGroupExperts];
  __shared__ int offset[kMaxGroupExperts];
  __shared__ int n_cold;
  const int t = threadIdx.x;
  for (int e = t; e < n_experts; e += kGroupThreads) count[e] = 0;
  if (t == 0) n_cold = 0;
  __syncthreads();
  for (int s = t; s < n_slots; s += kGroupThreads) {
    const int e = ids[s];
    if (cold_mask && cold_mask[e])
      w.cold_slots[atomicAdd(&n_cold, 1)] = s, local_pos[s] = -1;
    else
      local_pos[s] = atomicAdd(&count[e], 1);
  }
  __syncthreads();
  int cnt[kGroupItems], act[kGroupItems], off[kGroupItems], aidx[kGroupItems];
#pragma unroll
  for (int i = 0; i < kGroupItems; ++i) {
    const int e = t * kGroupItems + i;
    cnt[i] = e < n_experts ? count[e] : 0;
    act[i] = cnt[i] > 0;
  }
  int total_active = 0;
  Scan(scan_tmp).ExclusiveSum(cnt, off);
  __syncthreads();
  Scan(scan_tmp).ExclusiveSum(act, aidx, total_active);
#pragma unroll
  for (int i = 0; i < kGroupItems; ++i) {
    const int e = t * kGroupItems + i;
    if (e < n_experts) offset[e] = off[i];
    if (act[i]) {
      w.act_expert[aidx[i]] = e;
      w.act_offset[aidx[i]] = off[i];
      w.act_count[aidx[i]] = cnt[i];
    }
  }
  if (t == 0) {
    *w.n_active = total_active;
    *w.n_cold = n_cold;
  }
  __syncthreads();
  for (int s = t; s < n_slots; s += kGroupThreads)
    if (local_pos[s] >= 0) w.slot_list[offset[ids[s]] + local_pos[s]] = s;
}

__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int32_t* ids, int n_slots, int n_experts,
                                                              const uint8_t* cold_mask, MoeWork w) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ int local_pos[];  // [n_slots]
  group_block(ids, n_slots, n_experts, cold_mask, w, local_pos);
}

// route_kernel then group_kernel in one block, for steps of at most kFuseRows rows: warp r routes row
// r exactly as route_kernel does, then the whole block groups the slots exactly as group_kernel does
// (its shared scratch reused for local_pos). Saves a launch per MoE layer.
constexpr int kFuseRows = kGroupThreads / kWarp;
constexpr size_t kFuseSmem = size_t(kMaxGroupSlots) * sizeof(int);  // the grouping's bound, as group_kernel

template <int PL>
__global__ void __launch_bounds__(kGroupThreads)
    route_group_kernel(RouteArgs a, int n_experts, const uint8_t* cold_mask, MoeWork w) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];  // [n][2 · n_expert] route scratch, then [n · kS] ints local_pos
  const int warp = threadIdx.x / kWarp;
  if (warp < a.n) {
    float* score = sm + warp * 2 * a.n_expert;
    route_row<PL>(a, warp, score, score + a.n_expert);
  }
  // The ids are in global memory, visible to the whole block after the barrier; sm is free again.
  __syncthreads();
  group_block(a.ids, a.n * (a.k + (a.shared_slot ? 1 : 0)), n_experts, cold_mask, w, reinterpret_cast<int*>(sm));
}

// Route + group for steps of at most one warp of slots (decode of a few sequences): warps 0 ..
// kSmallWarps - 1 route the rows (a.ids / a.weights wherever they point: global memory, or the
// block's shared memory), then warp 0 groups the ≤ 32 slots into w, lane s holding slot s:
// __match_any_sync finds the slots of each expert, and comparisons over the warp give each expert's
// place in id order (the active list, as group_block's scans make it, with the slots of one expert in
// slot order). sm: [kSmallWarps][2 · n_expert] floats of shared memory; scold: the cold mask in shared
// memory, filled before the call, or null. Ends with the block's threads in step (__syncthreads).
constexpr int kSmallWarps = 4;
template <int PL>
__device__ void route_group_small(const RouteArgs& a, int n_experts, const uint8_t* scold, const MoeWork& w,
                                  float* sm) {
  __shared__ int32_t sids[kWarp];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* score = sm + warp * 2 * a.n_expert;
  if (warp < kSmallWarps)
    for (int r = warp; r < a.n; r += kSmallWarps) route_row<PL>(a, r, score, score + a.n_expert, sids);
  __syncthreads();
  if (warp == 0) {
    const int n_slots = a.n * (a.k + (a.shared_slot ? 1 : 0));
    const int id = lane < n_slots ? sids[lane] : -1;
    const bool cold = id >= 0 && scold && scold[id];
    const bool hot = id >= 0 && !cold;
    const uint32_t lt = (1u << lane) - 1u;
    const uint32_t cold_b = __ballot_sync(0xffffffffu, cold);
    const uint32_t same = __match_any_sync(0xffffffffu, hot ? id : -1 - lane);  // every non-hot lane alone
    const bool leader = hot && (same & lt) == 0;
    const uint32_t lead_b = __ballot_sync(0xffffffffu, leader);
    int act = 0, off = 0;  // active experts / hot slots with a lower id
    for (int s = 0; s < kWarp; ++s) {
      const int o = __shfl_sync(0xffffffffu, id, s);
      const bool o_hot = (~cold_b >> s & 1u) && s < n_slots;
      if (o_hot && o < id) {
        off += 1;
        act += (lead_b >> s) & 1u;
      }
    }
    if (hot) w.slot_list[off + __popc(same & lt)] = lane;
    if (leader) {
      w.act_expert[act] = id;
      w.act_offset[act] = off;
      w.act_count[act] = __popc(same);
    }
    if (cold) w.cold_slots[__popc(cold_b & lt)] = lane;
    if (lane == 0) {
      *w.n_active = __popc(lead_b);
      *w.n_cold = __popc(cold_b);
    }
  }
  __syncthreads();
}

template <int PL>
__global__ void __launch_bounds__(kSmallWarps * kWarp)
    route_group_small_kernel(RouteArgs a, int n_experts, const uint8_t* cold_mask, MoeWork w) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];  // [kSmallWarps][2 · n_expert]
  __shared__ uint8_t scold[kMaxRouteExperts + 1];
  if (cold_mask)  // read while the rows are routed
    for (int e = threadIdx.x; e < n_experts; e += kSmallWarps * kWarp) scold[e] = cold_mask[e];
  route_group_small<PL>(a, n_experts, cold_mask ? scold : nullptr, w, sm);
}

constexpr int kExpertWarps = 8;
// Output features per warp in expert_down over routed experts: their weight rows are short (inter,
// 1 KB at 512 bf16), so one warp streams several, sharing the activation loads. Dense MLPs (rows of
// several KB, one expert) keep one per warp so that their grid still covers the SMs. Each feature's
// sum runs in the same order either way (1 restores the old layout).
constexpr int kDownFeatures = 4;

struct ExpertSlice {
  int e, off, cnt;
};

// Features (gate/up rows, down's row length) of expert e.
__device__ __forceinline__ int expert_inter(const ExpertTable& t, int e) {
  return t.inter_of ? t.inter_of[e] : e < t.n_routed ? t.inter : t.shared_inter;
}

__device__ __forceinline__ bool expert_slice(const MoeWork& w, const ExpertRun& r, ExpertSlice& s) {
  if (r.dense) {
    s = {0, 0, r.n};
    return true;
  }
  // The count and this block's entry load together (blockIdx.x < max_active, the lists' length, so
  // the entry is in bounds even past the count): one round trip before the weights, not two.
  const int ai = blockIdx.x;
  const int n_active = *w.n_active;
  s = {w.act_expert[ai], w.act_offset[ai], w.act_count[ai]};
  return ai < n_active;
}

// The start of every expert kernel: waits for the routing, lets the next kernel be scheduled, and
// finds this block's slice and its expert's feature count (false: the block has no expert).
__device__ __forceinline__ bool expert_block(const ExpertTable& t, const MoeWork& w, const ExpertRun& r,
                                             ExpertSlice& s, int& inter) {
  pdl_wait();
  pdl_launch_dependents();
  if (!expert_slice(w, r, s)) return false;
  inter = expert_inter(t, s.e);
  return true;
}

// Feature j's gate and up rows (wr) against the expert's rows in passes of R: h = silu(g) · u.
template <class T, int R>
__device__ __forceinline__ void gate_up_rows(const ExpertTable& t, const MoeWork& w, const ExpertRun& r,
                                             const ExpertSlice& s, const T* const (&wr)[2], int j, bool vec) {
  const int lane = threadIdx.x % kWarp;
  for (int c0 = 0; c0 < s.cnt; c0 += R) {
    const int nr = min(R, s.cnt - c0);
    const float* x[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int c = s.off + c0 + min(i, nr - 1);
      const int row = r.dense ? c : w.slot_list[c] / r.slots_per_row;
      x[i] = r.x + int64_t(row) * t.hidden;
    }
    float acc[2][R] = {};
    warp_dot_rows<T, 2, R, kNormNone, true>(wr, t.hidden, x, nr, vec, acc, nullptr, nullptr, l2_policy(r.evict_first));
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (i >= nr) break;
      const float g = warp_sum(acc[0][i]), u = warp_sum(acc[1][i]);
      if (lane == 0) r.h[int64_t(s.off + c0 + i) * r.h_stride + j] = g / (1.0f + expf(-g)) * u;
    }
  }
}

// Every pass takes kExpertRows rows (with_rows of the step).
template <class T, int kExpertRows>
__global__ void __launch_bounds__(kExpertWarps * kWarp)
    expert_gate_up_kernel(ExpertTable t, MoeWork w, ExpertRun r, bool vec) {
  ExpertSlice s;
  int inter;
  if (!expert_block(t, w, r, s, inter)) return;
  const int warp = threadIdx.x / kWarp;
  const int j = blockIdx.y * kExpertWarps + warp;
  if (j >= inter) return;
  const T* wr[2] = {static_cast<const T*>(t.gate[s.e]) + int64_t(j) * t.hidden,
                    static_cast<const T*>(t.up[s.e]) + int64_t(j) * t.hidden};
  gate_up_rows<T, kExpertRows>(t, w, r, s, wr, j, vec);
}

// Route + group + gate_up in one launch for one-row steps without a cold mask (kRoutedPL: experts per
// lane of the routing, so n_expert ≤ 384): every block routes the row and groups its slots itself
// (route_group_small into its shared memory: the same code, so the same choices and order as the
// separate launches), block (0, 0) also writes them out for expert_down, the combine and the hooks
// (they run after this kernel has completed), and then each block runs its active entry's features
// as expert_gate_up_kernel does. Saves the routing launch and its round trips on the step's path.
constexpr int kRoutedPL = 12;
template <class T>
__global__ void __launch_bounds__(kExpertWarps * kWarp)
    expert_gate_up_routed_kernel(RouteArgs a, int n_experts, ExpertTable t, MoeWork w, ExpertRun r, bool vec) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float sm[];  // [kSmallWarps][2 · n_expert]
  __shared__ int32_t s_ids[kWarp], s_list[kWarp], s_act[3][kWarp], s_n[2], s_cold[kWarp];
  __shared__ float s_wts[kWarp];
  RouteArgs as = a;
  as.ids = s_ids, as.weights = s_wts;
  const MoeWork ws{&s_n[0], s_act[0], s_act[1], s_act[2], s_list, &s_n[1], s_cold};
  route_group_small<kRoutedPL>(as, n_experts, nullptr, ws, sm);
  const int n_slots = a.k + (a.shared_slot ? 1 : 0);
  if (blockIdx.x == 0 && blockIdx.y == 0) {  // every slot is hot: no cold mask
    const int i = threadIdx.x;
    if (i < n_slots) a.ids[i] = s_ids[i], a.weights[i] = s_wts[i], w.slot_list[i] = s_list[i];
    if (i < s_n[0]) w.act_expert[i] = s_act[0][i], w.act_offset[i] = s_act[1][i], w.act_count[i] = s_act[2][i];
    if (i == 0) *w.n_active = s_n[0], *w.n_cold = 0;
  }
  const int ai = blockIdx.x;
  if (ai >= s_n[0]) return;
  const ExpertSlice s{s_act[0][ai], s_act[1][ai], s_act[2][ai]};
  const int warp = threadIdx.x / kWarp;
  const int j = blockIdx.y * kExpertWarps + warp;
  if (j >= expert_inter(t, s.e)) return;
  const T* wr[2] = {static_cast<const T*>(t.gate[s.e]) + int64_t(j) * t.hidden,
                    static_cast<const T*>(t.up[s.e]) + int64_t(j) * t.hidden};
  gate_up_rows<T, 1>(t, ws, r, s, wr, j, vec);
}

// Output features m0 .. m0 + nm of the expert's rows (wr: their down rows) in passes of R.
template <class T, int NF, int R>
__device__ __forceinline__ void down_rows(const ExpertTable& t, const MoeWork& w, const ExpertRun& r,
                                          const ExpertSlice& s, const T* const (&wr)[NF], int m0, int nm, int inter,
                                          bool vec) {
  const int lane = threadIdx.x % kWarp;
  for (int c0 = 0; c0 < s.cnt; c0 += R) {
    const int nr = min(R, s.cnt - c0);
    const float* x[R];
#pragma unroll
    for (int i = 0; i < R; ++i) x[i] = r.h + int64_t(s.off + c0 + min(i, nr - 1)) * r.h_stride;
    float acc[NF][R] = {};
    warp_dot_rows<T, NF, R, kNormNone, true>(wr, inter, x, nr, vec && inter % vec_of<T>() == 0, acc, nullptr, nullptr,
                                             l2_policy(r.evict_first));
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (i >= nr) break;
      const int c = s.off + c0 + i;
      const int slot = r.dense ? 0 : w.slot_list[c];
#pragma unroll
      for (int f = 0; f < NF; ++f) {
        const float v = warp_sum(acc[f][i]);
        if (lane == 0 && f < nm) {
          const int m = m0 + f;
          if (r.dense)
            r.out[int64_t(c) * t.hidden + m] += v;
          else
            r.out[int64_t(slot) * t.hidden + m] = r.slot_weight[slot] * v;
        }
      }
    }
  }
}

template <class T, int NF, int kExpertRows>
__global__ void __launch_bounds__(kExpertWarps * kWarp)
    expert_down_kernel(ExpertTable t, MoeWork w, ExpertRun r, bool vec) {
  ExpertSlice s;
  int inter;
  if (!expert_block(t, w, r, s, inter)) return;
  const int warp = threadIdx.x / kWarp;
  const int m0 = (blockIdx.y * kExpertWarps + warp) * NF;
  if (m0 >= t.hidden) return;
  const int nm = min(NF, t.hidden - m0);
  // A past-the-end feature re-reads the last row (never written), so the loads stay in bounds.
  const T* wr[NF];
#pragma unroll
  for (int f = 0; f < NF; ++f)
    wr[f] = static_cast<const T*>(t.down[s.e]) + int64_t(m0 + min(f, nm - 1)) * inter;
  down_rows<T, NF, kExpertRows>(t, w, r, s, wr, m0, nm, inter, vec);
}

__global__ void moe_combine_kernel(const float* slot_out, int kS, int H, float* moe_out, float* x) {
  pdl_wait();
  pdl_launch_dependents();
  const int r = blockIdx.x;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < H; i += gridDim.y * blockDim.x) {
    float v = 0.0f;
    for (int j = 0; j < kS; ++j) v += slot_out[(int64_t(r) * kS + j) * H + i];
    moe_out[int64_t(r) * H + i] = v;
    x[int64_t(r) * H + i] += v;
  }
}

// Vector loads need H and the h stride to be multiples of the 16-byte width (pointers come from
// cudaMalloc/cudaHostAlloc and are sliced at expert granularity, which keeps them aligned).
bool expert_vec(const ExpertTable& t, const ExpertRun& r) {
  const int V = 16 / int(wtype_size(t.wt));
  return t.hidden % V == 0 && r.h_stride % 4 == 0;
}

// features: output features of the kernel, per_warp of them to a warp.
dim3 expert_grid(const ExpertRun& r, int features, int per_warp) {
  const int per_block = kExpertWarps * per_warp;
  return dim3(r.dense ? 1 : r.max_active, (features + per_block - 1) / per_block);
}

template <int NF>
void launch_expert_down_nf(const ExpertTable& t, const MoeWork& w, const ExpertRun& r, const KernelPolicy& p,
                           cudaStream_t stream) {
  const dim3 grid = expert_grid(r, t.hidden, NF);
  const bool vec = expert_vec(t, r);
  with_rows(std::min(r.n, p.expert_max_rows), [&](auto rows) {  // an expert has at most all the step's rows
    constexpr int R = decltype(rows)::value;
    with_wtype(t.wt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_kernel(expert_down_kernel<T, NF, R>, grid, kExpertWarps * kWarp, 0, stream, t, w, r, vec);
    });
  });
}

}  // namespace

void launch_route(const RouteArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  TANDEM_CUDA_REQUIRE(a.n_group >= 1 && a.n_group <= 32 && a.n_expert % a.n_group == 0, "bad group count");
  TANDEM_CUDA_REQUIRE(a.n_expert <= kMaxRouteExperts && a.k <= kWarp - 1, "too many experts to route");
  const size_t smem = size_t(kRouteWarps) * 2 * a.n_expert * sizeof(float);
  with_route_pl(a.n_expert, [&](auto pl) {
    constexpr int PL = decltype(pl)::value;
    if (smem > 48 * 1024)
      TANDEM_CUDA_CHECK(cudaFuncSetAttribute(route_kernel<PL>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch_kernel(route_kernel<PL>, (a.n + kRouteWarps - 1) / kRouteWarps, kRouteWarps * kWarp, smem, stream, a);
  });
}

void launch_group(const int32_t* ids, int n_slots, int n_experts, const uint8_t* cold_mask, const MoeWork& w,
                  cudaStream_t stream) {
  TANDEM_CUDA_REQUIRE(n_experts <= kMaxGroupExperts, "too many experts to group");
  TANDEM_CUDA_REQUIRE(n_slots <= kMaxGroupSlots, "too many slots to group");
  const size_t smem = size_t(n_slots) * sizeof(int);
  // The kernel's static shared memory (~40 KB) plus the slots' may pass 48 KB: always allow 160 KB more.
  static const bool allowed = [] {
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(group_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           kMaxGroupSlots * int(sizeof(int))));
    return true;
  }();
  (void)allowed;
  launch_kernel(group_kernel, 1, kGroupThreads, smem, stream, ids, n_slots, n_experts, cold_mask, w);
}

void launch_route_group(const RouteArgs& a, int n_experts, const uint8_t* cold_mask, const MoeWork& w,
                        cudaStream_t stream) {
  const int kS = a.k + (a.shared_slot ? 1 : 0);
  const size_t smem = std::max(size_t(a.n) * 2 * size_t(a.n_expert) * sizeof(float), size_t(a.n) * kS * sizeof(int));
  if (a.n == 0 || a.n > kFuseRows || smem > kFuseSmem) {
    launch_route(a, stream);
    launch_group(a.ids, a.n * kS, n_experts, cold_mask, w, stream);
    return;
  }
  TANDEM_CUDA_REQUIRE(a.n_group >= 1 && a.n_group <= 32 && a.n_expert % a.n_group == 0, "bad group count");
  TANDEM_CUDA_REQUIRE(a.n_expert <= kMaxRouteExperts && a.k <= kWarp - 1, "too many experts to route");
  TANDEM_CUDA_REQUIRE(n_experts <= kMaxGroupExperts, "too many experts to group");
  TANDEM_CUDA_REQUIRE(a.n * kS > kWarp || n_experts <= kMaxRouteExperts + 1, "too many experts to group");
  with_route_pl(a.n_expert, [&](auto pl) {
    constexpr int PL = decltype(pl)::value;
    if (a.n * kS <= kWarp) {
      const size_t small = size_t(kSmallWarps) * 2 * size_t(a.n_expert) * sizeof(float);
      if (small > 48 * 1024)
        TANDEM_CUDA_CHECK(cudaFuncSetAttribute(route_group_small_kernel<PL>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(small)));
      launch_kernel(route_group_small_kernel<PL>, 1, kSmallWarps * kWarp, small, stream, a, n_experts, cold_mask, w);
      return;
    }
    // Static shared memory ~41 KB plus up to kFuseSmem: within the 227 KB of an sm_90 block.
    static const bool allowed = [] {
      TANDEM_CUDA_CHECK(cudaFuncSetAttribute(route_group_kernel<PL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(kFuseSmem)));
      return true;
    }();
    (void)allowed;
    launch_kernel(route_group_kernel<PL>, 1, kGroupThreads, smem, stream, a, n_experts, cold_mask, w);
  });
}

void launch_expert_gate_up(const ExpertTable& t, const MoeWork& w, const ExpertRun& r, const KernelPolicy& p,
                           cudaStream_t stream) {
  if (r.n == 0) return;
  const dim3 grid = expert_grid(r, std::max(t.inter, t.shared_inter), 1);
  const bool vec = expert_vec(t, r);
  with_rows(std::min(r.n, p.expert_max_rows), [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    with_wtype(t.wt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_kernel(expert_gate_up_kernel<T, R>, grid, kExpertWarps * kWarp, 0, stream, t, w, r, vec);
    });
  });
}

bool launch_expert_gate_up_routed(const RouteArgs& a, int n_experts, const ExpertTable& t, const MoeWork& w,
                                  const ExpertRun& r, cudaStream_t stream) {
  const int kS = a.k + (a.shared_slot ? 1 : 0);
  if (a.n != 1 || r.n != 1 || r.dense || kS > kWarp || a.n_expert > kRoutedPL * kWarp ||
      n_experts > kMaxRouteExperts + 1)
    return false;
  TANDEM_CUDA_REQUIRE(a.n_group >= 1 && a.n_group <= 32 && a.n_expert % a.n_group == 0, "bad group count");
  const dim3 grid = expert_grid(r, std::max(t.inter, t.shared_inter), 1);
  const size_t smem = size_t(kSmallWarps) * 2 * size_t(a.n_expert) * sizeof(float);  // ≤ 12 KB
  const bool vec = expert_vec(t, r);
  with_wtype(t.wt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_kernel(expert_gate_up_routed_kernel<T>, grid, kExpertWarps * kWarp, smem, stream, a, n_experts, t, w, r,
                  vec);
  });
  return true;
}

void launch_expert_down(const ExpertTable& t, const MoeWork& w, const ExpertRun& r, const KernelPolicy& p,
                        cudaStream_t stream) {
  if (r.n == 0) return;
  if (r.dense)
    launch_expert_down_nf<1>(t, w, r, p, stream);
  else
    launch_expert_down_nf<kDownFeatures>(t, w, r, p, stream);
}

void launch_moe_combine(const float* slot_out, int n, int kS, int H, float* moe_out, float* x,
                        cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(moe_combine_kernel, dim3(n, (H + 255) / 256), 256, 0, stream, slot_out, kS, H, moe_out, x);
}

}  // namespace tandem::cuda
