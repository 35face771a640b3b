// Internals shared by the emulator's runtime (runtime.cpp), device memory (device_memory.cpp),
// launcher (launch.cpp) and cuBLASLt (cublaslt.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace qlft_emu {

// One lock for everything that opens the device arena: kernels, copies, GEMMs. Device work is
// serialized process-wide (streams are executed in issue order, synchronously).
std::recursive_mutex& device_lock();

// The device arena. Every allocation sits right-aligned (to 256 bytes) before a PROT_NONE guard
// page; addresses are never reused, so a freed allocation stays PROT_NONE forever.
bool is_device(const void* p);                 // inside the arena (live or freed)
bool is_managed(const void* p, size_t bytes);  // inside one managed allocation
// cudaMemPrefetchAsync's traffic since the process began: bytes asked for, and bytes of pages
// that moved (not already at the destination), as a transfer would count them. Tests declare
// it themselves (it is not part of the CUDA API the shim's headers copy).
struct ManagedPrefetchStats {
  uint64_t requested_bytes = 0, to_device_bytes = 0, to_host_bytes = 0;
};
ManagedPrefetchStats managed_prefetch_stats();
constexpr size_t kManagedPage = 4096;
// Checks [p, p+bytes) lies in one live device allocation; "" or the reason it does not.
std::string check_device_range(const void* p, size_t bytes);
// Opens (read/write) every live device allocation, or closes them again. Nested opens count.
void open_device_memory();
void close_device_memory();
struct DeviceOpen {
  DeviceOpen() { open_device_memory(); }
  ~DeviceOpen() { close_device_memory(); }
  DeviceOpen(const DeviceOpen&) = delete;
  DeviceOpen& operator=(const DeviceOpen&) = delete;
};

bool stream_is_valid(cudaStream_t s);  // null (the default stream) or a live stream
void set_last_error(cudaError_t e);
// The guard page after the running launch's dynamic shared memory (named by the fault handler).
void set_shared_guard(const void* guard, size_t smem_bytes);
// Reports an emulator finding (stderr, with the schedule and seed) and records `e`.
void report(cudaError_t e, const std::string& msg);
std::string schedule_description();

int device_count();  // QLFT_EMU_DEVICE_COUNT, default 1

// Counts work the runtime accepted (api_counts.cpp; read with stream_counts / kernel_counts).
enum class Api { Kernel, Matmul, Memcpy, Memset };
void count_api(cudaStream_t s, Api a, const void* kernel = nullptr);

// The (mangled) name of the function or object symbol covering `p` and the offset into it, or
// nullptr (symbols.cpp: read from the .symtab of the object holding `p`).
const char* symbol_name(const void* p, size_t* offset);

// Shared-memory race detection (racecheck.cpp), driven by the launcher: a launch's kernel (whose
// object holds its static __shared__ variables), dynamic shared buffer and thread count, each new
// block, each released __syncthreads, each completed warp operation (lanes first..first+nlanes-1
// of one warp, `mask` over them), the fiber about to run (-1: the scheduler), the launch's end.
// racecheck_enabled (QLFT_EMU_RACECHECK is not 0) is in qlft_emu_device.h.
void racecheck_launch(const void* kernel, void* dyn, size_t dyn_bytes, int nthreads);
void racecheck_block();
void racecheck_barrier();
void racecheck_warp_sync(int first, unsigned mask, int nlanes);
void racecheck_enter(int linear);
void racecheck_end();

// Device limits (H100 SXM).
constexpr size_t kDeviceBytes = size_t(80) << 30;  // what the device reports (H100 80 GB)
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kStaticSharedLimit = 48 * 1024;
constexpr size_t kSharedOptinLimit = 227 * 1024;

}  // namespace qlft_emu
