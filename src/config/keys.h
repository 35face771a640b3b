// The one table of settings keys. A key exists only if it is in kKeys (keys.cpp): the C API,
// CLI flags, YAML files, --help and docs/CONFIG.md all read it from here.
#pragma once

#include <cstddef>
#include <string>

namespace qlft {

enum class KeyType { Int, Float, Bool, String, Enum, Size, List };

struct KeyDef {
  const char* name;
  KeyType type;
  const char* default_value;
  double min, max;      // Int and Float: inclusive range
  const char* choices;  // Enum: "a|b|c"; List: allowed items "a|b|c" or "" for any
  const char* doc;
};

size_t key_count();
const KeyDef& key_at(size_t i);
// nullptr if the key is unknown.
const KeyDef* find_key(const std::string& name);
const char* key_type_name(KeyType t);
// "1..65536", "nf4|int8|keep", "" (what qlft_config_key.allowed reports)
std::string key_allowed(const KeyDef& k);

// Throws QLFT_ERR_INVALID_ARGUMENT with a message naming the key if value does not fit k.
// Returns the normalized value (bools become "true"/"false", lists lose spaces).
std::string validate_value(const KeyDef& k, const std::string& value);

}  // namespace qlft
