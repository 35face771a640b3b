// Internals shared by the emulator's runtime (runtime.cpp), device memory (device_memory.cpp),
// launcher (launch.cpp) and cuBLASLt (cublaslt.cpp).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

// A stream and an event (runtime.cpp), with what stream capture (graph.cpp) keeps on them.
struct qlft_emu_stream {
  unsigned flags;
  uint64_t capture = 0;   // the id of the capture this stream records into (0: none)
  uint64_t cap_work = 0;  // nodes it recorded in that capture
};
struct qlft_emu_event {
  std::chrono::steady_clock::time_point t{};
  bool recorded = false;
  uint64_t capture = 0;               // recorded into this capture (0: eagerly, or never)
  cudaStream_t cap_stream = nullptr;  // ... on this stream, after its first cap_work nodes
  uint64_t cap_work = 0;
};

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
// Not counted while a graph replays (graph.cpp's replaying()); Event is never counted.
enum class Api { Kernel, Matmul, Memcpy, Memset, Graph, Event };
void count_api(cudaStream_t s, Api a, const void* kernel = nullptr);
// The stream timeline's hooks (timeline.cpp): an operation accepted on s (from count_api), an
// event recorded on s, s waiting on an event.
void timeline_op(cudaStream_t s, Api a, const void* kernel);
void timeline_event_record(cudaEvent_t e, cudaStream_t s);
void timeline_stream_wait(cudaStream_t s, cudaEvent_t e);

// Stream capture (graph.cpp). Every asynchronous call asks `captured` before it runs: when `s`
// records into a capture, `op` (the same call re-issued on the stream a graph launch names) is
// appended to the capture's graph and counted, and *e is cudaSuccess; a stream whose capture
// was invalidated answers cudaErrorStreamCaptureInvalidated; work on the legacy stream while a
// blocking stream captures invalidates that capture (cudaErrorStreamCaptureImplicit). Returns
// false when the call should run now (no capture, or a graph replaying it).
using GraphOp = std::function<cudaError_t(cudaStream_t)>;
bool captured(cudaStream_t s, Api a, const void* kernel, GraphOp op, cudaError_t* e);
// A call CUDA forbids during a capture in global or thread-local mode (synchronous copies and
// fills, cudaMalloc / cudaFree): cudaErrorStreamCaptureUnsupported, and such captures are
// invalidated; cudaSuccess when allowed.
cudaError_t unsafe_call(const char* what);
// cudaStreamSynchronize / cudaStreamQuery on a capturing stream, cudaDeviceSynchronize during
// any capture: the same error and invalidation.
cudaError_t sync_during_capture(cudaStream_t s, const char* what);
bool replaying();  // a graph launch is re-issuing its recorded calls on this thread
// Event record / wait under capture (runtime.cpp calls these first); false: proceed eagerly.
bool capture_event_record(cudaEvent_t e, cudaStream_t s, cudaError_t* err);
bool capture_stream_wait(cudaStream_t s, cudaEvent_t e, cudaError_t* err);
void capture_stream_destroyed(cudaStream_t s);
bool capture_active(uint64_t id);  // a capture begun and not yet ended (0: none)

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
