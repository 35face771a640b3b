// GGUF v3 writer: metadata of every value type, tensor infos and tensor data (F32/F16/BF16
// converted from floats, or the raw bytes of any ggml block type), aligned to general.alignment
// (default 32). Written atomically through AtomicFile.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "formats/gguf.h"
#include "formats/tensor_writer.h"
#include "quant/ggml_types.h"

namespace qlft {

class GgufWriter : public TensorWriter<GgmlType> {
 public:
  // Tensors (TensorWriter: add_tensor, add_tensor_deferred, add_tensor_f32, write) in GGUF
  // order: ne[0] is the innermost (contiguous) dimension, 1..4 dims, of a ggml type (the raw
  // bytes of its blocks). Written, and deferred ones fetched, in the order added, each tensor's
  // data at a multiple of alignment().
  GgufWriter() : TensorWriter("GGUF writer") {}

  // Metadata scalars (add_f32 is a key, add_tensor_f32 a tensor). Keys must be unique and
  // non-empty (QLFT_ERR_INVALID_ARGUMENT otherwise).
  void add_u8(const std::string& key, uint8_t v) { add_scalar(key, GgufType::U8, &v); }
  void add_i8(const std::string& key, int8_t v) { add_scalar(key, GgufType::I8, &v); }
  void add_u16(const std::string& key, uint16_t v) { add_scalar(key, GgufType::U16, &v); }
  void add_i16(const std::string& key, int16_t v) { add_scalar(key, GgufType::I16, &v); }
  void add_u32(const std::string& key, uint32_t v);  // "general.alignment" also sets alignment
  void add_i32(const std::string& key, int32_t v) { add_scalar(key, GgufType::I32, &v); }
  void add_u64(const std::string& key, uint64_t v) { add_scalar(key, GgufType::U64, &v); }
  void add_i64(const std::string& key, int64_t v) { add_scalar(key, GgufType::I64, &v); }
  void add_f32(const std::string& key, float v) { add_scalar(key, GgufType::F32, &v); }
  void add_f64(const std::string& key, double v) { add_scalar(key, GgufType::F64, &v); }
  void add_bool(const std::string& key, bool v) {
    const uint8_t b = v ? 1 : 0;
    add_scalar(key, GgufType::BOOL, &b);
  }
  void add_string(const std::string& key, std::string_view v);
  // A numeric or bool array: `count` packed little-endian elements of `elem` at data.
  void add_array(const std::string& key, GgufType elem, const void* data, uint64_t count);
  void add_array(const std::string& key, const std::vector<float>& v) {
    add_array(key, GgufType::F32, v.data(), v.size());
  }
  void add_array(const std::string& key, const std::vector<int32_t>& v) {
    add_array(key, GgufType::I32, v.data(), v.size());
  }
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  // A value as GgufFile read it, re-encoded with its type (nested arrays, which the reader does
  // not keep, are skipped).
  void add_value(const std::string& key, const GgufValue& v);

  uint64_t alignment() const { return alignment_; }

 private:
  uint64_t tensor_bytes(const std::string& name, GgmlType type,
                        const std::vector<int64_t>& ne) const override;
  const char* type_name(GgmlType type) const override;
  DType float_dtype(GgmlType store) const override;
  void write_file(const std::string& path, const TensorFetch& fetch) const override;
  // Appends key + type + already encoded payload.
  std::string& begin_kv(const std::string& key, GgufType type);
  // A scalar record: key, type and the gguf_scalar_size(type) little-endian bytes at v.
  void add_scalar(const std::string& key, GgufType type, const void* v);

  std::vector<std::string> kv_;  // each an encoded key/value record
  std::unordered_set<std::string> keys_;
  uint64_t alignment_ = 32;
};

}  // namespace qlft
