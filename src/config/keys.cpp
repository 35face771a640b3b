#include "config/keys.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/memory.h"

namespace qlft {

namespace {
constexpr double kNoMin = -1e300, kNoMax = 1e300;

// Grouped by the prefix before the dot; keep each group together and sorted by meaning.
const KeyDef kKeys[] = {
    {"backend", KeyType::Enum, "cpu", 0, 0, "cpu|cuda",
     "Compute backend. cuda needs a build with QLFT_CUDA=ON and a device."},
    {"threads", KeyType::Int, "0", 0, 4096, "",
     "Worker threads for kernels and BLAS; 0 uses every core the process may run on."},
    {"memory.limit", KeyType::Size, "0", 0, 0, "",
     "Budget for runtime-owned memory (host RAM on cpu, device memory on cuda); 0 = unlimited. "
     "Accepts K, M, G, T suffixes (powers of 1024)."},
    {"log.level", KeyType::Enum, "warn", 0, 0, "error|warn|info|debug",
     "Most verbose level passed to the log callback."},
    {"quant.type", KeyType::Enum, "nf4", 0, 0, "nf4|int8|keep",
     "How base linear weights are stored: NF4 (bitsandbytes layout), INT8 row-wise absmax, or "
     "kept as in the file (GGUF blocks or floats). Pre-quantized bitsandbytes weights stay as "
     "they are."},
    {"quant.double_quant", KeyType::Bool, "true", 0, 0, "",
     "NF4 only: quantize the per-block absmax again to 8 bits (blocks of 256), as "
     "bnb_4bit_use_double_quant."},
    {"quant.blocksize", KeyType::Int, "64", 64, 4096, "",
     "NF4 only: elements per absmax block (bitsandbytes default 64; a power of two)."},
};
constexpr size_t kKeyCount = sizeof(kKeys) / sizeof(kKeys[0]);

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool in_choices(const char* choices, const std::string& v) {
  std::stringstream ss(choices);
  std::string item;
  while (std::getline(ss, item, '|'))
    if (item == v) return true;
  return false;
}

std::string range_text(const KeyDef& k) {
  auto num = [](double d) {
    if (d == std::floor(d) && std::fabs(d) < 1e15) return strf("%lld", static_cast<long long>(d));
    return strf("%g", d);
  };
  if (k.min <= kNoMin && k.max >= kNoMax) return "";
  if (k.max >= kNoMax) return ">= " + num(k.min);
  return num(k.min) + ".." + num(k.max);
}
}  // namespace

size_t key_count() { return kKeyCount; }
const KeyDef& key_at(size_t i) { return kKeys[i]; }

const KeyDef* find_key(const std::string& name) {
  for (const KeyDef& k : kKeys)
    if (name == k.name) return &k;
  return nullptr;
}

const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::Int: return "int";
    case KeyType::Float: return "float";
    case KeyType::Bool: return "bool";
    case KeyType::String: return "string";
    case KeyType::Enum: return "enum";
    case KeyType::Size: return "size";
    case KeyType::List: return "list";
  }
  return "?";
}

std::string key_allowed(const KeyDef& k) {
  switch (k.type) {
    case KeyType::Int:
    case KeyType::Float: return range_text(k);
    case KeyType::Bool: return "true|false";
    case KeyType::Enum: return k.choices;
    case KeyType::List: return *k.choices ? strf("comma-separated from %s", k.choices) : "comma-separated";
    case KeyType::Size: return "bytes, or with K/M/G/T";
    case KeyType::String: return "";
  }
  return "";
}

std::string validate_value(const KeyDef& k, const std::string& raw) {
  std::string v = trim(raw);
  switch (k.type) {
    case KeyType::Int: {
      errno = 0;
      char* end = nullptr;
      long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0)
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be an integer, got '%s'", k.name,
                    raw.c_str());
      if (static_cast<double>(x) < k.min || static_cast<double>(x) > k.max)
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be in %s, got %lld", k.name,
                    range_text(k).c_str(), x);
      return std::to_string(x);
    }
    case KeyType::Float: {
      errno = 0;
      char* end = nullptr;
      double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x))
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be a finite number, got '%s'", k.name,
                    raw.c_str());
      if (x < k.min || x > k.max)
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be in %s, got %s", k.name,
                    range_text(k).c_str(), v.c_str());
      return v;
    }
    case KeyType::Bool: {
      std::string l = lower(v);
      if (l == "true" || l == "1" || l == "yes" || l == "on") return "true";
      if (l == "false" || l == "0" || l == "no" || l == "off") return "false";
      throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be true or false, got '%s'", k.name,
                  raw.c_str());
    }
    case KeyType::Enum: {
      std::string l = lower(v);
      if (!in_choices(k.choices, l))
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be one of %s, got '%s'", k.name,
                    k.choices, raw.c_str());
      return l;
    }
    case KeyType::Size: parse_bytes(v, k.name); return v;
    case KeyType::List: {
      std::string out;
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        item = trim(item);
        if (item.empty()) continue;
        if (*k.choices && !in_choices(k.choices, item))
          throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s: '%s' is not one of %s", k.name,
                      item.c_str(), k.choices);
        if (!out.empty()) out += ",";
        out += item;
      }
      return out;
    }
    case KeyType::String: return v;
  }
  return v;
}

}  // namespace qlft
