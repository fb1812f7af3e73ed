// Synthetic checkpoints: a real model folder (config.json + model.safetensors in bf16, or FP8 where the
// config asks for it, + a tokenizer.json) with random weights, for tests and benchmarks of any supported architecture.
// Weights are drawn like the oracle fixtures (N(0, 1/fan_in), embeddings N(0, 1), norms 1 + N(0, 0.01)),
// deterministically from (seed, tensor name), so a preset and a seed name one model everywhere.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// Names of the built-in presets and their one-line descriptions.
std::vector<std::pair<std::string, std::string>> synth_presets();
// config.json content of a preset; InputError for an unknown name (listing the known ones).
nlohmann::json synth_preset_config(const std::string& name);

struct SynthOptions {
  uint64_t seed = 0;
  // deepseek_v3 only: e_score_correction_bias[l][e] = router_skew · z with z ~ N(0, 1) per expert,
  // so expert popularity is skewed the way trained routers are (0: flat, as random weights give).
  double router_skew = 0.0;
  std::string tokenizer_path;  // copy this tokenizer.json; empty: a byte-level tokenizer
  bool progress = false;
};

// The config with DeepSeek's FP8 quantization_config (e4m3, dynamic activations, 128x128 blocks): a
// synthetic model of it stores every attention, MLP and expert weight as F8_E4M3 + F32 block scales,
// quantized (io/fp8_weights.h) from exactly the bf16 values the same seed gives the BF16 model.
nlohmann::json with_fp8_weights(nlohmann::json config);

// Writes DIR/config.json, DIR/model.safetensors, DIR/tokenizer.json. Returns the bytes written.
uint64_t write_synthetic_model(const nlohmann::json& config, const std::string& dir, const SynthOptions& options);

}  // namespace tandem
