#include "quant/ggml_types.h"

namespace qlft {

const GgmlTypeTraits* ggml_type_traits(uint32_t type) {
  static const GgmlTypeTraits f32{"f32", 1, 4, true}, f16{"f16", 1, 2, true},
      q4_0{"q4_0", 32, 18, true}, q4_1{"q4_1", 32, 20, true}, q5_0{"q5_0", 32, 22, false},
      q5_1{"q5_1", 32, 24, false}, q8_0{"q8_0", 32, 34, true}, q8_1{"q8_1", 32, 36, false},
      q2_k{"q2_k", 256, 84, false}, q3_k{"q3_k", 256, 110, false}, q4_k{"q4_k", 256, 144, true},
      q5_k{"q5_k", 256, 176, true}, q6_k{"q6_k", 256, 210, true}, q8_k{"q8_k", 256, 292, false},
      i8{"i8", 1, 1, false}, i16{"i16", 1, 2, false}, i32{"i32", 1, 4, false},
      i64{"i64", 1, 8, false}, f64{"f64", 1, 8, true}, bf16{"bf16", 1, 2, true};
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      return &f32;
    case GgmlType::F16:
      return &f16;
    case GgmlType::Q4_0:
      return &q4_0;
    case GgmlType::Q4_1:
      return &q4_1;
    case GgmlType::Q5_0:
      return &q5_0;
    case GgmlType::Q5_1:
      return &q5_1;
    case GgmlType::Q8_0:
      return &q8_0;
    case GgmlType::Q8_1:
      return &q8_1;
    case GgmlType::Q2_K:
      return &q2_k;
    case GgmlType::Q3_K:
      return &q3_k;
    case GgmlType::Q4_K:
      return &q4_k;
    case GgmlType::Q5_K:
      return &q5_k;
    case GgmlType::Q6_K:
      return &q6_k;
    case GgmlType::Q8_K:
      return &q8_k;
    case GgmlType::I8:
      return &i8;
    case GgmlType::I16:
      return &i16;
    case GgmlType::I32:
      return &i32;
    case GgmlType::I64:
      return &i64;
    case GgmlType::F64:
      return &f64;
    case GgmlType::BF16:
      return &bf16;
  }
  return nullptr;
}

}  // namespace qlft
