// FP8 linear weights as DeepSeek-V3 and Qwen3 FP8 checkpoints store them: an F8_E4M3 tensor `<name>`
// with a companion F32 tensor `<name>_scale_inv` of block scales, w = fp8 · scale per block of
// quantization_config.weight_block_size (edge blocks partial). Which tensors are FP8 comes from the
// files' dtypes, never from a list of names; every one is validated here before a kernel reads it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "io/config.h"
#include "io/safetensors.h"

namespace tandem {

inline constexpr std::string_view kFp8ScaleSuffix = "_scale_inv";
// Largest block scale accepted: 448 · 2^100 (and the kernels' 2^8 rescaling) stay finite in f32.
inline constexpr float kFp8MaxScale = 0x1p100f;

// The weight `name` of a linear layer, of exactly `shape` [out, in]:
// - F32/BF16/F16: returned as is; a `<name>_scale_inv` next to it is an error (a scale is never dropped);
// - F8_E4M3: returned with TensorView::scale pointing at `<name>_scale_inv`, which must be F32 of shape
//   [ceil(out / block_rows), ceil(in / block_cols)] (quant: the config's block size; a model whose
//   config declares no FP8 quantization is refused), every scale finite and in (0, kFp8MaxScale]. No
//   weight byte may be a NaN code (0x7f / 0xff): the scan reads the whole tensor once.
// Anything else is an InputError naming the tensor, its file and what was expected.
TensorView require_linear(const TensorStore& store, const QuantConfig& quant, std::string_view name,
                          std::initializer_list<int64_t> shape);

// Checks an F8_E4M3 weight's bytes for NaN codes; InputError naming `what` and the first one's row and
// column otherwise. `w` is 2-D F8_E4M3.
void check_fp8_codes(const TensorView& w, std::string_view what);

// Quantizes w [rows, cols] (f32) into the same format: one scale per block of br x bc (edge blocks
// partial), scale = amax / 448 (1 for an all-zero block), code = f32_to_fp8_e4m3(w / scale), round to
// nearest even, so each block's largest magnitude maps to ±448. codes: [rows, cols];
// scales: [ceil(rows / br), ceil(cols / bc)].
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int64_t br, int64_t bc, uint8_t* codes,
                         float* scales);

}  // namespace tandem
