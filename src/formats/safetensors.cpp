#include "formats/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/path.h"

namespace qlft {

namespace {
constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the spec's own limit is 100 MB

// One top-level entry of a header as the parse meets it: what check_entry needs.
struct HeaderEntry {
  std::string name;
  bool is_object = false;
  bool has_dtype = false;  // a string value
  std::string dtype;
  bool has_shape = false, shape_ok = true;  // an array; of unsigned integers only
  std::vector<uint64_t> shape;
  bool has_offsets = false, offsets_ok = true;
  std::vector<uint64_t> offsets;
};

// The header parsed in one streaming pass. nlohmann's DOM parse with a callback (which we used
// to catch duplicate names) rescans the enclosing object at every object's end: a header of n
// tensors took O(n^2), 40k tensors 13 s. This SAX handler keeps no document: each top-level
// entry is collected into a HeaderEntry and handed to on_entry when it ends, __metadata__'s
// strings to on_meta. Nesting deeper than kMaxDepth is refused (a header needs 3: root,
// tensor, shape); the size is bounded by kMaxHeader. Problems inside entries are reported by
// the callbacks; this handler only follows the structure.
class HeaderParser : public nlohmann::json_sax<nlohmann::json> {
 public:
  static constexpr int kMaxDepth = 8;
  std::function<void(HeaderEntry&)> on_entry;
  // value: null when __metadata__[key] is not a string.
  std::function<void(const std::string& key, const std::string* value)> on_meta;
  std::string error;  // the parser's message when the JSON is invalid
  bool too_deep = false, root_is_object = false;
  int metadata_entries = 0;

  bool null() override { return scalar(Kind::Other, nullptr, 0); }
  bool boolean(bool) override { return scalar(Kind::Other, nullptr, 0); }
  bool number_integer(number_integer_t) override { return scalar(Kind::Other, nullptr, 0); }
  bool number_unsigned(number_unsigned_t v) override { return scalar(Kind::Unsigned, nullptr, v); }
  bool number_float(number_float_t, const string_t&) override {
    return scalar(Kind::Other, nullptr, 0);
  }
  bool string(string_t& v) override { return scalar(Kind::String, &v, 0); }
  bool binary(binary_t&) override { return scalar(Kind::Other, nullptr, 0); }
  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      entry_ = HeaderEntry();
      entry_.name = std::move(k);
      meta_ = entry_.name == "__metadata__";
      field_ = Field::Other;  // until the entry's own keys
    } else if (depth_ == 2) {
      field_ = meta_                 ? Field::Meta
               : k == "dtype"        ? Field::Dtype
               : k == "shape"        ? Field::Shape
               : k == "data_offsets" ? Field::Offsets
                                     : Field::Other;
      if (meta_) meta_key_ = std::move(k);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }

 private:
  enum class Kind { Unsigned, String, Other };
  enum class Field { Dtype, Shape, Offsets, Meta, Other };
  int depth_ = 0;  // open objects and arrays
  HeaderEntry entry_;
  bool meta_ = false;
  Field field_ = Field::Other;
  std::string meta_key_;
  bool field_array_ = false;  // the field's value (depth 2) is an array

  // A value at depth 2 that is not what its field needs.
  void wrong_field_value() {
    if (field_ == Field::Dtype) entry_.has_dtype = false;
    if (field_ == Field::Shape) entry_.has_shape = false;
    if (field_ == Field::Offsets) entry_.has_offsets = false;
    if (field_ == Field::Meta) on_meta(meta_key_, nullptr);
  }
  bool scalar(Kind kind, std::string* str, uint64_t u) {
    if (depth_ == 0) return true;  // a scalar root: root_is_object stays false
    if (depth_ == 1) {             // an entry that is not an object
      if (meta_) ++metadata_entries;
      on_entry(entry_);
      return true;
    }
    if (depth_ == 2) {
      if (field_ == Field::Dtype && kind == Kind::String) {
        entry_.has_dtype = true;
        entry_.dtype = std::move(*str);
      } else if (field_ == Field::Meta && kind == Kind::String) {
        on_meta(meta_key_, str);
      } else {
        wrong_field_value();
      }
      return true;
    }
    if (depth_ == 3 && field_array_) {
      std::vector<uint64_t>& v = field_ == Field::Shape ? entry_.shape : entry_.offsets;
      bool& ok = field_ == Field::Shape ? entry_.shape_ok : entry_.offsets_ok;
      if (kind == Kind::Unsigned)
        v.push_back(u);
      else
        ok = false;
    }
    return true;
  }
  bool open(bool array) {
    if (depth_ >= kMaxDepth) {
      too_deep = true;
      error = "too deep";
      return false;
    }
    if (depth_ == 0) root_is_object = !array;
    if (depth_ == 1) entry_.is_object = !array;
    if (depth_ == 2) {
      field_array_ = array && (field_ == Field::Shape || field_ == Field::Offsets);
      if (field_array_ && field_ == Field::Shape) entry_.has_shape = true, entry_.shape.clear();
      if (field_array_ && field_ == Field::Offsets)
        entry_.has_offsets = true, entry_.offsets.clear();
      if (!field_array_) wrong_field_value();
    }
    if (depth_ == 3 && field_array_) {  // a nested array or object inside shape/data_offsets
      (field_ == Field::Shape ? entry_.shape_ok : entry_.offsets_ok) = false;
    }
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    if (depth_ == 1) {  // an entry's object (or array) ends
      if (meta_) ++metadata_entries;
      on_entry(entry_);
    }
    return true;
  }
};
}  // namespace

DType safetensors_dtype(const std::string& n, const std::string& where) {
  if (n == "F32") return DType::F32;
  if (n == "F16") return DType::F16;
  if (n == "BF16") return DType::BF16;
  if (n == "F64") return DType::F64;
  if (n == "I8") return DType::I8;
  if (n == "U8") return DType::U8;
  if (n == "I16") return DType::I16;
  if (n == "I32") return DType::I32;
  if (n == "I64") return DType::I64;
  if (n == "BOOL") return DType::BOOL;
  // Valid in the safetensors spec, but no qlft tensor uses them.
  static const char* known[] = {"U16",     "U32",     "U64",     "F8_E4M3", "F8_E5M2",
                                "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",      "C64"};
  for (const char* k : known)
    if (n == k)
      throw_error(QLFT_ERR_UNSUPPORTED, "%s: dtype '%s' is not supported by qlft", where.c_str(),
                  n.c_str());
  throw_error(QLFT_ERR_FORMAT, "%s: dtype '%s' is not a safetensors dtype", where.c_str(),
              n.c_str());
}

const char* safetensors_dtype_name(DType t) {
  return dtype_name(t);
}

namespace {
// A tensor entry checked as the spec and qlft need it: dtype, shape, offsets inside the data
// section, extent = shape x dtype size, aligned to the element size.
SafeTensorInfo check_entry(HeaderEntry& e, const std::string& path, const uint8_t* data,
                           uint64_t data_size) {
  const std::string where = path + ": tensor '" + e.name + "'";
  QLFT_CHECK_FORMAT(e.is_object, "%s is not an object", where.c_str());
  QLFT_CHECK_FORMAT(e.has_dtype, "%s has no string dtype", where.c_str());
  QLFT_CHECK_FORMAT(e.has_shape, "%s has no shape array", where.c_str());
  QLFT_CHECK_FORMAT(e.has_offsets && e.offsets_ok && e.offsets.size() == 2,
                    "%s: data_offsets must be two unsigned integers", where.c_str());
  SafeTensorInfo t;
  t.dtype = safetensors_dtype(e.dtype, where);
  QLFT_CHECK_FORMAT(e.shape.size() <= 8 || !e.shape_ok, "%s has %zu dimensions", where.c_str(),
                    e.shape.size());
  QLFT_CHECK_FORMAT(e.shape_ok, "%s: shape entries must be unsigned integers", where.c_str());
  unsigned __int128 n = 1;
  for (uint64_t v : e.shape) {
    QLFT_CHECK_FORMAT(v <= (uint64_t(1) << 40), "%s: dimension %llu is too large", where.c_str(),
                      static_cast<unsigned long long>(v));
    n *= v;
    QLFT_CHECK_FORMAT(n <= (static_cast<unsigned __int128>(1) << 50), "%s has too many elements",
                      where.c_str());
    t.shape.push_back(static_cast<int64_t>(v));
  }
  const uint64_t b = e.offsets[0], end = e.offsets[1];
  QLFT_CHECK_FORMAT(b <= end && end <= data_size,
                    "%s: data_offsets [%llu, %llu) fall outside the %llu-byte data section",
                    where.c_str(), static_cast<unsigned long long>(b),
                    static_cast<unsigned long long>(end),
                    static_cast<unsigned long long>(data_size));
  const uint64_t want = static_cast<uint64_t>(n) * dtype_size(t.dtype);
  QLFT_CHECK_FORMAT(end - b == want,
                    "%s: data_offsets span %llu bytes but shape and dtype %s need %llu",
                    where.c_str(), static_cast<unsigned long long>(end - b), dtype_name(t.dtype),
                    static_cast<unsigned long long>(want));
  // Writers order tensors so each starts at a multiple of its element size; a file that does
  // not is malformed (and would make typed reads misaligned).
  QLFT_CHECK_FORMAT(b % dtype_size(t.dtype) == 0,
                    "%s: data offset %llu is not a multiple of the %s element size %zu",
                    where.c_str(), static_cast<unsigned long long>(b), dtype_name(t.dtype),
                    dtype_size(t.dtype));
  t.name = std::move(e.name);
  t.data = data + b;
  t.nbytes = want;
  return t;
}
}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  return std::unique_ptr<SafetensorsFile>(new SafetensorsFile(path));
}

SafetensorsFile::SafetensorsFile(const std::string& file) : MappedReader(file) {
  const std::string& path = file_->path();
  const uint64_t size = file_->size();
  QLFT_CHECK_FORMAT(size >= 8, "%s: truncated (%llu bytes, no header length)", path.c_str(),
                    static_cast<unsigned long long>(size));
  uint64_t hlen;
  std::memcpy(&hlen, file_->data(), 8);
  QLFT_CHECK_FORMAT(hlen <= kMaxHeader, "%s: header length %llu exceeds the 100 MB limit",
                    path.c_str(), static_cast<unsigned long long>(hlen));
  QLFT_CHECK_FORMAT(hlen <= size - 8, "%s: header length %llu runs past the end of the file",
                    path.c_str(), static_cast<unsigned long long>(hlen));
  const char* hp = reinterpret_cast<const char*>(file_->data() + 8);
  const uint64_t data_size = size - 8 - hlen;
  const uint8_t* data = file_->data() + 8 + hlen;
  // Problems inside entries are kept (the first) until the whole header has parsed: invalid
  // JSON and duplicate names are reported first, as a whole-document parse would.
  int32_t entry_status = QLFT_OK;
  std::string entry_error;
  auto note = [&](const Error& e) {
    if (entry_status == QLFT_OK) entry_status = e.status(), entry_error = e.what();
  };
  HeaderParser hp_sax;
  hp_sax.on_meta = [&](const std::string& key, const std::string* value) {
    if (!value) {
      if (entry_status == QLFT_OK)
        entry_status = QLFT_ERR_FORMAT,
        entry_error = path + ": __metadata__ value '" + key + "' is not a string";
      return;
    }
    metadata_[key] = *value;
  };
  hp_sax.on_entry = [&](HeaderEntry& e) {
    if (e.name == "__metadata__") {
      if (!e.is_object && entry_status == QLFT_OK)
        entry_status = QLFT_ERR_FORMAT, entry_error = path + ": __metadata__ is not an object";
      return;
    }
    try {
      tensors_.push_back(check_entry(e, path, data, data_size));
      tensors_.back().file = &file_->path();
    } catch (const Error& err) {
      note(err);
    }
  };
  const bool parsed = nlohmann::json::sax_parse(hp, hp + hlen, &hp_sax);
  QLFT_CHECK_FORMAT(!hp_sax.too_deep, "%s: header nests deeper than %d levels", path.c_str(),
                    HeaderParser::kMaxDepth);
  QLFT_CHECK_FORMAT(parsed, "%s: header is not valid JSON (%s)", path.c_str(),
                    hp_sax.error.c_str());
  QLFT_CHECK_FORMAT(hp_sax.root_is_object, "%s: header is not a JSON object", path.c_str());
  // The spec forbids a name twice: an open-addressing table of the names' hashes (linear time,
  // no copy of a name); names are compared only where hashes are equal. Tensors stay in the
  // file's order.
  QLFT_CHECK_FORMAT(hp_sax.metadata_entries <= 1, "%s: header names '__metadata__' twice",
                    path.c_str());
  size_t cap = 16;
  while (cap < 2 * tensors_.size()) cap *= 2;
  std::vector<size_t> hashes(tensors_.size());
  std::vector<uint32_t> table(cap, 0);  // index + 1 of a tensor; 0: empty
  for (size_t i = 0; i < tensors_.size(); ++i) {
    hashes[i] = std::hash<std::string>()(tensors_[i].name);
    size_t slot = hashes[i] & (cap - 1);
    for (; table[slot] != 0; slot = (slot + 1) & (cap - 1)) {
      const size_t o = table[slot] - 1;
      QLFT_CHECK_FORMAT(hashes[o] != hashes[i] || tensors_[o].name != tensors_[i].name,
                        "%s: header names '%s' twice", path.c_str(), tensors_[i].name.c_str());
    }
    table[slot] = static_cast<uint32_t>(i + 1);
  }
  if (entry_status != QLFT_OK) throw Error(entry_status, entry_error);
  std::vector<const SafeTensorInfo*> s;
  for (const auto& t : tensors_)
    if (t.nbytes > 0) s.push_back(&t);  // empty tensors occupy no bytes
  std::sort(s.begin(), s.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < s.size(); ++i)
    QLFT_CHECK_FORMAT(s[i - 1]->data + s[i - 1]->nbytes <= s[i]->data,
                      "%s: tensors '%s' and '%s' overlap", path.c_str(), s[i - 1]->name.c_str(),
                      s[i]->name.c_str());
}

void SafetensorsSet::add(std::unique_ptr<SafetensorsFile> f) {
  for (const SafeTensorInfo& t : f->tensors()) {
    QLFT_CHECK_FORMAT(!index_.count(t.name), "%s: tensor '%s' is also in %s", f->path().c_str(),
                      t.name.c_str(), index_[t.name]->file->c_str());
    index_[t.name] = &t;
    all_.push_back(&t);
  }
  files_.push_back(std::move(f));
}

std::unique_ptr<SafetensorsSet> SafetensorsSet::open(const std::string& path_in) {
  std::string path = path_in;
  if (is_dir(path)) {
    if (path_exists(path + "/model.safetensors.index.json"))
      path += "/model.safetensors.index.json";
    else if (path_exists(path + "/model.safetensors"))
      path += "/model.safetensors";
    else
      throw_error(QLFT_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json in it",
                  path.c_str());
  }
  auto set = std::make_unique<SafetensorsSet>();
  if (!ends_with(path, ".json")) {
    set->add(SafetensorsFile::open(path));
    return set;
  }
  std::string text = read_text_file(path, size_t(64) << 20);
  nlohmann::json idx = nlohmann::json::parse(text, nullptr, false);
  QLFT_CHECK_FORMAT(!idx.is_discarded() && idx.is_object(), "%s: not a JSON object", path.c_str());
  auto wm = idx.find("weight_map");
  QLFT_CHECK_FORMAT(wm != idx.end() && wm->is_object() && !wm->empty(),
                    "%s: missing or empty 'weight_map'", path.c_str());
  std::string dir = dirname_of(path);
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    QLFT_CHECK_FORMAT(it.value().is_string(), "%s: weight_map['%s'] is not a string", path.c_str(),
                      it.key().c_str());
    std::string shard = it.value().get<std::string>();
    // Shards live beside the index: no directories, so a hostile index cannot reach elsewhere.
    QLFT_CHECK_FORMAT(!shard.empty() && shard.find('/') == std::string::npos &&
                          shard.find('\\') == std::string::npos &&
                          shard.find('\0') == std::string::npos && shard != ".." && shard != ".",
                      "%s: weight_map['%s'] names '%s', which is not a file beside the index",
                      path.c_str(), it.key().c_str(), shard.c_str());
    shards.insert(shard);
  }
  for (const std::string& s : shards) set->add(SafetensorsFile::open(dir + "/" + s));
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const SafeTensorInfo* t = set->find(it.key());
    QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is listed in weight_map but in no shard", path.c_str(),
                      it.key().c_str());
    std::string want = dir + "/" + it.value().get<std::string>();
    QLFT_CHECK_FORMAT(*t->file == want, "%s: tensor '%s' is in %s, but weight_map says %s",
                      path.c_str(), it.key().c_str(), t->file->c_str(), want.c_str());
  }
  return set;
}

const SafeTensorInfo* SafetensorsSet::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

}  // namespace qlft
