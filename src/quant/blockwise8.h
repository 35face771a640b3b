// Blockwise dynamic 8-bit quantization, bitsandbytes-compatible: the signed/unsigned dynamic map
// (create_dynamic_map), quantize_blockwise (CPU path: 65536-entry lookup table) and
// dequantize_blockwise. Used for NF4 double quantization and by the 8-bit AdamW state.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

namespace qlft {

// bitsandbytes.functional.create_dynamic_map(signed, max_exponent_bits, total_bits), bit for bit
// (including torch's float32 linspace). 256 sorted values in [-1, 1] (signed) or [0, 1].
std::array<float, 256> create_dynamic_map(bool is_signed = true, int max_exponent_bits = 7,
                                          int total_bits = 8);

// Quantizes with a fixed 256-entry sorted code map. Building it costs one pass over 65536 table
// entries; keep one per map and reuse it (it is immutable and thread-safe after construction).
class Blockwise8Quantizer {
 public:
  explicit Blockwise8Quantizer(const float* code256);
  Blockwise8Quantizer(const std::array<float, 256>& code) : Blockwise8Quantizer(code.data()) {}

  // n values in blocks of `blocksize` (the last may be partial): absmax[b] = max |x| of block b,
  // codes[i] = nearest code of x[i] / absmax (an all-zero block gets absmax 0 and codes 0).
  void quantize(const float* x, int64_t n, int64_t blocksize, uint8_t* codes, float* absmax) const;
  // Quantizes one block (len values) and returns its absmax.
  float quantize_block(const float* x, int64_t len, uint8_t* codes) const;

  const float* code() const { return code_.data(); }

 private:
  std::array<float, 256> code_;
  std::unique_ptr<uint8_t[]> lut_;  // kBlockwise8LutSize entries
};

// out[i] = code[codes[i]] * absmax[i / blocksize].
void dequantize_blockwise8(const float* code, const uint8_t* codes, const float* absmax, int64_t n,
                           int64_t blocksize, float* out);

// torch.mean of a float32 vector as single-threaded torch 2.x on x86 computes it: the cascade sum
// of 8-lane vectors with 4 interleaved accumulators, then sum / n (matched against torch). The NF4
// double-quant offset is this mean; for n > 32768 multi-threaded torch splits the sum and may
// differ in the last bit.
float torch_mean_f32(const float* x, int64_t n);

}  // namespace qlft
