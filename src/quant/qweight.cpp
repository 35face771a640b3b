// TEMPORARY minimal implementation (F32/F16/BF16/GGML via ggml_dequantize); the quant work
// replaces this file with NF4/INT8 support.
#include "quant/qweight.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/ggml_dequant.h"
#include "quant/ggml_types.h"

namespace qlft {

const char* quant_kind_name(QuantKind k) {
  switch (k) {
    case QuantKind::F32: return "f32";
    case QuantKind::F16: return "f16";
    case QuantKind::BF16: return "bf16";
    case QuantKind::NF4: return "nf4";
    case QuantKind::INT8: return "int8";
    case QuantKind::GGML: return "ggml";
  }
  return "?";
}

uint64_t QWeight::bytes() const {
  return data.size() + absmax.size() + nested_absmax.size() + code.size() + nested_code.size() +
         scb.size();
}

std::string QWeight::type_name() const {
  if (kind == QuantKind::GGML) {
    const GgmlTypeTraits* t = ggml_type_traits(ggml_type);
    return t ? t->name : "ggml?";
  }
  return quant_kind_name(kind);
}

void QWeight::dequantize_rows(int64_t r0, int64_t n, float* out) const {
  const int64_t off = r0 * cols, cnt = n * cols;
  switch (kind) {
    case QuantKind::F32: std::memcpy(out, data.as<float>() + off, cnt * 4); return;
    case QuantKind::F16: f16_to_f32_n(data.as<uint16_t>() + off, out, cnt); return;
    case QuantKind::BF16: bf16_to_f32_n(data.as<uint16_t>() + off, out, cnt); return;
    case QuantKind::GGML: {
      const GgmlTypeTraits* t = ggml_type_traits(ggml_type);
      const uint8_t* p = data.as<uint8_t>() + off / t->block * t->bytes;
      ggml_dequantize(ggml_type, p, cnt, out);
      return;
    }
    default: throw_error(QLFT_ERR_UNSUPPORTED, "dequantize_rows: %s not implemented yet", type_name().c_str());
  }
}

QWeight qweight_from_f32(MemoryTracker* tracker, const float* src, int64_t rows, int64_t cols,
                         QuantKind kind, int32_t, bool) {
  QWeight w;
  w.rows = rows;
  w.cols = cols;
  w.kind = kind;
  switch (kind) {
    case QuantKind::F32:
      w.data = Buffer(tracker, MemCategory::Weights, rows * cols * 4, "f32 weight");
      std::memcpy(w.data.data(), src, rows * cols * 4);
      return w;
    default: throw_error(QLFT_ERR_UNSUPPORTED, "quantization to %s not implemented yet", quant_kind_name(kind));
  }
}

QWeight qweight_from_ggml(MemoryTracker* tracker, uint32_t ggml_type, const void* blocks,
                          int64_t rows, int64_t cols) {
  const GgmlTypeTraits* t = ggml_type_traits(ggml_type);
  if (!t) throw_error(QLFT_ERR_FORMAT, "unknown ggml type %u", ggml_type);
  QWeight w;
  w.kind = QuantKind::GGML;
  w.ggml_type = ggml_type;
  w.rows = rows;
  w.cols = cols;
  uint64_t nb = static_cast<uint64_t>(rows * cols) / t->block * t->bytes;
  w.data = Buffer(tracker, MemCategory::Weights, nb, "gguf weight");
  std::memcpy(w.data.data(), blocks, nb);
  return w;
}

}  // namespace qlft
