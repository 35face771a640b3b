// CudaBackend's operands: the caller's arrays used in place when they lie in the backend's
// memory, else staged through allocator buffers (every byte and wait counted), and autocast.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include "cuda_backend.h"

namespace qlft::cu {

Dev CudaBackend::view(const void* p) {
  Dev d;
  d.p = const_cast<void*>(p);
  return d;
}
Dev CudaBackend::owned(DeviceMemory m) {
  Dev d;
  d.p = m.data();
  d.own = std::move(m);
  return d;
}
// The first `cols` columns of m as a compact [rows, cols] device array.
Dev CudaBackend::in(CMatF m, int64_t cols, MemCategory c, const char* what) {
  if (mine(m.data, extent(m, cols))) {
    if (m.stride == cols) return view(m.data);
    DeviceMemory d = dev(m.rows * cols * 4, c, what);
    QLFT_CUDA_CHECK(cudaMemcpy2DAsync(d.data(), size_t(cols) * 4, m.data, size_t(m.stride) * 4,
                                      size_t(cols) * 4, size_t(m.rows), cudaMemcpyDeviceToDevice,
                                      stream_));
    return owned(std::move(d));
  }
  return owned(upload(m, cols, c, what));
}
Dev CudaBackend::in_raw(const void* p, int64_t bytes, const char* what) {
  if (mine(p, bytes)) return view(p);
  return owned(upload_raw(p, bytes, what));
}
// Where an operation writes the first `cols` columns of m (finish() puts them there).
Dev CudaBackend::out(MatF m, int64_t cols, MemCategory c, const char* what) {
  if (m.stride == cols && mine(m.data, extent(m.as_const(), cols))) return view(m.data);
  return owned(dev(m.rows * cols * 4, c, what));
}
Dev CudaBackend::out_raw(void* p, int64_t bytes, MemCategory c, const char* what) {
  if (mine(p, bytes)) return view(p);
  return owned(dev(bytes, c, what));
}
// Read and written (the accumulating gradients).
Dev CudaBackend::inout(MatF m, int64_t cols, MemCategory c, const char* what) {
  if (m.stride == cols && mine(m.data, extent(m.as_const(), cols))) return view(m.data);
  return in(m.as_const(), cols, c, what);
}
void CudaBackend::finish(const Dev& d, int64_t cols, MatF m) {
  if (!d.staged() || m.rows == 0 || cols == 0) return;
  if (mine(m.data, extent(m.as_const(), cols))) {
    QLFT_CUDA_CHECK(cudaMemcpy2DAsync(m.data, size_t(m.stride) * 4, d.data(), size_t(cols) * 4,
                                      size_t(cols) * 4, size_t(m.rows), cudaMemcpyDeviceToDevice,
                                      stream_));
    return;
  }
  download(d.own, cols, m);
}
void CudaBackend::finish_raw(const Dev& d, void* p, int64_t bytes) {
  if (!d.staged() || bytes == 0) return;
  if (mine(p, bytes)) {
    QLFT_CUDA_CHECK(cudaMemcpyAsync(p, d.data(), size_t(bytes), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  copy_down(p, d.data(), bytes);
}
// Autocast (train.precision bf16 / fp16): the operand rounded through the 16-bit type, as
// torch.autocast rounds a matmul's inputs; a copy, since the caller's tensor is kept as it is.
Dev CudaBackend::autocast(Dev d, int64_t n) {
  if (!round_ || n == 0) return d;
  if (d.staged()) {  // already a private copy: round it in place
    cu::round_through(d.as<float>(), n, tile_, d.as<float>(), stream_);
    return d;
  }
  Dev r = owned(dev(n * 4, MemCategory::Workspace, "autocast copy"));
  cu::round_through(d.as<float>(), n, tile_, r.as<float>(), stream_);
  return r;
}
TileType CudaBackend::tile_of(DType t) {
  QLFT_CHECK_ARG(t == DType::BF16 || t == DType::F16, "16-bit storage is BF16 or F16, not %s",
                 dtype_name(t));
  return t == DType::BF16 ? TileType::BF16 : TileType::F16;
}

// A rounded copy of n floats (the original is kept: xa is the caller's fp32 tensor).
Dev CudaBackend::rounded_copy(const float* d, int64_t n, const char* what) {
  Dev r = owned(dev(n * 4, MemCategory::Workspace, what));
  cu::round_through(d, n, tile_, r.as<float>(), stream_);
  return r;
}

// The first `cols` columns of host matrix m into a compact [rows, cols] device array.
DeviceMemory CudaBackend::upload(CMatF m, int64_t cols, MemCategory c, const char* what) {
  DeviceMemory d = dev(m.rows * cols * 4, c, what);
  moved_.host_to_device += uint64_t(m.rows) * uint64_t(std::max<int64_t>(cols, 0)) * 4;
  graph_flush(stream_);  // copies with host memory are not recorded (graph.h)
  if (m.rows > 0 && cols > 0)
    QLFT_CUDA_CHECK(cudaMemcpy2DAsync(d.data(), size_t(cols) * 4, m.data, size_t(m.stride) * 4,
                                      size_t(cols) * 4, size_t(m.rows), cudaMemcpyHostToDevice,
                                      stream_));
  return d;
}
DeviceMemory CudaBackend::upload_raw(const void* p, int64_t bytes, const char* what) {
  DeviceMemory d = dev(bytes, MemCategory::Workspace, what);
  copy_up(d.data(), p, bytes);
  return d;
}
// (From pageable host memory the copy has read the source when the call returns.)
void CudaBackend::copy_up(void* d, const void* h, int64_t bytes) {
  moved_.host_to_device += uint64_t(std::max<int64_t>(bytes, 0));
  graph_flush(stream_);
  if (bytes > 0)
    QLFT_CUDA_CHECK(cudaMemcpyAsync(d, h, size_t(bytes), cudaMemcpyHostToDevice, stream_));
}
// Synchronous: the host reads the result right after.
void CudaBackend::copy_down(void* h, const void* d, int64_t bytes) {
  moved_.device_to_host += uint64_t(std::max<int64_t>(bytes, 0));
  graph_flush(stream_);
  if (bytes > 0)
    QLFT_CUDA_CHECK(cudaMemcpyAsync(h, d, size_t(bytes), cudaMemcpyDeviceToHost, stream_));
  sync();
}
// Compact [rows, cols] device array into the first `cols` columns of host matrix m.
void CudaBackend::download(const DeviceMemory& d, int64_t cols, MatF m) {
  graph_flush(stream_);
  moved_.device_to_host += uint64_t(m.rows) * uint64_t(std::max<int64_t>(cols, 0)) * 4;
  if (m.rows > 0 && cols > 0)
    QLFT_CUDA_CHECK(cudaMemcpy2DAsync(m.data, size_t(m.stride) * 4, d.data(), size_t(cols) * 4,
                                      size_t(cols) * 4, size_t(m.rows), cudaMemcpyDeviceToHost,
                                      stream_));
  sync();
}
void CudaBackend::sync() {
  ++moved_.syncs;
  graph_flush(stream_);
  QLFT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace qlft::cu
