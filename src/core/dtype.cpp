#include "core/dtype.h"

#include <cstring>

#include "core/error.h"

namespace qlft {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::F64:
      return 8;
    case DType::I8:
      return 1;
    case DType::U8:
      return 1;
    case DType::I16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::BOOL:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::F64:
      return "F64";
    case DType::I8:
      return "I8";
    case DType::U8:
      return "U8";
    case DType::I16:
      return "I16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::BOOL:
      return "BOOL";
  }
  return "?";
}

namespace {
template <class T>
void cast_n(const void* src, float* dst, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));  // sources may be unaligned (mmap offsets)
    dst[i] = static_cast<float>(v);
  }
}
}  // namespace

void to_f32_n(DType t, const void* src, float* dst, size_t n) {
  if (n == 0) return;  // src/dst may be null for empty tensors
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      if (reinterpret_cast<uintptr_t>(s) % 2 == 0) return f16_to_f32_n(s, dst, n);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, reinterpret_cast<const char*>(src) + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    }
    case DType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      if (reinterpret_cast<uintptr_t>(s) % 2 == 0) return bf16_to_f32_n(s, dst, n);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, reinterpret_cast<const char*>(src) + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    case DType::F64:
      return cast_n<double>(src, dst, n);
    case DType::I8:
      return cast_n<int8_t>(src, dst, n);
    case DType::U8:
      return cast_n<uint8_t>(src, dst, n);
    case DType::BOOL:
      return cast_n<uint8_t>(src, dst, n);
    case DType::I16:
      return cast_n<int16_t>(src, dst, n);
    case DType::I32:
      return cast_n<int32_t>(src, dst, n);
    case DType::I64:
      return cast_n<int64_t>(src, dst, n);
  }
  throw_error(QLFT_ERR_INTERNAL, "to_f32_n: unknown dtype");
}

}  // namespace qlft
