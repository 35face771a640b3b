// The boundary between libqlft and its CUDA plugin (libqlft-cuda.so: cuda/ with the CUDA
// runtime, cuBLASLt and NCCL, or the emulator in an emulated build). libqlft opens the plugin
// when backend=cuda or dist.backend=nccl asks for it (backend/cuda_plugin.h), so libqlft itself
// never links a CUDA library.
//
// Unlike the MPI plugin's C table, this boundary carries C++ objects: the CUDA backend is a
// Backend working on libqlft's tensors, trackers and quantized weights, so a C table would
// repeat the whole Backend interface. What makes that sound between two DSOs that each hide
// their symbols:
//  - The plugin is built from the same sources as libqlft and links its own copy of the core
//    pieces it needs (the static qlft_core archive): the same class layouts, checked at load
//    (kCudaPluginLayout below, with the ABI version and the project version).
//  - C++ objects cross only as abstract interfaces whose vtables live in the DSO that made them
//    (Backend, DeviceAllocator, dist::Communicator), plus the plain structs and std types of the
//    signatures below. Non-virtual members of a shared class (MemoryTracker, Buffer) run as
//    each DSO's copy of the same code on the same object. State the copied core keeps outside
//    objects is either read from the environment or the CPU alike in both (cpu_isa, the
//    poison flag, the quant kernel table), forwarded (num_threads, below), or the op
//    profiler's, which stays off in the plugin (the Backend base class's host glue run there is
//    not profiled; the CUDA backend's own ops have no scopes).
//  - One exception type: the plugin's throw_error and log_message (cuda/plugin/plugin_host.cpp)
//    call the host table, so every qlft::Error raised in the plugin is libqlft's own (its
//    typeinfo and vtable are libqlft's), and logging follows qlft_set_log_callback. std
//    exceptions (bad_alloc, ...) are libstdc++'s, shared by both.
//  - The plugin is never closed: objects it made may outlive any one call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda_entry.h"
#include "core/memory.h"
#include "core/communicator.h"

namespace qlft {

// Raised whenever this file's tables change.
constexpr uint32_t kCudaPluginAbiVersion = 1;
#define QLFT_CUDA_PLUGIN_ENTRY "qlft_cuda_plugin"

// The sizes of the classes both sides touch, folded into one number: a plugin built from other
// sources (or with other options changing a layout) is refused instead of corrupting memory.
constexpr uint64_t kCudaPluginLayout =
    (uint64_t(sizeof(MemoryTracker)) << 40) ^ (uint64_t(sizeof(Buffer)) << 32) ^
    (uint64_t(sizeof(Backend)) << 24) ^ (uint64_t(sizeof(CudaBackendOptions)) << 16) ^
    (uint64_t(sizeof(QWeight)) << 8) ^ uint64_t(sizeof(dist::Communicator)) ^
    (uint64_t(sizeof(std::string)) << 48);

// libqlft -> plugin.
struct CudaPluginHost {
  uint32_t abi_version;  // kCudaPluginAbiVersion
  uint64_t layout;       // kCudaPluginLayout
  const char* version;   // the project version libqlft was built as
  // Throws libqlft's qlft::Error(status, message); never returns.
  void (*raise)(int32_t status, const char* message);
  void (*log)(int32_t level, const char* message);
  bool (*log_enabled)(int32_t level);
  int (*num_threads)();  // the calling thread's count (core/threads.h)
};

// plugin -> libqlft. Every function may throw (libqlft's qlft::Error, or std exceptions).
struct CudaPlugin {
  uint32_t abi_version;
  uint64_t layout;
  const char* version;
  const char* description;  // "CUDA runtime 12040" or "CUDA emulator"
  int (*device_count)(std::string* why);
  std::string (*runtime_info)();
  std::unique_ptr<Backend> (*make_backend)(MemoryTracker* tracker, const CudaBackendOptions& opt);
  uint64_t (*device_available)(MemoryTracker* tracker);
  void (*empty_cache)(MemoryTracker* tracker);
  uint64_t (*cached_bytes)(MemoryTracker* tracker);
  std::unique_ptr<dist::Communicator> (*make_nccl_communicator)(
      std::unique_ptr<dist::Communicator> bootstrap, double timeout_s);
};

// The one symbol the plugin exports: its table, or nullptr with `err` (errlen bytes) saying why
// (another ABI version, layout or project version).
using CudaPluginEntry = const CudaPlugin* (*)(const CudaPluginHost* host, char* err, size_t errlen);

}  // namespace qlft
