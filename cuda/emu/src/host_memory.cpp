// Page-locked host memory (cudaHostAlloc / cudaMallocHost / cudaFreeHost): ordinary host memory
// here, whose blocks are remembered so a free of anything else is refused as the runtime
// refuses it, and counted (pinned_host_bytes) so a test sees what a backend holds.
#include <cstdlib>
#include <map>
#include <mutex>

#include "emu_internal.h"

namespace qlft_emu {
namespace {
struct Pinned {
  std::mutex m;
  std::map<void*, size_t> blocks;
  uint64_t bytes = 0;
};
Pinned& pinned() {
  static Pinned* p = new Pinned;
  return *p;
}
}  // namespace

uint64_t pinned_host_bytes() {
  Pinned& p = pinned();
  std::lock_guard<std::mutex> g(p.m);
  return p.bytes;
}

}  // namespace qlft_emu

using namespace qlft_emu;

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) {
  if (!p || (flags & ~0xfu)) {
    set_last_error(cudaErrorInvalidValue);
    return cudaErrorInvalidValue;
  }
  *p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (!*p) {
    set_last_error(cudaErrorMemoryAllocation);
    return cudaErrorMemoryAllocation;
  }
  Pinned& s = pinned();
  std::lock_guard<std::mutex> g(s.m);
  s.blocks[*p] = bytes;
  s.bytes += bytes;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  Pinned& s = pinned();
  {
    std::lock_guard<std::mutex> g(s.m);
    auto it = s.blocks.find(p);
    if (it == s.blocks.end()) {
      report(cudaErrorInvalidValue, "cudaFreeHost: not a block of cudaHostAlloc / cudaMallocHost");
      return cudaErrorInvalidValue;
    }
    s.bytes -= it->second;
    s.blocks.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}
