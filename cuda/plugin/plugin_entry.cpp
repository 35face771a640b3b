// libqlft-cuda.so's one exported symbol: checks that libqlft and the plugin come from the same
// sources (backend/cuda_plugin_abi.h) and hands libqlft the CUDA backend's entry points.
#include <cstdio>

#include "backend/cuda_entry.h"
#include "backend/cuda_plugin_abi.h"
#include "core/thread_count_source.h"
#include "plugin_host.h"
#include "backend/nccl_entry.h"

#define QLFT_PLUGIN_STR2(x) #x
#define QLFT_PLUGIN_STR(x) QLFT_PLUGIN_STR2(x)

namespace {

constexpr const char* kVersion = QLFT_PLUGIN_STR(QLFT_VERSION_MAJOR) "." QLFT_PLUGIN_STR(
    QLFT_VERSION_MINOR) "." QLFT_PLUGIN_STR(QLFT_VERSION_PATCH);

int device_count(std::string* why) {
  return qlft::cuda_device_count(why);
}
std::string runtime_info() {
  return qlft::cuda_runtime_info();
}
std::unique_ptr<qlft::Backend> make_backend(qlft::MemoryTracker* tracker,
                                            const qlft::CudaBackendOptions& opt) {
  return qlft::make_cuda_backend(tracker, opt);
}
uint64_t device_available(qlft::MemoryTracker* tracker) {
  return qlft::cuda_device_available(tracker);
}
void empty_cache(qlft::MemoryTracker* tracker) {
  qlft::cuda_empty_cache(tracker);
}
uint64_t cached_bytes(qlft::MemoryTracker* tracker) {
  return qlft::cuda_cached_bytes(tracker);
}
std::unique_ptr<qlft::dist::Communicator> make_nccl(
    std::unique_ptr<qlft::dist::Communicator> bootstrap, double timeout_s) {
  return qlft::dist::make_nccl_communicator(std::move(bootstrap), timeout_s);
}

#if QLFT_CUDA_EMULATE
constexpr const char* kDescription = "CUDA emulator (cuda/emu)";
#else
constexpr const char* kDescription = "CUDA runtime, cuBLASLt, NCCL";
#endif

const qlft::CudaPlugin kPlugin = {qlft::kCudaPluginAbiVersion,
                                  qlft::kCudaPluginLayout,
                                  kVersion,
                                  kDescription,
                                  device_count,
                                  runtime_info,
                                  make_backend,
                                  device_available,
                                  empty_cache,
                                  cached_bytes,
                                  make_nccl};

}  // namespace

extern "C" __attribute__((visibility("default"))) const qlft::CudaPlugin* qlft_cuda_plugin(
    const qlft::CudaPluginHost* host, char* err, size_t errlen) {
  if (!host || host->abi_version != qlft::kCudaPluginAbiVersion ||
      host->layout != qlft::kCudaPluginLayout || std::string(host->version) != kVersion) {
    std::snprintf(err, errlen,
                  "libqlft-cuda.so %s (ABI %u, layout %llx) needs the libqlft it was built with",
                  kVersion, qlft::kCudaPluginAbiVersion,
                  static_cast<unsigned long long>(qlft::kCudaPluginLayout));
    return nullptr;
  }
  qlft::set_plugin_host(host);
  qlft::set_thread_count_source(host->num_threads);
  return &kPlugin;
}
