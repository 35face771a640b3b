// Per-element arithmetic of the bitsandbytes-compatible formats (NF4, blockwise dynamic 8-bit,
// LLM.int8 row-wise), shared by the CPU code and future CUDA kernels (QLFT_HD).
//
// Every operation is written in the order bitsandbytes 0.50.2 (CPU) evaluates it, one IEEE
// rounding per step, so that codes and dequantized values match bit for bit. A compiler must not
// fuse a product and a sum into one FMA here: src/quant/*.cpp build with -ffp-contract=off, and
// the one two-step formula (nested_absmax_decode) rounds its product explicitly (round_product),
// so it is exact wherever it is inlined, CUDA included.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace qlft {

// ---- NF4 ------------------------------------------------------------------------------------

// bitsandbytes get_4bit_type("nf4"): the 16 NF4 values as float32, sorted; index = nibble.
// Scalars rather than an array so device code can use them as compile-time constants.
namespace nf4_detail {
constexpr float kNf4C0 = -1.0f;
constexpr float kNf4C1 = -0.6961928009986877f;
constexpr float kNf4C2 = -0.5250730514526367f;
constexpr float kNf4C3 = -0.39491748809814453f;
constexpr float kNf4C4 = -0.28444138169288635f;
constexpr float kNf4C5 = -0.18477343022823334f;
constexpr float kNf4C6 = -0.09105003625154495f;
constexpr float kNf4C7 = 0.0f;
constexpr float kNf4C8 = 0.07958029955625534f;
constexpr float kNf4C9 = 0.16093020141124725f;
constexpr float kNf4C10 = 0.24611230194568634f;
constexpr float kNf4C11 = 0.33791524171829224f;
constexpr float kNf4C12 = 0.44070982933044434f;
constexpr float kNf4C13 = 0.5626170039176941f;
constexpr float kNf4C14 = 0.7229568362236023f;
constexpr float kNf4C15 = 1.0f;
}  // namespace nf4_detail

QLFT_HD inline float nf4_value(uint32_t nibble) {
  using namespace nf4_detail;
  constexpr float kCode[16] = {kNf4C0,  kNf4C1,  kNf4C2,  kNf4C3, kNf4C4,  kNf4C5,
                               kNf4C6,  kNf4C7,  kNf4C8,  kNf4C9, kNf4C10, kNf4C11,
                               kNf4C12, kNf4C13, kNf4C14, kNf4C15};
  return kCode[nibble & 15u];
}

// NF4 code of a value already scaled into [-1, 1]: torch.bucketize(x, midpoints, right=False)
// with midpoints (code[i] + code[i+1]) / 2 in float32 (bitsandbytes' _get_4bit_quantize_bounds),
// i.e. the number of midpoints strictly below x: a value exactly on a midpoint takes the lower
// code. Branch-free with constant midpoints so loops over it vectorize.
QLFT_HD inline uint8_t nf4_encode(float s) {
  using namespace nf4_detail;
  return static_cast<uint8_t>((s > (kNf4C0 + kNf4C1) / 2.0f) + (s > (kNf4C1 + kNf4C2) / 2.0f) +
                              (s > (kNf4C2 + kNf4C3) / 2.0f) + (s > (kNf4C3 + kNf4C4) / 2.0f) +
                              (s > (kNf4C4 + kNf4C5) / 2.0f) + (s > (kNf4C5 + kNf4C6) / 2.0f) +
                              (s > (kNf4C6 + kNf4C7) / 2.0f) + (s > (kNf4C7 + kNf4C8) / 2.0f) +
                              (s > (kNf4C8 + kNf4C9) / 2.0f) + (s > (kNf4C9 + kNf4C10) / 2.0f) +
                              (s > (kNf4C10 + kNf4C11) / 2.0f) + (s > (kNf4C11 + kNf4C12) / 2.0f) +
                              (s > (kNf4C12 + kNf4C13) / 2.0f) + (s > (kNf4C13 + kNf4C14) / 2.0f) +
                              (s > (kNf4C14 + kNf4C15) / 2.0f));
}

// Scale of a block of NF4 values. bitsandbytes multiplies a full block by 1/absmax (torch
// computes 1.0 / t as reciprocal(t) * 1.0), with absmax clamped to 1e-38 so an all-zero block
// scales to 0; the last, partial block is divided by its clamped absmax instead.
QLFT_HD inline float nf4_clamp_absmax(float absmax) {
  const float kMin = static_cast<float>(1e-38);
  return absmax < kMin ? kMin : absmax;
}
QLFT_HD inline float clamp_unit(float v) {
  return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v);
}

// Dequantized NF4 element: code value times the block's absmax (one float multiply).
QLFT_HD inline float nf4_decode(uint32_t nibble, float absmax) {
  return nf4_value(nibble) * absmax;
}

// Packed NF4 byte i holds element 2i in the high nibble and element 2i+1 in the low nibble.
QLFT_HD inline uint32_t nf4_nibble(const uint8_t* packed, int64_t element) {
  const uint8_t b = packed[element >> 1];
  return (element & 1) ? (b & 15u) : (b >> 4);
}

// ---- blockwise dynamic 8-bit (bitsandbytes quantize_blockwise) ------------------------------

// Dequantized 8-bit element: code[q] * absmax of its block.
QLFT_HD inline float blockwise8_decode(const float* code, uint8_t q, float absmax) {
  return code[q] * absmax;
}

// a * b rounded to float on its own, never fused with a following add (GCC contracts a*b+c
// across statements in C++ by default; CUDA's nvcc does too).
QLFT_HD inline float round_product(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float r = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(r));  // an opaque step between the multiply and any later add
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(r));
#else
  volatile float v = r;
  r = v;
#endif
  return r;
#endif
}

// Double-quantized NF4 absmax: the 8-bit code decoded with its nested absmax, plus the mean that
// was subtracted before quantizing (two roundings: bitsandbytes adds the offset as its own op).
QLFT_HD inline float nested_absmax_decode(const float* nested_code, uint8_t q, float nested_absmax,
                                          float offset) {
  return round_product(nested_code[q], nested_absmax) + offset;
}

// bitsandbytes' CPU 8-bit quantizer looks codes up in a 65536-entry table indexed by the scaled
// value: index = trunc(fma((clamp(v) + 1) * 0.5, 65535, 0.5)) (the compiled kernel fuses the
// last multiply-add).
constexpr int kBlockwise8LutSize = 65536;
QLFT_HD inline uint32_t blockwise8_lut_index(float scaled) {
  const float h = (clamp_unit(scaled) + 1.0f) * 0.5f;
  return static_cast<uint32_t>(static_cast<int32_t>(fmaf(h, 65535.0f, 0.5f))) & 0xffffu;
}

// ---- LLM.int8 row-wise absmax ---------------------------------------------------------------

// Row scale for quantizing: 127.0 / SCB as torch evaluates it (reciprocal(SCB) * 127).
QLFT_HD inline float int8_row_scale(float scb) {
  return (1.0f / scb) * 127.0f;
}

// int8 code: round half to even of x * scale, as torch.round then .to(int8). |x * scale| <= 127
// up to rounding, so the clamp only guards the impossible; an all-zero row (0 * inf = NaN) gives
// 0, as torch's NaN-to-int8 conversion does on x86.
QLFT_HD inline int8_t int8_encode(float x, float scale) {
  const float v = rintf(x * scale);
  if (!(v == v)) return 0;
  return static_cast<int8_t>(v > 127.0f ? 127 : (v < -128.0f ? -128 : static_cast<int32_t>(v)));
}

// Dequantized int8 element: q * SCB * (1/127) (bitsandbytes int8_vectorwise_dequant).
QLFT_HD inline float int8_decode(int8_t q, float scb) {
  const float v = static_cast<float>(q) * scb;
  return v * static_cast<float>(7.874015718698502e-3);
}

}  // namespace qlft
