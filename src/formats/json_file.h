// Typed access to a small JSON file (HF config.json, tokenizer.json, adapter_config.json) with
// errors that name the file and the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace qlft {

class JsonFile {
 public:
  // Throws QLFT_ERR_IO if unreadable, QLFT_ERR_FORMAT (with the parser's position) if invalid.
  static JsonFile load(const std::string& path);
  static JsonFile parse(const std::string& text, const std::string& path);

  const nlohmann::json& root() const { return j_; }
  const std::string& path() const { return path_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t get_int(const char* key) const;
  int64_t get_int(const char* key, int64_t def) const;
  // get_int that also requires lo <= value <= hi (QLFT_ERR_FORMAT naming the key otherwise).
  int64_t get_int_in(const char* key, int64_t lo, int64_t hi) const;
  int64_t get_int_in(const char* key, int64_t lo, int64_t hi, int64_t def) const;
  double get_float(const char* key, double def) const;
  bool get_bool(const char* key, bool def) const;
  std::string get_string(const char* key, const std::string& def) const;

 private:
  nlohmann::json j_;
  std::string path_;
};

}  // namespace qlft
