// Element types of plain (unquantized) tensors and bulk conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>

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

// dst[i] = src[i] rounded to BF16 or F16 and back (autocast emulation: what a low-precision
// matmul input holds). F16 overflow gives inf, as on hardware. F32 copies.
void round_through_n(DType t, const float* src, float* dst, size_t n);

// Converts n elements of a plain dtype to f32 (F32, F16, BF16, F64, I8, U8, I16, I32, I64).
void to_f32_n(DType t, const void* src, float* dst, size_t n);

}  // namespace qlft
