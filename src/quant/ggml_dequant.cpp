#include "quant/ggml_dequant.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/ggml_types.h"
#include "quant/quant_kernels.h"

namespace qlft {

void ggml_dequantize(uint32_t type, const void* src, int64_t n, float* dst) {
  const GgmlTypeTraits* t = ggml_type_traits(type);
  if (!t || !t->dequantizable)
    throw_error(QLFT_ERR_UNSUPPORTED, "ggml type %s (%u): dequantization is not supported",
                t ? t->name : "unknown", type);
  QLFT_CHECK_ARG(n >= 0 && n % t->block == 0,
                 "ggml_dequantize: %lld elements is not a multiple of the %s block size %u",
                 static_cast<long long>(n), t->name, t->block);
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      f16_to_f32_n(static_cast<const uint16_t*>(src), dst, n);
      return;
    case GgmlType::BF16:
      bf16_to_f32_n(static_cast<const uint16_t*>(src), dst, n);
      return;
    case GgmlType::F64: {
      const uint8_t* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + i * 8, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
    default:
      // the block types: their kernels for this CPU (quant_kernels.h)
      if (quant_kernels().ggml_dequantize_blocks(type, src, n, dst)) return;
      break;
  }
  throw_error(QLFT_ERR_INTERNAL, "ggml type %s marked dequantizable but has no decoder", t->name);
}

}  // namespace qlft
