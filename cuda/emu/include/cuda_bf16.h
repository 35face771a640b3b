// cuda_bf16.h for the CUDA emulator: the __nv_bfloat16 storage type (its 16 bits, as the
// toolkit's struct keeps them) and the two conversions kernels use, round to nearest even.
// Kernels in cuda/src convert with core/half.h's f32_to_bf16 / bf16_to_f32 and only name the
// type where an API (nvcuda::wmma, <mma.h>) takes it.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  unsigned short __x;
};

inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays NaN (quiet)
    h.__x = static_cast<unsigned short>((u >> 16) | 0x40);
    return h;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  h.__x = static_cast<unsigned short>(u >> 16);
  return h;
}

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = uint32_t(h.__x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
