// Device discovery and properties for the CUDA backend, and the process-wide launch settings
// tests use (the grid cap, the launch trace). Every runtime call is checked.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "backend/cuda_entry.h"
#include "check.h"

namespace qlft {

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();  // clear the sticky error so later probes start clean
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA driver reports no devices";
  return n;
}

CudaDeviceInfo cuda_device_info(int device) {
  cudaDeviceProp p;
  QLFT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  CudaDeviceInfo info;
  info.name = p.name;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.sm_count = p.multiProcessorCount;
  info.total_memory = p.totalGlobalMem;
  QLFT_CUDA_CHECK(cudaDeviceGetAttribute(&info.clock_khz, cudaDevAttrClockRate, device));
  return info;
}

std::string cuda_device_description(int device) {
  try {
    CudaDeviceInfo i = cuda_device_info(device);
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB, %d SMs)", i.name.c_str(), i.cc_major,
                  i.cc_minor, static_cast<double>(i.total_memory) / (1024.0 * 1024 * 1024),
                  i.sm_count);
    return buf;
  } catch (const std::exception& e) {  // not by type: see allocator.cu
    return std::string("device ") + std::to_string(device) + ": " + e.what();
  }
}

std::string cuda_runtime_info() {
  std::string why;
  const int n = cuda_device_count(&why);
  std::string s = "cuda devices=" + std::to_string(n);
  if (n == 0) return s + " (" + why + ")";
  for (int i = 0; i < n; ++i) s += " device" + std::to_string(i) + "=" + cuda_device_description(i);
  return s;
}

void cuda_check_precision(int device, Precision precision) {
  const CudaDeviceInfo i = cuda_device_info(device);
  if (precision == Precision::BF16 && i.cc_major < 8)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "train.precision=bf16 needs a GPU of compute capability 8.0 or newer, but %s is "
                "sm_%d%d; use train.precision=fp16 (with loss scaling) or fp32",
                i.name.c_str(), i.cc_major, i.cc_minor);
}

namespace {
std::atomic<int64_t> g_grid_cap{0};
}  // namespace

void cuda_set_grid_cap(int64_t blocks) {
  g_grid_cap.store(blocks > 0 ? blocks : 0, std::memory_order_relaxed);
}

void cuda_trace_launches(bool on) {
  cu::trace_launches(on);
}

std::vector<std::string> cuda_launch_sequence() {
  return cu::launch_sequence();
}

namespace cu {
int64_t grid_cap_override() {
  return g_grid_cap.load(std::memory_order_relaxed);
}
}  // namespace cu

}  // namespace qlft
