#include "formats/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace qlft {

namespace {
constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the spec's own limit is 100 MB

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
std::string dirname_of(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
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

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->file_ = std::make_unique<MappedFile>(path);
  f->parse();
  return f;
}

void SafetensorsFile::parse() {
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
  // nlohmann keeps the last of duplicate keys; the spec forbids them, so catch them while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t ev,
                                             nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        parsed.is_string() && !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json h = nlohmann::json::parse(hp, hp + hlen, cb, /*allow_exceptions=*/false);
  QLFT_CHECK_FORMAT(!h.is_discarded(), "%s: header is not valid JSON", path.c_str());
  QLFT_CHECK_FORMAT(duplicate.empty(), "%s: header names '%s' twice", path.c_str(),
                    duplicate.c_str());
  QLFT_CHECK_FORMAT(h.is_object(), "%s: header is not a JSON object", path.c_str());
  const uint64_t data_size = size - 8 - hlen;
  const uint8_t* data = file_->data() + 8 + hlen;

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    if (name == "__metadata__") {
      QLFT_CHECK_FORMAT(e.is_object(), "%s: __metadata__ is not an object", path.c_str());
      for (auto m = e.begin(); m != e.end(); ++m) {
        QLFT_CHECK_FORMAT(m.value().is_string(), "%s: __metadata__ value '%s' is not a string",
                          path.c_str(), m.key().c_str());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    QLFT_CHECK_FORMAT(e.is_object(), "%s is not an object", where.c_str());
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    auto off = e.find("data_offsets");
    QLFT_CHECK_FORMAT(dt != e.end() && dt->is_string(), "%s has no string dtype", where.c_str());
    QLFT_CHECK_FORMAT(sh != e.end() && sh->is_array(), "%s has no shape array", where.c_str());
    QLFT_CHECK_FORMAT(off != e.end() && off->is_array() && off->size() == 2 &&
                          (*off)[0].is_number_unsigned() && (*off)[1].is_number_unsigned(),
                      "%s: data_offsets must be two unsigned integers", where.c_str());
    SafeTensorInfo t;
    t.name = name;
    t.dtype = safetensors_dtype(dt->get<std::string>(), where);
    QLFT_CHECK_FORMAT(sh->size() <= 8, "%s has %zu dimensions", where.c_str(), sh->size());
    unsigned __int128 n = 1;
    for (const auto& d : *sh) {
      QLFT_CHECK_FORMAT(d.is_number_unsigned(), "%s: shape entries must be unsigned integers",
                        where.c_str());
      uint64_t v = d.get<uint64_t>();
      QLFT_CHECK_FORMAT(v <= (uint64_t(1) << 40), "%s: dimension %llu is too large", where.c_str(),
                        static_cast<unsigned long long>(v));
      n *= v;
      QLFT_CHECK_FORMAT(n <= (static_cast<unsigned __int128>(1) << 50), "%s has too many elements",
                        where.c_str());
      t.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t b = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    QLFT_CHECK_FORMAT(b <= end && end <= data_size,
                      "%s: data_offsets [%llu, %llu) fall outside the %llu-byte data section",
                      where.c_str(), static_cast<unsigned long long>(b),
                      static_cast<unsigned long long>(end),
                      static_cast<unsigned long long>(data_size));
    uint64_t want = static_cast<uint64_t>(n) * dtype_size(t.dtype);
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
    t.data = data + b;
    t.nbytes = want;
    t.file = &file_->path();
    tensors_.push_back(std::move(t));
  }
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
    if (exists(path + "/model.safetensors.index.json"))
      path += "/model.safetensors.index.json";
    else if (exists(path + "/model.safetensors"))
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
