// Per-block dequantization of GGUF block types (ggml layouts), QLFT_HD so a CUDA kernel can share
// it. Each writes the block's elements in order; arithmetic order matches ggml's reference
// dequantize_row_* and gguf-py: scale products first, one rounding per operation, no FMA.
// Host code gets that from -ffp-contract=off (src/quant/*.cpp); a TU built without it may fuse
// d * q - m into an FMA and differ from gguf-py in the last bit. Device code uses ggml_mul
// (__fmul_rn), which nvcc never fuses.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "core/hd.h"

namespace qlft {

// A product that must stay rounded on its own before a following add.
QLFT_HD inline float ggml_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

QLFT_HD inline float ggml_f16_at(const uint8_t* p) {
  return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

// Q4_0, 32 elements in 18 bytes: f16 d, 16 bytes of nibbles. Element j (j < 16) is the LOW nibble
// of byte j, element j + 16 its HIGH nibble (unlike NF4's high-first pairs). x = (q - 8) * d.
QLFT_HD inline void ggml_dequant_q4_0(const uint8_t* b, float* y) {
  const float d = ggml_f16_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(static_cast<int>(qs[j] & 15) - 8);
    y[j + 16] = d * static_cast<float>(static_cast<int>(qs[j] >> 4) - 8);
  }
}

// Q4_1, 32 elements in 20 bytes: f16 d, f16 m, nibbles as Q4_0. x = q * d + m.
QLFT_HD inline void ggml_dequant_q4_1(const uint8_t* b, float* y) {
  const float d = ggml_f16_at(b), m = ggml_f16_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = ggml_mul(d, static_cast<float>(qs[j] & 15)) + m;
    y[j + 16] = ggml_mul(d, static_cast<float>(qs[j] >> 4)) + m;
  }
}

// Q8_0, 32 elements in 34 bytes: f16 d, 32 int8. x = q * d.
QLFT_HD inline void ggml_dequant_q8_0(const uint8_t* b, float* y) {
  const float d = ggml_f16_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// 6-bit scale and min number j (0..7) of a Q4_K/Q5_K block (ggml get_scale_min_k4).
QLFT_HD inline void ggml_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K, 256 elements in 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of
// nibbles. Each 64 elements: 32 low nibbles (sub-block 2k) then 32 high nibbles (2k + 1);
// x = (d * sc) * q - (dmin * m).
// Q5_K, 256 elements in 176 bytes: the same with 32 bytes of high bits before the nibbles (bit s
// of qh[l] is the 5th bit of element l of sub-block s). kHigh picks Q5_K.
template <bool kHigh>
QLFT_HD inline void ggml_dequant_k45(const uint8_t* b, float* y) {
  const float d = ggml_f16_at(b), dmin = ggml_f16_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + (kHigh ? 48 : 16);
  for (int k = 0; k < 4; ++k) {
    const int s1 = 2 * k, s2 = 2 * k + 1;
    uint8_t sc, m;
    ggml_scale_min_k4(s1, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    ggml_scale_min_k4(s2, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) {
      const int h = kHigh ? ((qh[l] >> s1) & 1) << 4 : 0;
      y[l] = ggml_mul(d1, static_cast<float>((ql[l] & 0xF) | h)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int h = kHigh ? ((qh[l] >> s2) & 1) << 4 : 0;
      y[32 + l] = ggml_mul(d2, static_cast<float>((ql[l] >> 4) | h)) - m2;
    }
    ql += 32;
    y += 64;
  }
}
QLFT_HD inline void ggml_dequant_q4_k(const uint8_t* b, float* y) {
  ggml_dequant_k45<false>(b, y);
}
QLFT_HD inline void ggml_dequant_q5_k(const uint8_t* b, float* y) {
  ggml_dequant_k45<true>(b, y);
}

// Q6_K, 256 elements in 210 bytes: 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales,
// f16 d. Per 128 elements: x = (d * sc[is]) * (q - 32).
QLFT_HD inline void ggml_dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = ggml_f16_at(b + 208);
  for (int n = 0; n < 2; ++n) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = (d * static_cast<float>(sc[is + 0])) * static_cast<float>(q1);
      y[l + 32] = (d * static_cast<float>(sc[is + 2])) * static_cast<float>(q2);
      y[l + 64] = (d * static_cast<float>(sc[is + 4])) * static_cast<float>(q3);
      y[l + 96] = (d * static_cast<float>(sc[is + 6])) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace qlft
