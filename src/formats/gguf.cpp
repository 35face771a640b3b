#include "formats/gguf.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <type_traits>

#include "core/enum_names.h"
#include "core/error.h"
#include "quant/ggml_types.h"

namespace qlft {

namespace {

constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kMaxStringLen = uint64_t(1) << 30;

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::F64);
}

// A bounds-checked cursor over the mapped bytes.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }
  const std::string& path() const { return path_; }

  const uint8_t* take(uint64_t bytes, const char* what) {
    if (bytes > remaining())
      throw_error(QLFT_ERR_FORMAT,
                  "%s: truncated at byte %zu reading %s (%llu bytes needed, %zu left)",
                  path_.c_str(), pos_, what, static_cast<unsigned long long>(bytes), remaining());
    const uint8_t* r = p_ + pos_;
    pos_ += bytes;
    return r;
  }
  template <class T>
  T read(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  std::string_view str(const char* what) {
    uint64_t len = read<uint64_t>(what);
    if (len > kMaxStringLen || len > remaining())
      throw_error(QLFT_ERR_FORMAT, "%s: %s has length %llu at byte %zu, past the end of the file",
                  path_.c_str(), what, static_cast<unsigned long long>(len), pos_);
    const uint8_t* d = take(len, what);
    return std::string_view(reinterpret_cast<const char*>(d), len);
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& path_;
};

// A scalar's little-endian bytes widened into v: integers into i and u (each the other's bit
// pattern), floats into f.
template <class T>
void widen(const uint8_t* p, GgufValue& v) {
  T x;
  std::memcpy(&x, p, sizeof x);
  if constexpr (std::is_floating_point_v<T>) {
    v.f = x;
  } else if constexpr (std::is_signed_v<T>) {
    v.i = x;
    v.u = static_cast<uint64_t>(v.i);
  } else {
    v.u = x;
    v.i = static_cast<int64_t>(v.u);
  }
}

// GGUF's value types in GgufType order: the bytes of one, whether it is an integer, and how its
// bytes widen (string and array: not scalars). The one place the type ids' layouts are known.
struct ScalarKind {
  uint8_t bytes = 0;
  bool integer = false;
  void (*widen)(const uint8_t*, GgufValue&) = nullptr;
};
constexpr ScalarKind kScalarKinds[] = {
    {1, true, widen<uint8_t>},   // U8
    {1, true, widen<int8_t>},    // I8
    {2, true, widen<uint16_t>},  // U16
    {2, true, widen<int16_t>},   // I16
    {4, true, widen<uint32_t>},  // U32
    {4, true, widen<int32_t>},   // I32
    {4, false, widen<float>},    // F32
    {1, false, widen<uint8_t>},  // BOOL
    {},                          // STRING
    {},                          // ARRAY
    {8, true, widen<uint64_t>},  // U64
    {8, true, widen<int64_t>},   // I64
    {8, false, widen<double>},   // F64
};
static_assert(std::size(kScalarKinds) == static_cast<size_t>(GgufType::F64) + 1);

const ScalarKind& scalar_kind(GgufType t) {
  static constexpr ScalarKind kNone{};
  const auto i = static_cast<size_t>(t);
  return i < std::size(kScalarKinds) ? kScalarKinds[i] : kNone;
}

void read_scalar(Cursor& c, GgufType t, GgufValue& v, const char* what) {
  const ScalarKind& k = scalar_kind(t);
  if (!k.widen) return;
  k.widen(c.take(k.bytes, what), v);
  if (t == GgufType::BOOL) v.i = static_cast<int64_t>(v.u = v.u ? 1 : 0);
}

// Validates and skips the body (element type, count, elements) of a nested array.
void skip_array(Cursor& c, const std::string& key, int depth) {
  QLFT_CHECK_FORMAT(depth <= 8, "%s: metadata key '%s' nests arrays more than 8 deep",
                    c.path().c_str(), key.c_str());
  uint32_t et = c.read<uint32_t>("array element type");
  QLFT_CHECK_FORMAT(valid_type(et), "%s: metadata key '%s' is an array of unknown type %u",
                    c.path().c_str(), key.c_str(), et);
  uint64_t n = c.read<uint64_t>("array length");
  GgufType t = static_cast<GgufType>(et);
  if (t == GgufType::ARRAY) {
    QLFT_CHECK_FORMAT(n <= c.remaining() / 12, "%s: metadata key '%s': nested array too long",
                      c.path().c_str(), key.c_str());
    for (uint64_t j = 0; j < n; ++j) skip_array(c, key, depth + 1);
  } else if (t == GgufType::STRING) {
    QLFT_CHECK_FORMAT(n <= c.remaining() / 8, "%s: metadata key '%s': nested array too long",
                      c.path().c_str(), key.c_str());
    for (uint64_t j = 0; j < n; ++j) c.str(key.c_str());
  } else {
    size_t es = gguf_scalar_size(t);
    QLFT_CHECK_FORMAT(n <= c.remaining() / es, "%s: metadata key '%s': nested array too long",
                      c.path().c_str(), key.c_str());
    c.take(n * es, key.c_str());
  }
}

}  // namespace

size_t gguf_scalar_size(GgufType t) {
  return scalar_kind(t).bytes;
}

const char* gguf_type_name(GgufType t) {
  static const char* const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  return enum_name(names, t);
}

bool GgufValue::is_integer() const {
  return scalar_kind(type).integer;
}
bool GgufValue::is_number() const {
  return is_integer() || type == GgufType::F32 || type == GgufType::F64;
}

double GgufValue::array_f(uint64_t idx) const {
  if (elem_type != GgufType::F32 && elem_type != GgufType::F64)
    return static_cast<double>(array_i(idx));
  check_index(idx);
  GgufValue e;
  scalar_kind(elem_type).widen(array_data + idx * gguf_scalar_size(elem_type), e);
  return e.f;
}

void GgufValue::check_index(uint64_t idx) const {
  if (type != GgufType::ARRAY || !array_data || idx >= count)
    throw_error(QLFT_ERR_INTERNAL,
                "GGUF value: element %llu of a %s (%llu elements) is not a number",
                static_cast<unsigned long long>(idx), gguf_type_name(type),
                static_cast<unsigned long long>(count));
}

namespace {
// A float array element read as an integer: NaN, inf or out of int64 range is a format error,
// not undefined behaviour (found by tests/fuzz/fuzz_gguf).
int64_t float_to_i64(double d, uint64_t idx) {
  if (!(d >= -9.2e18 && d <= 9.2e18))
    throw_error(QLFT_ERR_FORMAT, "GGUF array element %llu (%g) is not representable as an integer",
                static_cast<unsigned long long>(idx), d);
  return static_cast<int64_t>(d);
}
}  // namespace

int64_t GgufValue::array_i(uint64_t idx) const {
  check_index(idx);
  const ScalarKind& k = scalar_kind(elem_type);
  if (!k.widen) return 0;
  GgufValue e;
  k.widen(array_data + idx * k.bytes, e);
  return k.integer || elem_type == GgufType::BOOL ? e.i : float_to_i64(e.f, idx);
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  return std::unique_ptr<GgufFile>(new GgufFile(path));
}

GgufFile::GgufFile(const std::string& file) : MappedReader(file) {
  const std::string& path = file_->path();
  Cursor c(file_->data(), file_->size(), path);
  const uint8_t* magic = c.take(4, "magic");
  QLFT_CHECK_FORMAT(std::memcmp(magic, "GGUF", 4) == 0, "%s: not a GGUF file (bad magic)",
                    path.c_str());
  version_ = c.read<uint32_t>("version");
  QLFT_CHECK_FORMAT(version_ == 2 || version_ == 3,
                    "%s: GGUF version %u is not supported (2 and 3 are)", path.c_str(), version_);
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
  // least 8 + 4 + 4 + 8. A count that cannot fit in the file is rejected before any reserve.
  QLFT_CHECK_FORMAT(n_kv <= c.remaining() / 13, "%s: metadata count %llu cannot fit in %zu bytes",
                    path.c_str(), static_cast<unsigned long long>(n_kv), file_->size());
  QLFT_CHECK_FORMAT(n_tensors <= c.remaining() / 24,
                    "%s: tensor count %llu cannot fit in %zu bytes", path.c_str(),
                    static_cast<unsigned long long>(n_tensors), file_->size());

  // Counts are untrusted: reserve at most a modest amount up front; the vectors grow as entries
  // actually parse.
  constexpr uint64_t kMaxReserve = 1 << 14;
  kv_.reserve(std::min(n_kv, kMaxReserve));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key(c.str("metadata key"));
    QLFT_CHECK_FORMAT(!key.empty(), "%s: metadata entry %llu has an empty key", path.c_str(),
                      static_cast<unsigned long long>(k));
    QLFT_CHECK_FORMAT(!kv_index_.count(key), "%s: metadata key '%s' appears twice", path.c_str(),
                      key.c_str());
    uint32_t t = c.read<uint32_t>("metadata type");
    QLFT_CHECK_FORMAT(valid_type(t), "%s: metadata key '%s' has unknown type %u", path.c_str(),
                      key.c_str(), t);
    GgufValue v;
    v.type = static_cast<GgufType>(t);
    if (v.type == GgufType::STRING) {
      v.str = c.str(key.c_str());
    } else if (v.type == GgufType::ARRAY) {
      uint32_t et = c.read<uint32_t>("array element type");
      QLFT_CHECK_FORMAT(valid_type(et), "%s: metadata key '%s' is an array of unknown type %u",
                        path.c_str(), key.c_str(), et);
      v.elem_type = static_cast<GgufType>(et);
      v.count = c.read<uint64_t>("array length");
      if (v.elem_type == GgufType::ARRAY) {
        // Arrays of arrays are legal GGUF but no key qlft reads uses them: validate and skip.
        QLFT_CHECK_FORMAT(v.count <= c.remaining() / 12,
                          "%s: metadata key '%s' claims %llu nested arrays, more than the file "
                          "holds",
                          path.c_str(), key.c_str(), static_cast<unsigned long long>(v.count));
        for (uint64_t j = 0; j < v.count; ++j) skip_array(c, key, 1);
      } else if (v.elem_type == GgufType::STRING) {
        QLFT_CHECK_FORMAT(v.count <= c.remaining() / 8,
                          "%s: metadata key '%s' claims %llu strings, more than the file holds",
                          path.c_str(), key.c_str(), static_cast<unsigned long long>(v.count));
        v.strings.offsets_.reserve(std::min(v.count, kMaxReserve));
        const char* base = nullptr;
        for (uint64_t j = 0; j < v.count; ++j) {
          const char* at = c.str(key.c_str()).data() - sizeof(uint64_t);
          if (j == 0) base = at;
          QLFT_CHECK_FORMAT(at - base <= static_cast<std::ptrdiff_t>(UINT32_MAX),
                            "%s: metadata key '%s' is a string array of more than 4 GiB",
                            path.c_str(), key.c_str());
          v.strings.offsets_.push_back(static_cast<uint32_t>(at - base));
        }
        v.strings.base_ = base;
      } else {
        size_t es = gguf_scalar_size(v.elem_type);
        QLFT_CHECK_FORMAT(v.count <= c.remaining() / es,
                          "%s: metadata key '%s' claims %llu elements, more than the file holds",
                          path.c_str(), key.c_str(), static_cast<unsigned long long>(v.count));
        v.array_data = c.take(v.count * es, key.c_str());
      }
    } else {
      read_scalar(c, v.type, v, key.c_str());
    }
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    QLFT_CHECK_FORMAT(a->is_integer() && a->u > 0 && a->u <= (1u << 20) && (a->u & (a->u - 1)) == 0,
                      "%s: general.alignment must be a power of two, got %llu", path.c_str(),
                      static_cast<unsigned long long>(a->u));
    alignment_ = a->u;
  }

  tensors_.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t ti = 0; ti < n_tensors; ++ti) {
    GgufTensorInfo info;
    info.name = std::string(c.str("tensor name"));
    const char* tn = info.name.c_str();
    QLFT_CHECK_FORMAT(!tensor_index_.count(info.name), "%s: tensor '%s' appears twice",
                      path.c_str(), tn);
    info.n_dims = c.read<uint32_t>("tensor dims");
    QLFT_CHECK_FORMAT(info.n_dims <= kMaxDims, "%s: tensor '%s' has %u dimensions (at most 4)",
                      path.c_str(), tn, info.n_dims);
    // Overflow-safe element count: each factor <= 2^40 and the running product <= 2^50.
    uint64_t n = 1;
    for (uint32_t d = 0; d < info.n_dims; ++d) {
      uint64_t ne = c.read<uint64_t>("tensor shape");
      QLFT_CHECK_FORMAT(ne <= (uint64_t(1) << 40), "%s: tensor '%s' dimension %u is %llu",
                        path.c_str(), tn, d, static_cast<unsigned long long>(ne));
      info.ne[d] = static_cast<int64_t>(ne);
      QLFT_CHECK_FORMAT(ne == 0 || n <= (uint64_t(1) << 50) / ne,
                        "%s: tensor '%s' has too many elements", path.c_str(), tn);
      n *= ne;
    }
    info.type = c.read<uint32_t>("tensor type");
    const GgmlTypeTraits* tr = ggml_type_traits(info.type);
    QLFT_CHECK_FORMAT(tr, "%s: tensor '%s' has unknown ggml type %u", path.c_str(), tn, info.type);
    info.offset = c.read<uint64_t>("tensor offset");
    QLFT_CHECK_FORMAT(info.ne[0] % tr->block == 0,
                      "%s: tensor '%s' row length %lld is not a multiple of the %s block size %u",
                      path.c_str(), tn, static_cast<long long>(info.ne[0]), tr->name, tr->block);
    info.nbytes = n / tr->block * tr->bytes;
    tensor_index_[info.name] = tensors_.size();
    tensors_.push_back(std::move(info));
  }

  uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  QLFT_CHECK_FORMAT(data_start <= file_->size() || tensors_.empty(),
                    "%s: truncated before the tensor data section", path.c_str());
  uint64_t data_size = data_start <= file_->size() ? file_->size() - data_start : 0;
  data_start_ = data_start;
  for (GgufTensorInfo& t : tensors_) {
    QLFT_CHECK_FORMAT(t.offset % alignment_ == 0,
                      "%s: tensor '%s' offset %llu is not aligned to %llu", path.c_str(),
                      t.name.c_str(), static_cast<unsigned long long>(t.offset),
                      static_cast<unsigned long long>(alignment_));
    QLFT_CHECK_FORMAT(t.offset <= data_size && t.nbytes <= data_size - t.offset,
                      "%s: tensor '%s' (%llu bytes at offset %llu) extends past the end of the "
                      "file (data section is %llu bytes)",
                      path.c_str(), t.name.c_str(), static_cast<unsigned long long>(t.nbytes),
                      static_cast<unsigned long long>(t.offset),
                      static_cast<unsigned long long>(data_size));
    t.data = file_->data() + data_start + t.offset;
  }
  // No two tensors may share bytes.
  std::vector<const GgufTensorInfo*> by_off;
  for (const auto& t : tensors_)
    if (t.nbytes > 0) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_off.size(); ++i) {
    const GgufTensorInfo* a = by_off[i - 1];
    const GgufTensorInfo* b = by_off[i];
    QLFT_CHECK_FORMAT(a->offset + a->nbytes <= b->offset,
                      "%s: tensors '%s' and '%s' overlap in the data section", path.c_str(),
                      a->name.c_str(), b->name.c_str());
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  QLFT_CHECK_FORMAT(v, "%s: metadata key '%s' is missing", path().c_str(), key.c_str());
  QLFT_CHECK_FORMAT(v->type == GgufType::STRING, "%s: metadata key '%s' is %s, expected string",
                    path().c_str(), key.c_str(), gguf_type_name(v->type));
  return std::string(v->str);
}

std::string GgufFile::get_string(const std::string& key, const std::string& def) const {
  return find(key) ? get_string(key) : def;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  QLFT_CHECK_FORMAT(v, "%s: metadata key '%s' is missing", path().c_str(), key.c_str());
  QLFT_CHECK_FORMAT(v->is_integer(), "%s: metadata key '%s' is %s, expected an integer",
                    path().c_str(), key.c_str(), gguf_type_name(v->type));
  QLFT_CHECK_FORMAT(v->type != GgufType::U64 || v->u <= static_cast<uint64_t>(INT64_MAX),
                    "%s: metadata key '%s' is %llu, too large", path().c_str(), key.c_str(),
                    static_cast<unsigned long long>(v->u));
  return v->i;
}

int64_t GgufFile::get_int_in(const std::string& key, int64_t lo, int64_t hi) const {
  int64_t v = get_int(key);
  QLFT_CHECK_FORMAT(v >= lo && v <= hi, "%s: metadata key '%s' is %lld, expected %lld..%lld",
                    path().c_str(), key.c_str(), static_cast<long long>(v),
                    static_cast<long long>(lo), static_cast<long long>(hi));
  return v;
}

int64_t GgufFile::get_int_in(const std::string& key, int64_t lo, int64_t hi, int64_t def) const {
  return find(key) ? get_int_in(key, lo, hi) : def;
}

int64_t GgufFile::get_int(const std::string& key, int64_t def) const {
  return find(key) ? get_int(key) : def;
}

double GgufFile::get_float(const std::string& key, double def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  QLFT_CHECK_FORMAT(v->is_number(), "%s: metadata key '%s' is %s, expected a number",
                    path().c_str(), key.c_str(), gguf_type_name(v->type));
  return v->is_integer() ? static_cast<double>(v->i) : v->f;
}

bool GgufFile::get_bool(const std::string& key, bool def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  QLFT_CHECK_FORMAT(v->type == GgufType::BOOL, "%s: metadata key '%s' is %s, expected bool",
                    path().c_str(), key.c_str(), gguf_type_name(v->type));
  return v->u != 0;
}

}  // namespace qlft
