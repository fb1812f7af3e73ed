// Model fingerprint: a stable 64-bit FNV-1a hash over a canonical text of the architecture-relevant
// configuration and every tensor's name, dtype and shape (weights' values are not read). Stats files
// and rowmaps carry it; the peer protocol carries the rowmap fingerprint (model + hot/cold lists).
// The exact recipe is in docs/placement.md; it must never change without bumping the "fp1:" prefix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"

namespace tandem {

class TensorStore;

// 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over bytes.
class Fnv1a64 {
 public:
  void add(std::string_view bytes);
  uint64_t value() const { return h_; }
  // "fp1:" + 16 lower-case hex digits.
  std::string fingerprint() const;

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

struct TensorMeta {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
};

// Name, dtype and shape of every tensor of the store.
std::vector<TensorMeta> tensor_metas(const TensorStore& store);
// The tensors as a process loading with `cfg` holds them: the store's, except that with
// cfg.quant.at_load (--weights fp8) each routed expert weight (".experts." in its name) stored in a float
// dtype is F8_E4M3 with a "<name>_scale_inv" F32 grid. model_fingerprint(cfg, store) and the memory
// model count these.
std::vector<TensorMeta> tensor_metas(const ModelConfig& cfg, const TensorStore& store);

// The canonical text that is hashed (exposed for docs and tests): config fields first, then one line
// per tensor sorted by name ("tensor=<name> <DTYPE> [d0,d1,...]").
std::string fingerprint_text(const ModelConfig& cfg, std::vector<TensorMeta> tensors);
// "fp1:<16 hex>" of fingerprint_text. The tensor order given does not matter.
std::string model_fingerprint(const ModelConfig& cfg, std::vector<TensorMeta> tensors);
std::string model_fingerprint(const ModelConfig& cfg, const TensorStore& store);

}  // namespace tandem
