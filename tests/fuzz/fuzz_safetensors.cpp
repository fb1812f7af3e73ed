// libFuzzer target: arbitrary bytes as a whole safetensors file. Only InputError may come out; a
// header that is accepted must describe tensors that lie inside the file and tile its data area.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  SafetensorsHeader h;
  try {
    h = parse_safetensors_header(data, size, size, "fuzz");
  } catch (const InputError&) {
    return 0;
  }
  uint64_t data_size = size - 8 - h.header_len;
  uint64_t at = 0;
  for (const TensorInfo& t : h.tensors) {
    TANDEM_ASSERT(t.begin == at && t.end >= t.begin && t.end <= data_size, "tensor '{}' [{}, {}] misplaced",
                  t.name, t.begin, t.end);
    TANDEM_ASSERT(uint64_t(t.shape.numel()) * dtype_size(t.dtype) == t.end - t.begin, "tensor '{}' size", t.name);
    at = t.end;
  }
  TANDEM_ASSERT(at == data_size, "data area {} bytes, tensors cover {}", data_size, at);
  return 0;
}
