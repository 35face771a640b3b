#include "copy_stream.h"

#include <cstring>

#include "check.h"
#include "core/error.h"

namespace qlft::cu {

CopyStream::CopyStream(MemoryTracker* tracker, cudaStream_t compute)
    : compute_(compute), pinned_(tracker) {
  QLFT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  QLFT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  for (cudaEvent_t& e : done_)
    QLFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CopyStream::~CopyStream() {
  QLFT_CUDA_WARN(cudaStreamSynchronize(copy_));
  for (cudaEvent_t e : done_)
    if (e) QLFT_CUDA_WARN(cudaEventDestroy(e));
  if (ready_) QLFT_CUDA_WARN(cudaEventDestroy(ready_));
  QLFT_CUDA_WARN(cudaStreamDestroy(copy_));
}

uint64_t CopyStream::copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  // The event after the producer: waited on at once, so ready_ can be recorded again next time.
  QLFT_CUDA_CHECK(cudaEventRecord(ready_, compute_));
  QLFT_CUDA_CHECK(cudaStreamWaitEvent(copy_, ready_, 0));
  if (bytes) QLFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, copy_));
  const uint64_t t = ++issued_;
  QLFT_CUDA_CHECK(cudaEventRecord(done_[t % kEvents], copy_));
  return t;
}

void CopyStream::wait(uint64_t ticket) {
  if (ticket == 0 || ticket > issued_) return;
  // An event recorded again since holds a later copy of the same stream: waiting covers this one.
  QLFT_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_[ticket % kEvents], 0));
}

void CopyStream::sync() {
  QLFT_CUDA_CHECK(cudaStreamSynchronize(copy_));
}

// PinnedHost::allocate / release: allocator.cu (the one place that allocates).

// Host memory: the host touches it directly (no copy stream work is pending on a block whose
// bytes the host writes: Backend::sync_copies comes first).
void CopyStream::PinnedHost::fill(void* p, uint8_t byte, size_t bytes) {
  std::memset(p, byte, bytes);
}
void CopyStream::PinnedHost::to_device(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CopyStream::PinnedHost::to_host(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void CopyStream::PinnedHost::copy(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

}  // namespace qlft::cu
