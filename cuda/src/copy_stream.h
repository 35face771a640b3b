// The CUDA backend's copy stream (Backend::alloc_pinned / copy_async / wait_copy / sync_copies):
// copies between device memory and page-locked host memory on a second stream, so they run
// beside the kernels on the compute stream instead of between them. A copy waits on an event
// recorded on the compute stream when it is issued (after its producer), and records an event of
// its own (its ticket) that later compute work waits on (its consumer). Pinned blocks come from
// cudaHostAlloc and are counted as host bytes in the tracker.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "core/memory.h"

namespace qlft::cu {

class CopyStream {
 public:
  CopyStream(MemoryTracker* tracker, cudaStream_t compute);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // Buffers made on it are host memory (Buffer's DeviceAllocator interface, so they free
  // through cudaFreeHost); only copy() and the host touch their bytes.
  DeviceAllocator* pinned() { return &pinned_; }
  uint64_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
  void wait(uint64_t ticket);  // the compute stream waits for it
  void sync();                 // the host waits for every copy

 private:
  class PinnedHost final : public DeviceAllocator {
   public:
    explicit PinnedHost(MemoryTracker* t) : tracker_(t) {}
    void* allocate(MemCategory c, size_t bytes, const char* what) override;
    void release(void* p) noexcept override;
    void fill(void* p, uint8_t byte, size_t bytes) override;
    void to_device(void* dst, const void* src, size_t bytes) override;
    void to_host(void* dst, const void* src, size_t bytes) override;
    void copy(void* dst, const void* src, size_t bytes) override;

   private:
    MemoryTracker* tracker_;
    std::mutex mu_;
    std::map<void*, std::pair<MemCategory, size_t>> blocks_;
  };

  // A ticket's event; one recorded again kEvents copies later waits for more (still safe).
  static constexpr int kEvents = 16;
  cudaStream_t compute_, copy_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // the compute stream's point a copy starts after
  cudaEvent_t done_[kEvents] = {};
  uint64_t issued_ = 0;
  PinnedHost pinned_;
};

}  // namespace qlft::cu
