// Plain C++ entry points into the CUDA backend library (cuda/). Declared here so cuda/ and its
// tests share them without CUDA headers; defined in qlft_cuda (QLFT_CUDA=ON or the emulated
// build). libqlft itself never calls them directly: it reaches them through the CUDA plugin
// (backend/cuda_plugin.h), whose table forwards to them.
// Pointers called "device" below are CUDA device (or managed) addresses, opaque to src/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/run_spec.h"
#include "core/error.h"
#include "core/memory.h"
#include "backend/adamw_math.h"

namespace qlft {

class StateStore;

// ---- devices ---------------------------------------------------------------------------------

// Number of usable CUDA devices; 0 with *why set (e.g. "no CUDA driver") when there are none.
int cuda_device_count(std::string* why);
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" for device i.
std::string cuda_device_description(int device);

struct CudaDeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  uint64_t total_memory = 0;
  int clock_khz = 0;  // peak SM clock
};
CudaDeviceInfo cuda_device_info(int device);
// "cuda devices=1 device0=NVIDIA H100 ... (sm_90, 79.1 GiB)" or "cuda devices=0 (why)".
std::string cuda_runtime_info();

// Caps the grid of every grid-stride kernel at `blocks` below the hardware's limit (0: no cap,
// the default), process-wide, so a test makes each CUDA block loop several times on small
// shapes; the production launches take the same path with no cap.
void cuda_set_grid_cap(int64_t blocks);

// The backend's launches in order, by kernel name ("k_round16<2>", "cublasLtMatmul"):
// recording starts with cuda_trace_launches(true); cuda_launch_sequence() returns what was
// recorded since and empties the record (a test lists a step's kernels with them).
void cuda_trace_launches(bool on);
std::vector<std::string> cuda_launch_sequence();

// Throws QLFT_ERR_UNSUPPORTED when `precision` cannot run on the device: bf16 tensor-core
// GEMMs need compute capability 8.0; fp16 with loss scaling is offered.
void cuda_check_precision(int device, Precision precision);

// ---- backend ---------------------------------------------------------------------------------

struct CudaBackendOptions {
  // -1: the launcher's local rank modulo the device count (dist::detect_launch; 0 for a single
  // process), so ranks on one node use one GPU each, as the NCCL communicator does.
  int device = -1;
  // The backend's settings as parsed (spec.kind is Cuda): spec.precision FP32 runs fp32 GEMMs (no
  // TF32), the parity mode; BF16 / FP16 dequantize weights into 16-bit tiles and round
  // activations to 16 bits for the base GEMMs (fp32 accumulation); spec.tf32 runs fp32 GEMMs on
  // TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32). A setting added to BackendSpec reaches the
  // CUDA kernels here without further plumbing.
  BackendSpec spec;
  // Autocast training (make_backend sets it with a 16-bit precision): also round the LoRA and
  // attention operands through the 16-bit type, as torch.autocast does (the CPU path's
  // AutocastBackend). Off: only the base GEMMs are 16-bit (the kernel tests' mode).
  bool autocast = false;
};
// Throws QLFT_ERR_BACKEND without a device, QLFT_ERR_UNSUPPORTED for a precision the device
// lacks. Its alloc() hands out device memory: operations on such tensors run in place and do
// not wait; host arrays are staged through device buffers (counted in `tracker` and in
// transfers()). Frozen weights stay resident on the device.
std::unique_ptr<Backend> make_cuda_backend(MemoryTracker* tracker, const CudaBackendOptions& opt);
// Whether that backend's attention runs on the tensor-core (wmma bf16) kernels: precision BF16
// with autocast and head_dim 64, 80, 96 or 128 (else the fp32 flash kernels). The backend and
// the tests that expect either path ask this.
bool cuda_attention_tensor_cores(Precision precision, bool autocast, int head_dim);

// Optimizer state in managed memory (cudaMallocManaged, preferred on the device): the CUDA form
// of the paged store (bitsandbytes' paged optimizers), counted as optimizer memory. The driver
// pages it between device and host; begin(group, next) prefetches the group's arrays (and the
// next group's) to the device on `stream` (a cudaStream_t; nullptr: the default stream), so a
// step that follows on that stream finds them there.
std::unique_ptr<StateStore> make_managed_state_store(MemoryTracker* tracker, int device = 0,
                                                     void* stream = nullptr);

// ---- device memory ---------------------------------------------------------------------------

// A move-only block of device memory from the caching allocator, counted in `tracker` under
// `category`. Throws QLFT_ERR_OUT_OF_MEMORY naming the category and `what`.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(MemoryTracker* tracker, MemCategory category, size_t bytes, const char* what);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& o) noexcept;
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }
  // Synchronous copies of `bytes` (<= size()) from / to host memory.
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  void reset() noexcept;

 private:
  MemoryTracker* tracker_ = nullptr;
  MemCategory cat_ = MemCategory::Workspace;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Device bytes the caching allocator holds for `tracker` (live + cached), and frees cached
// blocks back to the driver.
uint64_t cuda_cached_bytes(MemoryTracker* tracker);
void cuda_empty_cache(MemoryTracker* tracker);
// Device bytes still to be had for `tracker` (the auto-tuner's budget when memory.limit is 0):
// the current device's free memory plus the blocks its cache keeps (returned on demand).
uint64_t cuda_device_available(MemoryTracker* tracker);

// ---- optimizer and loss-scaler kernels (device pointers, synchronous) --------------------------

// torch.optim.AdamW over n elements (adamw_torch_update per element).
void cuda_adamw_torch_step(float* p, float* m, float* v, const float* g, int64_t n,
                           const AdamWTorchCoeffs& c);
// bitsandbytes blockwise 8-bit AdamW (blocks of 256; adam_bnb_8bit_update per element, state
// re-quantized with the dynamic maps). Returns the number of elements skipped (non-finite g).
int64_t cuda_adamw_bnb8_step(float* p, uint8_t* q1, uint8_t* q2, float* absmax1, float* absmax2,
                             const float* g, int64_t n, const AdamBnbCoeffs& c);
// bnb fp32-state path (tensors under 4096 elements). Returns skipped elements.
int64_t cuda_adamw_bnb32_step(float* p, float* m, float* v, const float* g, int64_t n,
                              const AdamBnbCoeffs& c);
// Sum of squares of n gradient values (in double), for the global gradient norm.
double cuda_sum_squares(const float* g, int64_t n);
// g *= s (gradient clipping / unscaling).
void cuda_scale(float* g, int64_t n, float s);
// Number of non-finite values among n (the loss scaler's overflow check).
int64_t cuda_count_nonfinite(const float* g, int64_t n);

}  // namespace qlft
