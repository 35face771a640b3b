// Dequantization of GGUF tensor data (plain and block types) to f32.
#pragma once

#include <cstdint>

namespace qlft {

// n elements (a multiple of the type's block size) from src to dst. Throws
// QLFT_ERR_UNSUPPORTED for types qlft cannot dequantize (ggml_type_traits(type)->dequantizable).
void ggml_dequantize(uint32_t ggml_type, const void* src, int64_t n, float* dst);

}  // namespace qlft
