// Cold experts held by the peer (see cold_experts.h).
#include "peer/cold_experts.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "moe/experts.h"

namespace tandem {

namespace {
size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// Bytes copy_to writes for a whole (unsliced) view: its elements, then its FP8 scale grid.
size_t room_of(const TensorView& v) { return align64(v.nbytes()) + align64(v.scale_nbytes()); }

// Copies a view (with its FP8 block scales, kept in FP8: the kernels dequantize in registers) into
// `dst` and returns the view re-pointed there.
TensorView copy_to(const TensorView& v, uint8_t*& dst) {
  TANDEM_ASSERT(v.scale.row0 == 0, "cold expert views are whole tensors");
  std::memcpy(dst, v.data, v.nbytes());
  TensorView out = v;
  out.data = dst;
  dst += align64(v.nbytes());
  if (!v.scale.empty()) {
    std::memcpy(dst, v.scale.data, v.scale_nbytes());
    out.scale.data = reinterpret_cast<const float*>(dst);
    dst += align64(v.scale_nbytes());
  }
  return out;
}
}  // namespace

ColdExperts::ColdExperts(const Model& model, const Rowmap& rowmap, ThreadPool& pool, int64_t split_begin)
    : hidden_(model.cfg.hidden_size), n_expert_(model.cfg.n_expert), pool_(pool) {
  const auto& c = model.cfg;
  experts_.assign(size_t(c.n_layer), std::vector<ExpertWeights>(size_t(c.n_expert)));
  // Bytes a cold expert takes in the arena (each of its parts 64-byte aligned).
  auto room = [&](const ExpertWeights& src) -> size_t {
    if (split_begin > 0) return sliced_bytes(src, split_begin, src.gate.rows());
    size_t bytes = 0;
    for (const auto* v : {&src.gate, &src.up, &src.down}) bytes += room_of(*v);
    return bytes;
  };
  auto for_each_cold = [&](auto&& fn) {
    for (int64_t l = 0; l < c.n_layer; ++l) {
      if (!c.layer_is_moe[size_t(l)]) continue;
      for (int64_t e = 0; e < c.n_expert; ++e) {
        if (!rowmap.is_cold(l, int32_t(e))) continue;
        const ExpertWeights& src = model.layers[size_t(l)].experts[size_t(e)];
        TANDEM_ASSERT(src.present(), "cold expert {}/{} not bound", l, e);
        fn(l, e, src);
      }
    }
  };
  size_t total = 0;
  for_each_cold([&](int64_t l, int64_t e, const ExpertWeights& src) {
    if (split_begin >= src.gate.rows())
      fail("split column {} is past the {} features of expert {}/{}", split_begin, src.gate.rows(), l, e);
    total += room(src);
    ++n_cold_;
  });
  try {
    storage_ = HostBuffer(total);  // one arena on huge pages: the experts are streamed every step
  } catch (const std::bad_alloc&) {
    fail("cannot map {:.3f} GB of host memory for the {} cold experts of the rowmap", double(total) / 1e9, n_cold_);
  }
  uint8_t* p = storage_.data();
  for_each_cold([&](int64_t l, int64_t e, const ExpertWeights& src) {
    ExpertWeights& dst = experts_[size_t(l)][size_t(e)];
    uint8_t* const start = p;
    if (split_begin > 0) {
      dst = slice_expert(src, split_begin, src.gate.rows(), p);
    } else {
      dst.gate = copy_to(src.gate, p);
      dst.up = copy_to(src.up, p);
      dst.down = copy_to(src.down, p);
    }
    p = start + room(src);
    bytes_ += dst.nbytes();
  });
}

double ColdExperts::huge_page_share() const {
  if (storage_.size() == 0) return 0.0;
  const int64_t huge = storage_.huge_bytes();
  return huge < 0 ? -1.0 : std::min(1.0, double(huge) / double(storage_.size()));
}

void ColdExperts::compute(int layer, const float* x, int64_t n_rows, const int32_t* ids, const float* weights,
                          int64_t k, float* out) {
  run_experts_cpu(experts_[size_t(layer)], x, n_rows, hidden_, ids, weights, k, out, pool_);
}

}  // namespace tandem
