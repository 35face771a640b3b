// CudaBackend's copies beside the compute (Backend::alloc_pinned / copy_async / wait_copy /
// sync_copies; the offloaded checkpoints of model/checkpoint_offload.h): a copy stream with
// events and pinned host memory (copy_stream.h), made at first use.
#include "cuda_backend.h"

namespace qlft::cu {

CopyStream& CudaBackend::copies() {
  if (!copies_) copies_ = std::make_unique<CopyStream>(tracker_, stream_);
  return *copies_;
}

Buffer CudaBackend::alloc_pinned(MemCategory c, size_t bytes, const char* what) {
  return Buffer(copies().pinned(), c, bytes, what, BufferInit::Uninit);
}

uint64_t CudaBackend::copy_async(void* dst, const void* src, size_t bytes) {
  const bool to = mine(dst, int64_t(bytes)), from = mine(src, int64_t(bytes));
  QLFT_CHECK_ARG(to != from, "copy_async copies between device memory and pinned host memory");
  (to ? moved_.host_to_device : moved_.device_to_host) += bytes;
  return copies().copy(dst, src, bytes, to ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
}

void CudaBackend::wait_copy(uint64_t ticket) {
  if (copies_) copies_->wait(ticket);
}

void CudaBackend::sync_copies() {
  if (copies_) copies_->sync();
}

}  // namespace qlft::cu
