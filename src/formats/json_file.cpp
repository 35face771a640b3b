#include "formats/json_file.h"

#include <cstdint>

#include "core/error.h"
#include "formats/mapped_file.h"

namespace qlft {

JsonFile JsonFile::load(const std::string& path) {
  return parse(read_text_file(path), path);
}

JsonFile JsonFile::parse(const std::string& text, const std::string& path) {
  JsonFile f;
  f.path_ = path;
  try {
    f.j_ = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e999
    throw_error(QLFT_ERR_FORMAT, "%s: invalid JSON: %s", path.c_str(), e.what());
  }
  QLFT_CHECK_FORMAT(f.j_.is_object(), "%s: expected a JSON object at the top level", path.c_str());
  return f;
}

int64_t JsonFile::get_int(const char* key) const {
  QLFT_CHECK_FORMAT(has(key), "%s: key '%s' is missing", path_.c_str(), key);
  const auto& v = j_[key];
  QLFT_CHECK_FORMAT(v.is_number_integer(), "%s: key '%s' must be an integer", path_.c_str(), key);
  QLFT_CHECK_FORMAT(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX),
                    "%s: key '%s' is too large", path_.c_str(), key);
  return v.get<int64_t>();
}

int64_t JsonFile::get_int_in(const char* key, int64_t lo, int64_t hi) const {
  int64_t v = get_int(key);
  QLFT_CHECK_FORMAT(v >= lo && v <= hi, "%s: key '%s' is %lld, expected %lld..%lld", path_.c_str(),
                    key, static_cast<long long>(v), static_cast<long long>(lo),
                    static_cast<long long>(hi));
  return v;
}

int64_t JsonFile::get_int_in(const char* key, int64_t lo, int64_t hi, int64_t def) const {
  return has(key) ? get_int_in(key, lo, hi) : def;
}

int64_t JsonFile::get_int(const char* key, int64_t def) const {
  return has(key) ? get_int(key) : def;
}

double JsonFile::get_float(const char* key, double def) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  QLFT_CHECK_FORMAT(v.is_number(), "%s: key '%s' must be a number", path_.c_str(), key);
  return v.get<double>();
}

bool JsonFile::get_bool(const char* key, bool def) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  QLFT_CHECK_FORMAT(v.is_boolean(), "%s: key '%s' must be true or false", path_.c_str(), key);
  return v.get<bool>();
}

std::string JsonFile::get_string(const char* key, const std::string& def) const {
  if (!has(key)) return def;
  const auto& v = j_[key];
  QLFT_CHECK_FORMAT(v.is_string(), "%s: key '%s' must be a string", path_.c_str(), key);
  return v.get<std::string>();
}

}  // namespace qlft
