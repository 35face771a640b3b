// GGML tensor type ids as stored in GGUF, with their block geometry.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qlft {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

struct GgmlTypeTraits {
  const char* name;    // "q4_0"
  uint32_t block;      // elements per block (1 for plain types)
  uint32_t bytes;      // bytes per block
  bool dequantizable;  // qlft can turn it into f32
};

// nullptr for ids qlft does not know.
const GgmlTypeTraits* ggml_type_traits(uint32_t type);

}  // namespace qlft
