// Element types of plain (unquantized) tensors and bulk conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/half.h"

namespace qlft {

enum class DType : uint8_t { F32, F16, BF16, F64, I8, U8, I16, I32, I64, BOOL };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

// Bulk conversions; vectorized with AVX-512 where the build has it.
void f32_to_bf16_n(const float* src, uint16_t* dst, size_t n);
void bf16_to_f32_n(const uint16_t* src, float* dst, size_t n);
void f32_to_f16_n(const float* src, uint16_t* dst, size_t n);
void f16_to_f32_n(const uint16_t* src, float* dst, size_t n);

// f32_to_bf16_n for t = BF16, else f32_to_f16_n.
void f32_to_16_n(DType t, const float* src, uint16_t* dst, size_t n);
// n f32 values as a file stores them in type t: their n * dtype_size(t) bytes (F32: src itself;
// F16, BF16: rounded to nearest even into *buf). Any other t is QLFT_ERR_INVALID_ARGUMENT naming
// `what` (the writer, the tensor and the call).
const void* f32_as_stored(DType t, const float* src, size_t n, std::vector<uint16_t>* buf,
                          const std::string& what);

// dst[i] = src[i] rounded to BF16 or F16 and back (autocast emulation: what a low-precision
// matmul input holds). F16 overflow gives inf, as on hardware. F32 copies.
void round_through_n(DType t, const float* src, float* dst, size_t n);

// Converts n elements of a plain dtype to f32 (F32, F16, BF16, F64, I8, U8, I16, I32, I64).
void to_f32_n(DType t, const void* src, float* dst, size_t n);

}  // namespace qlft
