#include "backend/cuda_plugin.h"

#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "core/plugin_path.h"
#include "core/threads.h"

#define QLFT_PLUGIN_STR2(x) #x
#define QLFT_PLUGIN_STR(x) QLFT_PLUGIN_STR2(x)

namespace qlft::cuda_plugin {

namespace {

constexpr const char* kPluginFile = "libqlft-cuda.so";
constexpr const char* kPluginEnv = "QLFT_CUDA_PLUGIN";
constexpr const char* kVersion = QLFT_PLUGIN_STR(QLFT_VERSION_MAJOR) "." QLFT_PLUGIN_STR(
    QLFT_VERSION_MINOR) "." QLFT_PLUGIN_STR(QLFT_VERSION_PATCH);

[[noreturn]] void host_raise(int32_t status, const char* message) {
  throw Error(status, message ? message : "CUDA plugin error");
}
void host_log(int32_t level, const char* message) {
  log_message(level, "%s", message);
}
bool host_log_enabled(int32_t level) {
  return log_enabled(level);
}
int host_num_threads() {
  return num_threads();
}

const CudaPluginHost kHost = {
    kCudaPluginAbiVersion, kCudaPluginLayout, kVersion, host_raise, host_log,
    host_log_enabled,      host_num_threads};

// Opened once and kept (objects it made may outlive any call); a failure is not remembered, so
// each attempt reports the file it tried and a plugin installed later is found.
const CudaPlugin* open_plugin(std::string* why) {
  static std::mutex mu;
  static const CudaPlugin* plugin = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (plugin) return plugin;
  const std::string file = path();
  // Local: the plugin exports one symbol and needs nobody else's.
  auto entry = reinterpret_cast<CudaPluginEntry>(
      plugin_entry(file, QLFT_CUDA_PLUGIN_ENTRY, /*global=*/false, why));
  if (!entry) {
    *why += " (not a qlft CUDA plugin?)";
    return nullptr;
  }
  char err[512] = {};
  const CudaPlugin* p = entry(&kHost, err, sizeof err);
  if (!p) {
    *why = strf("%s refused this libqlft: %s", file.c_str(), err);
    return nullptr;
  }
  if (p->abi_version != kCudaPluginAbiVersion || p->layout != kCudaPluginLayout ||
      std::string(p->version) != kVersion) {
    *why = strf(
        "%s was built from other sources (plugin ABI %u, layout %llx, version %s; this "
        "libqlft: ABI %u, layout %llx, version %s): install the plugin built with this "
        "libqlft",
        file.c_str(), p->abi_version, static_cast<unsigned long long>(p->layout), p->version,
        kCudaPluginAbiVersion, static_cast<unsigned long long>(kCudaPluginLayout), kVersion);
    return nullptr;
  }
  plugin = p;  // never dlclose'd
  return plugin;
}

}  // namespace

std::string path() {
  return plugin_path(kPluginEnv, kPluginFile);
}

const CudaPlugin& get(const char* what) {
  std::string why;
  if (const CudaPlugin* p = open_plugin(&why)) return *p;
  throw_error(QLFT_ERR_UNSUPPORTED,
              "%s needs the CUDA plugin: %s. The plugin is built by -DQLFT_CUDA=ON and installed "
              "beside libqlft; it needs the CUDA runtime, cuBLASLt and NCCL libraries on the "
              "library path. Set %s to the plugin's path to use another one",
              what, why.c_str(), kPluginEnv);
}

bool loadable(std::string* why) {
  std::string w;
  const bool ok = open_plugin(&w) != nullptr;
  if (why) *why = w;
  return ok;
}

}  // namespace qlft::cuda_plugin
