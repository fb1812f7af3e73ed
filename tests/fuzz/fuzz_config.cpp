// libFuzzer target: arbitrary bytes as config.json. Bytes that are not JSON are skipped; JSON goes to
// parse_config, from which only InputError may come out (a json type_error or out_of_range escaping
// it is a finding: a field read without checking its type).
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    tandem::ModelConfig config = tandem::parse_config(j, "fuzz");
    (void)config.n_moe_layers();
    (void)config.kv_floats_per_token_layer();
  } catch (const tandem::InputError&) {
  }
  return 0;
}
