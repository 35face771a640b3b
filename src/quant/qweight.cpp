#include "quant/qweight.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/enum_names.h"
#include "core/error.h"
#include "quant/ggml_dequant.h"
#include "quant/ggml_types.h"
#include "quant/int8.h"
#include "quant/nf4.h"
#include "quant/nf4_math.h"

namespace qlft {

const char* quant_kind_name(QuantKind k) {
  static const char* const names[] = {"f32", "f16", "bf16", "nf4", "int8", "ggml"};
  return enum_name(names, k);
}

uint64_t QWeight::bytes() const {
  return data.size() + absmax.size() + nested_absmax.size() + code.size() + nested_code.size() +
         scb.size();
}

uint64_t stored_row_bytes(const QWeight& w) {
  const uint64_t c = static_cast<uint64_t>(w.cols);
  switch (w.kind) {
    case QuantKind::F32:
      return c * 4;
    case QuantKind::F16:
    case QuantKind::BF16:
      return c * 2;
    case QuantKind::GGML: {
      const GgmlTypeTraits* t = ggml_type_traits(w.ggml_type);
      return t && t->block && c % t->block == 0 ? c / t->block * t->bytes : 0;
    }
    default:
      return 0;
  }
}

std::string QWeight::type_name() const {
  if (kind == QuantKind::GGML) {
    const GgmlTypeTraits* t = ggml_type_traits(ggml_type);
    return t ? t->name : "ggml?";
  }
  return quant_kind_name(kind);
}

float QWeight::nf4_block_absmax(int64_t b) const {
  QLFT_CHECK_ARG(kind == QuantKind::NF4 && b >= 0 && b < nf4_num_blocks(numel(), blocksize),
                 "nf4_block_absmax: block %lld of a %s weight", static_cast<long long>(b),
                 type_name().c_str());
  if (!double_quant) return absmax.as<float>()[b];
  return nested_absmax_decode(nested_code.as<float>(), absmax.as<uint8_t>()[b],
                              nested_absmax.as<float>()[b / nested_blocksize], nested_offset);
}

void QWeight::dequantize_rows(int64_t r0, int64_t n, float* out) const {
  QLFT_CHECK_ARG(r0 >= 0 && n >= 0 && r0 + n <= rows,
                 "dequantize_rows: rows [%lld, %lld) outside a %lld-row %s weight",
                 static_cast<long long>(r0), static_cast<long long>(r0 + n),
                 static_cast<long long>(rows), type_name().c_str());
  const int64_t off = r0 * cols, cnt = n * cols;
  if (cnt == 0) return;
  switch (kind) {
    case QuantKind::F32:
      std::memcpy(out, data.as<float>() + off, cnt * 4);
      return;
    case QuantKind::F16:
      f16_to_f32_n(data.as<uint16_t>() + off, out, cnt);
      return;
    case QuantKind::BF16:
      bf16_to_f32_n(data.as<uint16_t>() + off, out, cnt);
      return;
    case QuantKind::NF4: {
      const uint8_t* packed = data.as<uint8_t>();
      if (!double_quant) {
        nf4_dequantize(packed, absmax.as<float>(), blocksize, off, cnt, out);
      } else {
        nf4_dequantize_double_quant(packed, blocksize, absmax.as<uint8_t>(),
                                    nested_absmax.as<float>(), nested_code.as<float>(),
                                    nested_offset, nested_blocksize, off, cnt, out);
      }
      return;
    }
    case QuantKind::INT8:
      int8_dequantize_rows(data.as<int8_t>(), scb.as<float>(), r0, n, cols, out);
      return;
    case QuantKind::GGML: {
      const GgmlTypeTraits* t = ggml_type_traits(ggml_type);
      // qweight_from_ggml guarantees rows start on block boundaries (cols % block == 0).
      const uint8_t* p = data.as<uint8_t>() + off / t->block * t->bytes;
      ggml_dequantize(ggml_type, p, cnt, out);
      return;
    }
  }
  throw_error(QLFT_ERR_INTERNAL, "dequantize_rows: unknown weight kind %d", static_cast<int>(kind));
}

void QWeight::dequantize_rows_bf16(int64_t r0, int64_t n, uint16_t* out) const {
  QLFT_CHECK_ARG(r0 >= 0 && n >= 0 && r0 + n <= rows,
                 "dequantize_rows_bf16: rows [%lld, %lld) outside a %lld-row %s weight",
                 static_cast<long long>(r0), static_cast<long long>(r0 + n),
                 static_cast<long long>(rows), type_name().c_str());
  if (n == 0 || cols == 0) return;
  if (kind == QuantKind::BF16) {
    std::memcpy(out, data.as<uint16_t>() + r0 * cols, static_cast<size_t>(n * cols) * 2);
    return;
  }
  if (kind == QuantKind::F32) {
    f32_to_bf16_n(data.as<float>() + r0 * cols, out, static_cast<size_t>(n * cols));
    return;
  }
  // Every other kind: a few rows at a time through an fp32 tile that stays in L1/L2, so the
  // round trip costs little next to the dequantization itself (one code path per kind, exact
  // by construction).
  constexpr int64_t kTile = 4096;
  float stack_tile[kTile];
  Buffer heap_tile;
  float* tile = stack_tile;
  int64_t per = kTile / cols;
  if (per == 0) {  // rows longer than the stack tile
    heap_tile = Buffer(static_cast<MemoryTracker*>(nullptr), MemCategory::Workspace,
                       static_cast<size_t>(cols) * 4, "bf16 dequant row");
    tile = heap_tile.as<float>();
    per = 1;
  }
  for (int64_t i = 0; i < n; i += per) {
    const int64_t m = std::min(per, n - i);
    dequantize_rows(r0 + i, m, tile);
    f32_to_bf16_n(tile, out + i * cols, static_cast<size_t>(m * cols));
  }
}

namespace {

void fill_nf4_code(MemoryTracker* tracker, QWeight& w) {
  w.code = Buffer(tracker, MemCategory::Weights, 16 * sizeof(float), "nf4 code book");
  for (uint32_t k = 0; k < 16; ++k) w.code.as<float>()[k] = nf4_value(k);
}

}  // namespace

QWeight qweight_from_f32(MemoryTracker* tracker, const float* src, int64_t rows, int64_t cols,
                         QuantKind kind, int32_t blocksize, bool double_quant) {
  QLFT_CHECK_ARG(rows >= 0 && cols >= 0, "qweight_from_f32: negative shape [%lld, %lld]",
                 static_cast<long long>(rows), static_cast<long long>(cols));
  QWeight w;
  w.rows = rows;
  w.cols = cols;
  w.kind = kind;
  const int64_t n = rows * cols;
  switch (kind) {
    case QuantKind::F32:
      w.data = Buffer(tracker, MemCategory::Weights, n * 4, "f32 weight");
      std::memcpy(w.data.data(), src, n * 4);
      return w;
    case QuantKind::F16:
      w.data = Buffer(tracker, MemCategory::Weights, n * 2, "f16 weight");
      f32_to_f16_n(src, w.data.as<uint16_t>(), n);
      return w;
    case QuantKind::BF16:
      w.data = Buffer(tracker, MemCategory::Weights, n * 2, "bf16 weight");
      f32_to_bf16_n(src, w.data.as<uint16_t>(), n);
      return w;
    case QuantKind::NF4: {
      nf4_check_blocksize(blocksize, "qweight_from_f32");
      QLFT_CHECK_ARG(n > 0, "qweight_from_f32: NF4 of an empty matrix");
      w.blocksize = blocksize;
      w.double_quant = double_quant;
      const int64_t nb = nf4_num_blocks(n, blocksize);
      w.data = Buffer(tracker, MemCategory::Weights, nf4_packed_bytes(n), "nf4 codes");
      fill_nf4_code(tracker, w);
      if (!double_quant) {
        w.absmax = Buffer(tracker, MemCategory::Weights, nb * 4, "nf4 absmax");
        nf4_quantize(src, n, blocksize, w.data.as<uint8_t>(), w.absmax.as<float>());
        return w;
      }
      Buffer tmp(tracker, MemCategory::Workspace, nb * 4, "nf4 absmax staging");
      nf4_quantize(src, n, blocksize, w.data.as<uint8_t>(), tmp.as<float>());
      w.nested_blocksize = 256;
      const int64_t nnb = nf4_num_blocks(nb, w.nested_blocksize);
      w.absmax = Buffer(tracker, MemCategory::Weights, nb, "nf4 absmax codes");
      w.nested_absmax = Buffer(tracker, MemCategory::Weights, nnb * 4, "nf4 nested absmax");
      nf4_double_quantize(tmp.as<float>(), nb, w.nested_blocksize, w.absmax.as<uint8_t>(),
                          w.nested_absmax.as<float>(), &w.nested_offset);
      w.nested_code = Buffer(tracker, MemCategory::Weights, 256 * 4, "nf4 nested code");
      std::memcpy(w.nested_code.data(), nf4_nested_code().data(), 256 * 4);
      return w;
    }
    case QuantKind::INT8:
      w.data = Buffer(tracker, MemCategory::Weights, n, "int8 codes");
      w.scb = Buffer(tracker, MemCategory::Weights, rows * 4, "int8 SCB");
      int8_quantize_rows(src, rows, cols, w.data.as<int8_t>(), w.scb.as<float>());
      return w;
    case QuantKind::GGML:
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "qweight_from_f32: quantizing to GGUF block types is not supported");
  }
  throw_error(QLFT_ERR_INTERNAL, "qweight_from_f32: unknown kind %d", static_cast<int>(kind));
}

QWeight qweight_ggml_shape(uint32_t ggml_type, int64_t rows, int64_t cols, uint64_t* bytes) {
  const GgmlTypeTraits* t = ggml_type_traits(ggml_type);
  if (!t) throw_error(QLFT_ERR_FORMAT, "unknown ggml type %u", ggml_type);
  if (!t->dequantizable)
    throw_error(QLFT_ERR_UNSUPPORTED, "ggml type %s cannot be dequantized by qlft", t->name);
  QLFT_CHECK_FORMAT(
      rows >= 0 && cols >= 0 && cols % t->block == 0,
      "ggml %s weight [%lld, %lld]: row length is not a multiple of the block size %u", t->name,
      static_cast<long long>(rows), static_cast<long long>(cols), t->block);
  QWeight w;
  w.kind = QuantKind::GGML;
  w.ggml_type = ggml_type;
  w.rows = rows;
  w.cols = cols;
  *bytes = static_cast<uint64_t>(rows * cols) / t->block * t->bytes;
  return w;
}

QWeight qweight_from_ggml(MemoryTracker* tracker, uint32_t ggml_type, const void* blocks,
                          int64_t rows, int64_t cols) {
  uint64_t nb = 0;
  QWeight w = qweight_ggml_shape(ggml_type, rows, cols, &nb);
  w.data = Buffer(tracker, MemCategory::Weights, nb, "gguf weight");
  std::memcpy(w.data.data(), blocks, nb);
  return w;
}

}  // namespace qlft
