#include "formats/gguf_writer.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/atomic_file.h"

namespace qlft {

namespace {

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // GGUF is little-endian, as every host qlft supports
  out.append(b, sizeof(T));
}
void put_str(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s.data(), s.size());
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

std::string& GgufWriter::begin_kv(const std::string& key, GgufType type) {
  QLFT_CHECK_ARG(!key.empty(), "GGUF writer: metadata key is empty");
  QLFT_CHECK_ARG(keys_.insert(key).second, "GGUF writer: metadata key '%s' added twice",
                 key.c_str());
  kv_.emplace_back();
  std::string& r = kv_.back();
  put_str(r, key);
  put<uint32_t>(r, static_cast<uint32_t>(type));
  return r;
}

void GgufWriter::add_scalar(const std::string& k, GgufType type, const void* v) {
  // GGUF is little-endian, as every host qlft supports: the value's bytes as they are.
  begin_kv(k, type).append(static_cast<const char*>(v), gguf_scalar_size(type));
}
void GgufWriter::add_u32(const std::string& k, uint32_t v) {
  if (k == "general.alignment") {
    QLFT_CHECK_ARG(v > 0 && (v & (v - 1)) == 0 && v <= (1u << 20),
                   "GGUF writer: general.alignment must be a power of two, got %u", v);
    alignment_ = v;
  }
  add_scalar(k, GgufType::U32, &v);
}
void GgufWriter::add_string(const std::string& k, std::string_view v) {
  put_str(begin_kv(k, GgufType::STRING), v);
}

void GgufWriter::add_value(const std::string& k, const GgufValue& v) {
  switch (v.type) {
    case GgufType::STRING:
      return add_string(k, v.str);
    case GgufType::F32:
      return add_f32(k, static_cast<float>(v.f));
    case GgufType::F64:
      return add_f64(k, v.f);
    case GgufType::U32:  // general.alignment's check
      return add_u32(k, static_cast<uint32_t>(v.u));
    case GgufType::ARRAY:
      if (v.elem_type == GgufType::STRING)
        add_string_array(k, std::vector<std::string>(v.strings.begin(), v.strings.end()));
      else if (v.elem_type != GgufType::ARRAY && (v.array_data || v.count == 0))
        add_array(k, v.elem_type, v.count ? v.array_data : nullptr, v.count);
      return;
    default:  // the other integers and bool (0 or 1): u's low bytes, little-endian
      return add_scalar(k, v.type, &v.u);
  }
}

void GgufWriter::add_array(const std::string& key, GgufType elem, const void* data,
                           uint64_t count) {
  size_t es = gguf_scalar_size(elem);
  QLFT_CHECK_ARG(es > 0, "GGUF writer: '%s': add_array takes numeric or bool elements, not %s",
                 key.c_str(), gguf_type_name(elem));
  QLFT_CHECK_ARG(data || count == 0, "GGUF writer: '%s': array data is NULL", key.c_str());
  std::string& r = begin_kv(key, GgufType::ARRAY);
  put<uint32_t>(r, static_cast<uint32_t>(elem));
  put<uint64_t>(r, count);
  if (count) r.append(static_cast<const char*>(data), count * es);
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::string& r = begin_kv(key, GgufType::ARRAY);
  put<uint32_t>(r, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(r, v.size());
  for (const std::string& s : v) put_str(r, s);
}

uint64_t GgufWriter::tensor_bytes(const std::string& name, GgmlType type,
                                  const std::vector<int64_t>& ne) const {
  const GgmlTypeTraits* tr = ggml_type_traits(static_cast<uint32_t>(type));
  QLFT_CHECK_ARG(tr, "GGUF writer: tensor '%s' has unknown ggml type %u", name.c_str(),
                 static_cast<uint32_t>(type));
  QLFT_CHECK_ARG(!ne.empty() && ne.size() <= 4, "GGUF writer: tensor '%s' has %zu dimensions",
                 name.c_str(), ne.size());
  const uint64_t n = checked_elements("GGUF writer", name, ne, 1);
  QLFT_CHECK_ARG(ne[0] % tr->block == 0,
                 "GGUF writer: tensor '%s' row length %lld is not a multiple of the %s block %u",
                 name.c_str(), static_cast<long long>(ne[0]), tr->name, tr->block);
  return n / tr->block * tr->bytes;
}

const char* GgufWriter::type_name(GgmlType type) const {
  return ggml_type_traits(static_cast<uint32_t>(type))->name;  // known: tensor_bytes checked it
}

DType GgufWriter::float_dtype(GgmlType store) const {
  return store == GgmlType::F32    ? DType::F32
         : store == GgmlType::F16  ? DType::F16
         : store == GgmlType::BF16 ? DType::BF16
                                   : DType::BOOL;
}

void GgufWriter::write_file(const std::string& path, const TensorFetch& fetch) const {
  const std::vector<Tensor>& ts = tensors();
  std::string head;
  head.append("GGUF", 4);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, ts.size());
  put<uint64_t>(head, kv_.size());
  for (const std::string& r : kv_) head += r;
  uint64_t off = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : ts) {
    put_str(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, off);
    offsets.push_back(off);
    off = align_up(off + t.bytes.nbytes, alignment_);
  }
  AtomicFile f(path);
  f.write(head);
  f.pad_to(alignment_);
  const uint64_t data_start = f.size();
  for (size_t i = 0; i < ts.size(); ++i) {
    // Each tensor starts at its aligned offset; padding follows every tensor, as llama.cpp does.
    f.pad_to(alignment_);
    if (f.size() - data_start != offsets[i])
      throw_error(QLFT_ERR_INTERNAL, "%s: GGUF writer offset mismatch", path.c_str());
    const Tensor& t = ts[i];
    f.write(t.bytes.get(t.name, fetch), t.bytes.nbytes);
  }
  f.pad_to(alignment_);
  f.commit();
}

}  // namespace qlft
