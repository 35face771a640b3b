// TEMPORARY: F32 only; the quant work replaces this file.
#include "quant/ggml_dequant.h"

#include <cstring>

#include "core/error.h"
#include "quant/ggml_types.h"

namespace qlft {

void ggml_dequantize(uint32_t type, const void* src, int64_t n, float* dst) {
  if (type == static_cast<uint32_t>(GgmlType::F32)) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  throw_error(QLFT_ERR_UNSUPPORTED, "ggml type %u: dequantization not implemented yet", type);
}

}  // namespace qlft
