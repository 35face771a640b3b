// The emulated CUDA runtime: one device with H100-like limits, errors as the real runtime names
// them, streams and events executed synchronously. Device memory: device_memory.cpp.
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "emu_internal.h"

namespace qlft_emu {

namespace {

thread_local cudaError_t t_last = cudaSuccess;
int g_device_count = -1;
thread_local int t_device = 0;

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}

std::set<cudaStream_t>& streams() {
  static std::set<cudaStream_t>* s = new std::set<cudaStream_t>;
  return *s;
}
bool valid_stream(cudaStream_t s) {
  if (!s) return true;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  return streams().count(s) != 0;
}

}  // namespace

int device_count() {
  if (g_device_count < 0) {
    const char* e = std::getenv("QLFT_EMU_DEVICE_COUNT");  // 0 emulates a machine without GPU
    g_device_count = e ? std::atoi(e) : 1;
  }
  return g_device_count;
}

bool stream_is_valid(cudaStream_t s) {
  return valid_stream(s);
}

std::recursive_mutex& device_lock() {
  static std::recursive_mutex* m = new std::recursive_mutex;
  return *m;
}

void set_last_error(cudaError_t e) {
  t_last = e;
}

void report(cudaError_t e, const std::string& msg) {
  std::fprintf(stderr, "qlft CUDA emulator: %s: %s [%s]\n", cudaGetErrorName(e), msg.c_str(),
               schedule_description().c_str());
  t_last = e;
}

}  // namespace qlft_emu

using namespace qlft_emu;

cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return ret(cudaErrorInvalidValue);
  *n = device_count();
  if (*n == 0) return ret(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return ret(cudaErrorInvalidDevice);
  t_device = d;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* d) {
  if (!d) return ret(cudaErrorInvalidValue);
  *d = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (!p) return ret(cudaErrorInvalidValue);
  if (d < 0 || d >= device_count()) return ret(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "qlft CUDA emulator (H100 limits)");
  p->totalGlobalMem = kDeviceBytes;
  p->sharedMemPerBlock = kStaticSharedLimit;
  p->sharedMemPerBlockOptin = kSharedOptinLimit;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = kMaxThreadsPerBlock;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->sharedMemPerMultiprocessor = 228 * 1024;
  p->totalConstMem = 65536;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->managedMemory = 1;
  p->concurrentManagedAccess = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (!v) return ret(cudaErrorInvalidValue);
  if (d < 0 || d >= device_count()) return ret(cudaErrorInvalidDevice);
  switch (a) {
    case cudaDevAttrMaxThreadsPerBlock:
      *v = kMaxThreadsPerBlock;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *v = int(kStaticSharedLimit);
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *v = 32;
      return cudaSuccess;
    case cudaDevAttrClockRate:
      *v = 1980000;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *v = 132;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *v = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *v = 0;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *v = int(kSharedOptinLimit);
      return cudaSuccess;
  }
  report(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute not emulated");
  return cudaErrorInvalidValue;
}

cudaError_t cudaDeviceSynchronize() {
  return sync_during_capture(nullptr, "cudaDeviceSynchronize");
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  return t_last;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define QLFT_EMU_NAME(x) \
  case x:                \
    return #x;
    QLFT_EMU_NAME(cudaSuccess)
    QLFT_EMU_NAME(cudaErrorInvalidValue)
    QLFT_EMU_NAME(cudaErrorMemoryAllocation)
    QLFT_EMU_NAME(cudaErrorInvalidConfiguration)
    QLFT_EMU_NAME(cudaErrorInvalidDevicePointer)
    QLFT_EMU_NAME(cudaErrorInvalidMemcpyDirection)
    QLFT_EMU_NAME(cudaErrorInvalidDeviceFunction)
    QLFT_EMU_NAME(cudaErrorNoDevice)
    QLFT_EMU_NAME(cudaErrorInvalidDevice)
    QLFT_EMU_NAME(cudaErrorInvalidResourceHandle)
    QLFT_EMU_NAME(cudaErrorIllegalState)
    QLFT_EMU_NAME(cudaErrorNotReady)
    QLFT_EMU_NAME(cudaErrorIllegalAddress)
    QLFT_EMU_NAME(cudaErrorLaunchOutOfResources)
    QLFT_EMU_NAME(cudaErrorLaunchFailure)
    QLFT_EMU_NAME(cudaErrorNotSupported)
    QLFT_EMU_NAME(cudaErrorStreamCaptureUnsupported)
    QLFT_EMU_NAME(cudaErrorStreamCaptureInvalidated)
    QLFT_EMU_NAME(cudaErrorStreamCaptureUnmatched)
    QLFT_EMU_NAME(cudaErrorStreamCaptureUnjoined)
    QLFT_EMU_NAME(cudaErrorStreamCaptureIsolation)
    QLFT_EMU_NAME(cudaErrorStreamCaptureImplicit)
    QLFT_EMU_NAME(cudaErrorCapturedEvent)
    QLFT_EMU_NAME(cudaErrorStreamCaptureWrongThread)
    QLFT_EMU_NAME(cudaErrorGraphExecUpdateFailure)
    QLFT_EMU_NAME(cudaErrorUnknown)
#undef QLFT_EMU_NAME
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorIllegalState:
      return "the operation is not permitted in the current state";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched:
      return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined:
      return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorGraphExecUpdateFailure:
      return "the graph update was not performed because it included changes which violated "
             "constraints specific to instantiated graph update";
    case cudaErrorUnknown:
      return "unknown error";
  }
  return "unknown error";
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (!s || (flags & ~1u)) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> g(device_lock());
  *s = new qlft_emu_stream{flags, 0, 0};
  streams().insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaStreamCreateWithFlags(s, 0);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!s || !streams().erase(s)) return ret(cudaErrorInvalidResourceHandle);
  capture_stream_destroyed(s);
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!valid_stream(s)) return ret(cudaErrorInvalidResourceHandle);
  return sync_during_capture(s, "cudaStreamSynchronize");
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (!valid_stream(s)) return ret(cudaErrorInvalidResourceHandle);
  return sync_during_capture(s, "cudaStreamQuery");
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!valid_stream(s) || !e) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t err = cudaSuccess;
  if (capture_stream_wait(s, e, &err)) return err == cudaSuccess ? err : ret(err);
  timeline_stream_wait(s, e);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  if (!e) return ret(cudaErrorInvalidValue);
  *e = new qlft_emu_event;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, 0);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e || !valid_stream(s)) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t err = cudaSuccess;
  if (capture_event_record(e, s, &err)) return err == cudaSuccess ? err : ret(err);
  e->t = std::chrono::steady_clock::now();
  e->recorded = true;
  timeline_event_record(e, s);
  e->capture = 0;
  return cudaSuccess;
}
// An event last recorded into a capture that is still open has no completion to wait for.
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  return capture_active(e->capture) ? ret(cudaErrorCapturedEvent) : cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  return capture_active(e->capture) ? ret(cudaErrorCapturedEvent) : cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms) return ret(cudaErrorInvalidValue);
  if (!a || !b) return ret(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return ret(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}
