#include "core/plugin_path.h"

#include <dlfcn.h>

#include <cstdlib>

namespace qlft {

namespace {
// The directory of the binary this function is in; empty when the loader cannot say.
std::string dir_of_this_code() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_path), &info) == 0 || !info.dli_fname)
    return std::string();
  const std::string f = info.dli_fname;
  const size_t slash = f.rfind('/');
  return slash == std::string::npos ? std::string(".") : f.substr(0, slash);
}
}  // namespace

std::string plugin_path(const char* env_var, const char* file) {
  const char* env = std::getenv(env_var);
  if (env && *env) return env;
  const std::string dir = dir_of_this_code();
  return dir.empty() ? std::string(file) : dir + "/" + file;
}

void* plugin_entry(const std::string& path, const char* symbol, bool global, std::string* why) {
  void* h = dlopen(path.c_str(), RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
  if (!h) {
    const char* e = dlerror();
    *why = path + " could not be loaded: " + (e ? e : "unknown dlopen error");
    return nullptr;
  }
  void* entry = dlsym(h, symbol);
  if (!entry) *why = path + " has no " + symbol + " symbol";
  return entry;
}

}  // namespace qlft
