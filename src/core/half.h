// Scalar f32 <-> bf16 / f16 conversions. QLFT_HD so the CUDA kernels share the exact bit rules.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace qlft {

QLFT_HD inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
QLFT_HD inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even with subnormals kept (as torch's c10::BFloat16 does), NaN made quiet
// keeping its sign and top payload bits (as VCVTNEPS2BF16 does). The native instruction flushes
// subnormal inputs to zero, so the bulk path fixes those lanes up (core/half_bulk.cpp).
QLFT_HD inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
QLFT_HD inline float bf16_to_f32(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}

// IEEE half, round to nearest even, overflow to inf, subnormals kept: bit for bit what the F16C
// instructions give (the bulk paths use them), NaN included.
QLFT_HD inline uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  // NaN keeps its sign and top payload bits and is made quiet, as F16C's VCVTPS2PH does.
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (ax < 0x38800000u) {  // below the smallest normal half: produce a subnormal
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to zero
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (127 - e) - 15 ... gives mantissa in half-subnormal units
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half_m & 1u))) half_m++;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15 and round
  return static_cast<uint16_t>(sign | (r >> 13));
}

QLFT_HD inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    // subnormal: value = m * 2^-24
    float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (e == 31) {  // inf, or NaN made quiet with its payload kept (as VCVTPH2PS does)
    return bits_f32(sign | 0x7f800000u | (m != 0 ? 0x400000u : 0u) | (m << 13));
  }
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace qlft
