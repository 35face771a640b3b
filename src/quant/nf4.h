// NF4 blockwise 4-bit quantization, bitsandbytes-compatible (quantize_4bit / dequantize_4bit with
// quant_type="nf4", CPU path of bitsandbytes 0.50.2), over a row-major flattened tensor:
//  - blocks of `blocksize` consecutive elements (the last may be partial), absmax per block;
//  - packed byte i holds element 2i in the high nibble, 2i+1 in the low one (odd n: zero pad);
//  - double quantization ("compress_statistics"): offset = mean(absmax), then absmax - offset is
//    quantized blockwise (nested blocksize 256) with the signed dynamic 8-bit map.
#pragma once

#include <array>
#include <cstdint>

namespace qlft {

// Checks blocksize is a power of two in [2, 65536]; throws INVALID_ARGUMENT naming `what`.
void nf4_check_blocksize(int64_t blocksize, const char* what);
inline int64_t nf4_num_blocks(int64_t n, int64_t blocksize) {
  return (n + blocksize - 1) / blocksize;
}
inline int64_t nf4_packed_bytes(int64_t n) {
  return (n + 1) / 2;
}

// packed: nf4_packed_bytes(n) bytes; absmax: nf4_num_blocks(n, blocksize) floats.
void nf4_quantize(const float* x, int64_t n, int64_t blocksize, uint8_t* packed, float* absmax);

// Double quantization of nblocks absmax values: codes[nblocks], nested_absmax[ceil(nblocks /
// nested_blocksize)], *offset. Uses the signed dynamic map (nf4_nested_code()).
void nf4_double_quantize(const float* absmax, int64_t nblocks, int64_t nested_blocksize,
                         uint8_t* codes, float* nested_absmax, float* offset);
// absmax[b] for blocks [b0, b0 + count) from the double-quantized statistics.
void nf4_decode_absmax(const uint8_t* codes, const float* nested_absmax, const float* nested_code,
                       float offset, int64_t nested_blocksize, int64_t b0, int64_t count,
                       float* absmax);

// The signed dynamic map bitsandbytes uses for the nested absmax (create_dynamic_map(True)).
const std::array<float, 256>& nf4_nested_code();

// Dequantizes elements [e0, e0 + count) of the flattened tensor into out; blocks need not be
// aligned with e0. absmax[b - first_block] is the absmax of block b.
void nf4_dequantize_scaled(const uint8_t* packed, int64_t blocksize, int64_t e0, int64_t count,
                           const float* absmax, int64_t first_block, float* out);

// Plain float absmax per block (absmax[b] for block b).
inline void nf4_dequantize(const uint8_t* packed, const float* absmax, int64_t blocksize,
                           int64_t e0, int64_t count, float* out) {
  nf4_dequantize_scaled(packed, blocksize, e0, count, absmax, 0, out);
}

// Same for double-quantized statistics (absmax decoded per block, in chunks).
void nf4_dequantize_double_quant(const uint8_t* packed, int64_t blocksize, const uint8_t* codes,
                                 const float* nested_absmax, const float* nested_code, float offset,
                                 int64_t nested_blocksize, int64_t e0, int64_t count, float* out);

}  // namespace qlft
