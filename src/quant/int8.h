// LLM.int8 weight storage (bitsandbytes int8_vectorwise_quant with threshold 0): per row,
// SCB = max |x| and codes = round_half_even(x * (127 / SCB)).
#pragma once

#include <cstdint>

namespace qlft {

// x: rows x cols row-major; codes: rows x cols; scb: rows.
void int8_quantize_rows(const float* x, int64_t rows, int64_t cols, int8_t* codes, float* scb);
// Rows [r0, r0 + n) into out (n x cols): code * SCB / 127 as bitsandbytes int8_vectorwise_dequant.
void int8_dequantize_rows(const int8_t* codes, const float* scb, int64_t r0, int64_t n,
                          int64_t cols, float* out);

}  // namespace qlft
