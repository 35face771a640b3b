#include <cstdio>
#include <cstring>

#include "cli.h"

namespace cli {

int exit_code_for(int32_t status) {
  switch (status) {
    case QLFT_OK: return kOk;
    case QLFT_ERR_INVALID_ARGUMENT: return kUsage;
    case QLFT_ERR_IO: return kIo;
    case QLFT_ERR_FORMAT: return kFormat;
    case QLFT_ERR_OUT_OF_MEMORY: return kOutOfMemory;
    case QLFT_ERR_CANCELLED: return kCancelled;
    default: return kFailure;
  }
}

int fail(const char* what, int32_t status) {
  std::fprintf(stderr, "qlft-finetune: %s: %s (%s)\n", what, qlft_last_error(),
               qlft_status_string(status));
  return exit_code_for(status);
}

std::string human_bytes(uint64_t b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  char buf[64];
  if (i == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, u[i]);
  return buf;
}

namespace {
bool is_config_key(const std::string& k) {
  size_t n = qlft_config_key_count();
  for (size_t i = 0; i < n; ++i) {
    qlft_config_key key{};
    key.struct_size = sizeof key;
    if (qlft_config_key_at(i, &key) == QLFT_OK && k == key.name) return true;
  }
  return false;
}
bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return true;
  return false;
}
}  // namespace

bool parse_args(int argc, char** argv, int first, const std::vector<std::string>& known_flags,
                const std::vector<std::string>& bool_flags, Args* out, std::string* error) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      std::string key = a.substr(2), value;
      size_t eq = key.find('=');
      bool has_value = eq != std::string::npos;
      if (has_value) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
      }
      if (contains(bool_flags, key)) {
        out->flags[key] = has_value ? value : "true";
        continue;
      }
      bool known = contains(known_flags, key);
      if (!known && !is_config_key(key)) {
        *error = "unknown option --" + key + " (see --help; settings are listed in docs/CONFIG.md)";
        return false;
      }
      if (!has_value) {
        if (i + 1 >= argc) {
          *error = "option --" + key + " needs a value";
          return false;
        }
        value = argv[++i];
      }
      if (known)
        out->flags[key] = value;
      else
        out->settings.emplace_back(key, value);
    } else {
      out->positional.push_back(a);
    }
  }
  return true;
}

ConfigPtr make_config(const Args& a, int* exit_code) {
  qlft_config* raw = nullptr;
  int32_t st = qlft_config_create(&raw);
  if (st != QLFT_OK) {
    *exit_code = fail("config", st);
    return nullptr;
  }
  ConfigPtr cfg(raw);
  for (const auto& kv : a.settings) {
    st = qlft_config_set(cfg.get(), kv.first.c_str(), kv.second.c_str());
    if (st != QLFT_OK) {
      *exit_code = fail(("--" + kv.first).c_str(), st);
      return nullptr;
    }
  }
  return cfg;
}

}  // namespace cli
