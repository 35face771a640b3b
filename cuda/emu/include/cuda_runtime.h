// The CUDA runtime subset qlft's backend calls, served on the host by the emulator
// (QLFT_CUDA_EMULATE; cuda/emu/src/runtime.cpp). Enum values and signatures mirror CUDA 13's
// headers so the unchanged cuda/src code compiles against this file with g++.
//
// Device memory lives in an arena that is PROT_NONE whenever host code runs: a host dereference
// of a device pointer, a copy in the wrong direction or a use after free faults or fails here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "qlft_emu_device.h"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorGraphExecUpdateFailure = 910,
  cudaErrorUnknown = 999
};
typedef cudaError_t cudaError;

enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrClockRate = 13,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaMemoryAdvise {
  cudaMemAdviseSetReadMostly = 1,
  cudaMemAdviseUnsetReadMostly = 2,
  cudaMemAdviseSetPreferredLocation = 3,
  cudaMemAdviseUnsetPreferredLocation = 4,
  cudaMemAdviseSetAccessedBy = 5,
  cudaMemAdviseUnsetAccessedBy = 6
};

enum cudaMemLocationType {
  cudaMemLocationTypeInvalid = 0,
  cudaMemLocationTypeDevice = 1,
  cudaMemLocationTypeHost = 2
};
struct cudaMemLocation {
  cudaMemLocationType type;
  int id;
};

#define cudaMemAttachGlobal 0x01
#define cudaMemAttachHost 0x02
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

struct qlft_emu_stream;
struct qlft_emu_event;
typedef qlft_emu_stream* cudaStream_t;
typedef qlft_emu_event* cudaEvent_t;

// Stream capture and graphs (cuda/emu/src/graph.cpp).
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
struct qlft_emu_graph;
struct qlft_emu_graph_exec;
struct qlft_emu_graph_node;
typedef qlft_emu_graph* cudaGraph_t;
typedef qlft_emu_graph_exec* cudaGraphExec_t;
typedef qlft_emu_graph_node* cudaGraphNode_t;
enum cudaGraphExecUpdateResult {
  cudaGraphExecUpdateSuccess = 0,
  cudaGraphExecUpdateError = 1,
  cudaGraphExecUpdateErrorTopologyChanged = 2,
  cudaGraphExecUpdateErrorNodeTypeChanged = 3,
  cudaGraphExecUpdateErrorFunctionChanged = 4
};
struct cudaGraphExecUpdateResultInfo {
  cudaGraphExecUpdateResult result;
  cudaGraphNode_t errorNode;
  cudaGraphNode_t errorFromNode;
};

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  size_t sharedMemPerMultiprocessor;
  size_t totalConstMem;
  int l2CacheSize;
  int managedMemory;
  int concurrentManagedAccess;
};

struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
  int maxDynamicSharedSizeBytes;
};

cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);

cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned flags = cudaMemAttachGlobal);
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b);
cudaError_t cudaMemAdvise(const void* p, size_t bytes, cudaMemoryAdvise advice,
                          cudaMemLocation loc);
cudaError_t cudaMemPrefetchAsync(const void* p, size_t bytes, cudaMemLocation loc, unsigned flags,
                                 cudaStream_t s = nullptr);
// Page-locked host memory (host_memory.cpp): plain host memory in the emulator, tracked.
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t s = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
// Takes graph's node parameters into exec where both have the same nodes of the same types
// (kernel nodes: the same function); else cudaErrorGraphExecUpdateFailure, exec unchanged.
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo* info);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
// nodes == nullptr: *count = the graph's node count.
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count);
// The kernel's mangled name (CUDA 12.3+; the emulator reads it from the symbol table).
cudaError_t cudaFuncGetName(const char** name, const void* func);

namespace qlft_emu {

cudaError_t func_set_attribute(const void* f, cudaFuncAttribute a, int v);
cudaError_t func_get_attributes(cudaFuncAttributes* attr, const void* f);
// Chooses the fiber order between synchronization points (tests; the environment variables
// QLFT_EMU_SCHEDULE=forward|reverse|random and QLFT_EMU_SEED set it for a whole process).
void set_schedule(const char* order, uint64_t seed);
// What the runtime was asked to do, per stream (nullptr: the default stream), since the process
// started (api_counts.cpp): the count that tests hold the backend's launch counting against.
// Work recorded into a stream capture counts on the capturing stream (the host submitted it);
// a graph launch counts once in `graphs`, and the work it replays is not counted again.
struct StreamCounts {
  uint64_t kernels = 0, matmuls = 0, memcpys = 0, memsets = 0, graphs = 0;
};
std::map<cudaStream_t, StreamCounts> stream_counts();
std::map<const void*, uint64_t> kernel_counts();  // kernel launches by kernel (all streams)
// The stream timeline (timeline.cpp): while recording, every kernel, matmul, copy and fill is
// placed on a logical clock per stream (one tick each, from its stream's clock; an event keeps
// its stream's clock, a stream waiting on it moves up to it). kind: 0 kernel, 1 matmul, 2 copy,
// 3 fill, 4 graph launch. timeline_record(true) starts afresh; timeline() returns the record.
struct TimelineOp {
  cudaStream_t stream;
  int kind;
  const void* kernel;  // the kernel of a launch, else nullptr
  uint64_t start, end;
};
void timeline_record(bool on);
std::vector<TimelineOp> timeline();
uint64_t pinned_host_bytes();  // cudaHostAlloc'd bytes live now (host_memory.cpp)
// Runs a grid: validates the configuration against the device limits, then every block's
// threads as fibers. Sets the last error (as a launch would) instead of returning it.
void run_grid(const void* f, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
              const std::function<void()>& thread_body);

// The emulated kernel<<<grid, block, smem, stream>>>(args...): arguments are converted to the
// kernel's parameter types once, by value, as the real launch copies them.
// The body owns the converted arguments, so a launch recorded into a stream capture replays
// them as they were when it was captured (a graph's kernel node holds its parameters by value).
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            Args&&... args) {
  auto p = std::make_shared<std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
  run_grid(reinterpret_cast<const void*>(kernel), grid, block, smem, s,
           [kernel, p] { std::apply(kernel, *p); });
}

}  // namespace qlft_emu

// The C++ API's typed overloads (cuda_runtime.h has them too).
template <class T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
template <class T>
cudaError_t cudaMallocManaged(T** p, size_t bytes, unsigned flags = cudaMemAttachGlobal) {
  return cudaMallocManaged(reinterpret_cast<void**>(p), bytes, flags);
}

template <class F>
cudaError_t cudaFuncSetAttribute(F* f, cudaFuncAttribute a, int v) {
  return qlft_emu::func_set_attribute(reinterpret_cast<const void*>(f), a, v);
}
template <class F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F* f) {
  return qlft_emu::func_get_attributes(attr, reinterpret_cast<const void*>(f));
}
