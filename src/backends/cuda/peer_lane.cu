// Peer lane kernels (see peer_lane.cuh). Memory order towards the host: every block fences its slot
// writes with __threadfence_system() before it counts itself done; the last block fences again and
// only then stores the request counter (volatile, 64-bit), so the peer (acquire load of seq) never
// sees a torn payload. On the way back the response counter is polled with volatile loads, then a
// system fence, then the rows are read with __ldcv (no stale cached copy of the slot).
// PDL (launch.cuh): both kernels wait for their predecessor before their first instruction of
// substance, so a request is never published, nor an answer polled, before the rows and the hot
// experts it follows are complete.
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/peer_lane.cuh"

namespace tandem::cuda {

namespace {

constexpr int kSubmitThreads = 128;
constexpr int kWaitThreads = 256;
constexpr int kWaitBlocks = 32;
constexpr uint32_t kServing = 1, kTripped = 2;  // peer::LaneState values (protocol.h)
constexpr unsigned kMaxNapNs = 20000;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void set_err(PeerDevState* st, int code, int value) {
  if (atomicCAS(&st->err, 0, code) == 0) st->err_value = value;
}

__global__ void __launch_bounds__(kSubmitThreads)
    peer_submit_kernel(PeerDev d, int layer, const float* x, const int32_t* ids, const float* w,
                       const uint8_t* mask, int r0, int count, int kS, int k) {
  pdl_wait();
  pdl_launch_dependents();
  PeerDevState* st = d.st;
  if (st->err) return;  // set only by wait kernels (earlier launches): constant here
  __shared__ int n_cold;
  const int b = blockIdx.x, r = r0 + b, t = threadIdx.x;
  if (t == 0) n_cold = 0;
  __syncthreads();
  for (int j = t; j < d.max_k; j += blockDim.x) {
    int32_t id = -1;
    float wt = 0.0f;
    if (j < k) {
      const int32_t e = ids[int64_t(r) * kS + j];
      if (mask[e]) {
        id = e;
        wt = w[int64_t(r) * kS + j];
        atomicAdd(&n_cold, 1);
      }
    }
    d.ids[int64_t(b) * d.max_k + j] = id;
    d.weights[int64_t(b) * d.max_k + j] = wt;
  }
  __syncthreads();
  if (n_cold > 0) {
    const float* src = x + int64_t(r) * d.hidden;
    float* dst = d.x + int64_t(b) * d.hidden;
    if (d.hidden % 4 == 0) {
      for (int i = t; i < d.hidden / 4; i += blockDim.x)
        reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[i];
    } else {
      for (int i = t; i < d.hidden; i += blockDim.x) dst[i] = src[i];
    }
  }
  __threadfence_system();
  __syncthreads();
  if (t != 0) return;
  if (n_cold > 0) {
    atomicAdd(&st->chunk_rows, 1u);
    atomicAdd(&st->cold_slots, static_cast<unsigned long long>(n_cold));
    atomicAdd(&d.layer_cold_slots[layer], static_cast<unsigned long long>(n_cold));
  }
  __threadfence();
  const unsigned ticket = atomicAdd(&st->blocks_done, 1u);
  if (ticket != unsigned(count - 1)) return;
  // Last block: every other block's slot writes are fenced; publish.
  __threadfence();
  const unsigned rows = atomicAdd(&st->chunk_rows, 0u);
  st->blocks_done = 0;
  st->chunk_rows = 0;
  if (rows == 0) {
    st->pending = 0;
    return;
  }
  *reinterpret_cast<volatile int32_t*>(d.req_layer) = layer;
  *reinterpret_cast<volatile uint32_t*>(d.req_n_rows) = uint32_t(count);
  *reinterpret_cast<volatile uint32_t*>(d.req_k) = uint32_t(k);
  __threadfence_system();
  const unsigned long long seq = st->sent + 1;
  st->sent = seq;
  *reinterpret_cast<volatile unsigned long long*>(d.req_seq) = seq;
  __threadfence_system();
  st->pending = 1;
  st->rows_sent += rows;
}

// Thread 0 of a block: waits for the answer to `expected`. False when the lane failed (err set).
__device__ bool wait_answer(const PeerDev& d, unsigned long long expected, int count) {
  PeerDevState* st = d.st;
  const unsigned long long t0 = global_ns();
  bool over = false;
  unsigned nap = 64;
  for (unsigned it = 0;; ++it) {
    const unsigned long long s = *reinterpret_cast<const volatile unsigned long long*>(d.resp_seq);
    if (s == expected) break;
    if (s > expected || s + 1 < expected) {
      set_err(st, kPeerProtocol, int(s & 0x7fffffff));
      return false;
    }
    if ((it & 15) == 15) {
      const uint32_t state = *reinterpret_cast<const volatile uint32_t*>(d.state);
      if (state != kServing) {
        set_err(st, state == kTripped ? kPeerTripped : kPeerStopped, int(state));
        return false;
      }
      if (!over && global_ns() - t0 > d.spin_ns) over = true;
    }
    if (over) {
      __nanosleep(nap);
      nap = min(nap * 2, kMaxNapNs);
    }
  }
  __threadfence_system();
  // A tripped lane fails even an answer that arrived: the lane ended.
  const uint32_t state = *reinterpret_cast<const volatile uint32_t*>(d.state);
  if (state != kServing) {
    set_err(st, state == kTripped ? kPeerTripped : kPeerStopped, int(state));
    return false;
  }
  if (blockIdx.x != 0) return true;
  const uint32_t status = *reinterpret_cast<const volatile uint32_t*>(d.resp_status);
  const uint32_t echo = *reinterpret_cast<const volatile uint32_t*>(d.resp_n_rows);
  if (status != 0) {
    set_err(st, kPeerStatus, int(status));
    return false;
  }
  if (echo != uint32_t(count)) {
    set_err(st, kPeerProtocol, -int(echo & 0x7fffffff) - 1);
    return false;
  }
  // The primary is the only writer of these header counters: keep them here, mirror them there.
  const unsigned long long wait = global_ns() - t0;
  st->handoffs += 1;
  st->overruns += over ? 1 : 0;
  st->wait_ns_total += wait;
  st->wait_ns_max = max(st->wait_ns_max, wait);
  unsigned long long us = wait / 1000;
  int bucket = 0;
  while (us > 0 && bucket < kPeerHistBuckets - 1) {
    us >>= 1;
    ++bucket;
  }
  st->hist[bucket] += 1;
  volatile unsigned long long* hc = d.h_counters;
  hc[0] = st->handoffs;
  hc[1] = st->overruns;
  hc[2] = st->wait_ns_total;
  hc[3] = st->wait_ns_max;
  d.h_hist[bucket] = st->hist[bucket];
  return true;
}

__global__ void __launch_bounds__(kWaitThreads)
    peer_wait_kernel(PeerDev d, const int32_t* ids, const uint8_t* mask, int r0, int count, int kS, int k,
                     bool accumulate, float* slot_out) {
  pdl_wait();
  pdl_launch_dependents();  // the next kernel's blocks wait in their pdl_wait() until this grid is done
  PeerDevState* st = d.st;
  if (st->err || !st->pending) return;
  __shared__ int ok;
  if (threadIdx.x == 0) ok = wait_answer(d, st->sent, count);
  __syncthreads();
  if (!ok) return;
  const int H = d.hidden;
  for (int b = blockIdx.x; b < count; b += gridDim.x) {
    const int r = r0 + b;
    int first = -1;
    for (int j = 0; j < k; ++j) {
      if (!mask[ids[int64_t(r) * kS + j]]) continue;
      float* dst = slot_out + (int64_t(r) * kS + j) * H;
      if (first < 0) {
        first = j;
        const float* src = d.out + int64_t(b) * H;
        if (accumulate) {
          for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] += __ldcv(src + i);
          break;
        }
        for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = __ldcv(src + i);
      } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = 0.0f;
      }
    }
  }
}

}  // namespace

void launch_peer_submit(const PeerDev& d, int layer, const float* x, const int32_t* ids, const float* weights,
                        const uint8_t* cold_mask, int r0, int count, int kS, int k, cudaStream_t stream) {
  if (count == 0) return;
  TANDEM_CUDA_REQUIRE(k >= 1 && k <= d.max_k && k <= kS, "peer submit: bad k");
  launch_kernel(peer_submit_kernel, count, kSubmitThreads, 0, stream, d, layer, x, ids, weights, cold_mask, r0, count,
                kS, k);
}

void launch_peer_wait(const PeerDev& d, const int32_t* ids, const uint8_t* cold_mask, int r0, int count, int kS,
                      int k, bool accumulate, float* slot_out, cudaStream_t stream) {
  if (count == 0) return;
  launch_kernel(peer_wait_kernel, count < kWaitBlocks ? count : kWaitBlocks, kWaitThreads, 0, stream, d, ids, cold_mask,
                r0, count, kS, k, accumulate, slot_out);
}

}  // namespace tandem::cuda
