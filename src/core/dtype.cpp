#include "core/dtype.h"

#include <cstring>

#include "core/error.h"

namespace qlft {

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

// F16 or BF16 elements: the bulk path where src is 2-byte aligned, else one at a time.
template <void (*kBulk)(const uint16_t*, float*, size_t), float (*kOne)(uint16_t)>
void halves_n(const void* src, float* dst, size_t n) {
  if (reinterpret_cast<uintptr_t>(src) % 2 == 0)
    return kBulk(static_cast<const uint16_t*>(src), dst, n);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(src) + 2 * i, 2);
    dst[i] = kOne(h);
  }
}

void copy_f32(const void* src, float* dst, size_t n) {
  std::memcpy(dst, src, n * 4);
}

// Bytes of one element, the name and the conversion of n elements to f32, in DType's order.
struct DTypeRow {
  size_t size;
  const char* name;
  void (*to_f32)(const void* src, float* dst, size_t n);
};
constexpr DTypeRow kDTypes[] = {{4, "F32", copy_f32},
                                {2, "F16", halves_n<f16_to_f32_n, f16_to_f32>},
                                {2, "BF16", halves_n<bf16_to_f32_n, bf16_to_f32>},
                                {8, "F64", cast_n<double>},
                                {1, "I8", cast_n<int8_t>},
                                {1, "U8", cast_n<uint8_t>},
                                {2, "I16", cast_n<int16_t>},
                                {4, "I32", cast_n<int32_t>},
                                {8, "I64", cast_n<int64_t>},
                                {1, "BOOL", cast_n<uint8_t>}};
static_assert(sizeof kDTypes / sizeof kDTypes[0] == static_cast<size_t>(DType::BOOL) + 1,
              "a row per DType");
const DTypeRow* dtype_row(DType t) {
  const size_t i = static_cast<size_t>(t);
  return i < sizeof kDTypes / sizeof kDTypes[0] ? &kDTypes[i] : nullptr;
}
}  // namespace

size_t dtype_size(DType t) {
  const DTypeRow* r = dtype_row(t);
  return r ? r->size : 0;
}

const char* dtype_name(DType t) {
  const DTypeRow* r = dtype_row(t);
  return r ? r->name : "?";
}

void f32_to_16_n(DType t, const float* src, uint16_t* dst, size_t n) {
  if (t == DType::BF16)
    f32_to_bf16_n(src, dst, n);
  else
    f32_to_f16_n(src, dst, n);
}

const void* f32_as_stored(DType t, const float* src, size_t n, std::vector<uint16_t>* buf,
                          const std::string& what) {
  if (t == DType::F32) return src;
  QLFT_CHECK_ARG(t == DType::F16 || t == DType::BF16, "%s stores F32, F16 or BF16 only",
                 what.c_str());
  buf->resize(n);
  f32_to_16_n(t, src, buf->data(), n);
  return buf->data();
}

void to_f32_n(DType t, const void* src, float* dst, size_t n) {
  if (n == 0) return;  // src/dst may be null for empty tensors
  const DTypeRow* r = dtype_row(t);
  if (!r) throw_error(QLFT_ERR_INTERNAL, "to_f32_n: unknown dtype");
  r->to_f32(src, dst, n);
}

}  // namespace qlft
