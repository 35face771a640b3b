#include "config/config.h"

#include <cstdlib>
#include <sstream>

#include "config/keys.h"
#include "core/error.h"
#include "core/memory.h"

namespace qlft {

namespace {
const KeyDef& need_key(const std::string& key) {
  const KeyDef* k = find_key(key);
  if (!k) throw_error(QLFT_ERR_INVALID_ARGUMENT, "unknown setting '%s'", key.c_str());
  return *k;
}
}  // namespace

void Config::set(const std::string& key, const std::string& value) {
  const KeyDef& k = need_key(key);
  values_[key] = validate_value(k, value);
}

std::string Config::get(const std::string& key) const {
  const KeyDef& k = need_key(key);
  auto it = values_.find(key);
  return it != values_.end() ? it->second : std::string(k.default_value);
}

int64_t Config::get_int(const std::string& key) const {
  return std::strtoll(get(key).c_str(), nullptr, 10);
}
double Config::get_float(const std::string& key) const {
  return std::strtod(get(key).c_str(), nullptr);
}
bool Config::get_bool(const std::string& key) const {
  return get(key) == "true";
}
uint64_t Config::get_size(const std::string& key) const {
  return parse_bytes(get(key), key.c_str());
}

std::vector<std::string> Config::get_list(const std::string& key) const {
  std::vector<std::string> out;
  std::stringstream ss(get(key));
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace qlft
