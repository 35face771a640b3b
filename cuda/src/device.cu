// Device discovery for the CUDA backend. Every runtime call is checked.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "backend/cuda_entry.h"

namespace qlft {

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();  // clear the sticky error so later probes start clean
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA driver reports no devices";
  return n;
}

std::string cuda_device_description(int device) {
  cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess)
    return std::string("device ") + std::to_string(device) + ": " + cudaGetErrorString(e);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace qlft
