// A set of validated settings (the object behind qlft_config).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qlft {

class Config {
 public:
  // Validates; throws QLFT_ERR_INVALID_ARGUMENT naming the key and leaves the config unchanged.
  void set(const std::string& key, const std::string& value);
  // The value, or the default from the key table. Throws for unknown keys.
  std::string get(const std::string& key) const;
  bool is_set(const std::string& key) const { return values_.count(key) != 0; }

  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  uint64_t get_size(const std::string& key) const;
  std::vector<std::string> get_list(const std::string& key) const;

  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace qlft
