// CudaBackend (declared in cuda_backend.h, which lists the files of each operation family):
// construction on one device and stream, the elementwise glue and optimizer arithmetic on device
// arrays, and make_cuda_backend, the entry point that picks and checks the device.
#include "cuda_backend.h"
#include "core/log.h"
#include "core/communicator.h"
#include "core/state_store.h"

namespace qlft {

namespace cu {
bool kernels_loadable(std::string* why);  // k_probe.cu

namespace {
// The GEMM operand (tile) type a run's precision asks for, and its name for the log. (Not
// name_of(Precision): that lives with the settings parser in config/run_spec.cpp, which would bring
// the core's logger into the plugin, whose own logger forwards to the host's: cuda/plugin.)
TileType gemm_tile(Precision p) {
  return p == Precision::BF16   ? TileType::BF16
         : p == Precision::FP16 ? TileType::F16
                                : TileType::F32;
}
const char* tile_name(TileType t) {
  return t == TileType::BF16 ? "bf16" : t == TileType::F16 ? "fp16" : "fp32";
}
}  // namespace

CudaBackend::CudaBackend(MemoryTracker* tracker, const CudaBackendOptions& o)
    : Backend(tracker, &mem_), opt_(o), mem_(tracker, &stream_, &moved_) {
  QLFT_CUDA_CHECK(cudaSetDevice(o.device));
  QLFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  tile_ = gemm_tile(o.spec.precision);
  round_ = o.autocast && tile_ != TileType::F32;
  gemm_ = std::make_unique<LtGemm>(tracker, stream_, o.spec.tf32);
  if (o.spec.graphs || graphs_requested()) graphs_ = std::make_unique<StreamGraphs>(stream_);
}

CudaBackend::~CudaBackend() {
  graphs_.reset();  // what is recorded runs before anything it uses is freed
  weights_.clear();
  in_place_ = ResidentWeight();
  gemm_.reset();
  if (stream_) {
    QLFT_CUDA_WARN(cudaStreamSynchronize(stream_));
    QLFT_CUDA_WARN(cudaStreamDestroy(stream_));
  }
}

// ---- elementwise glue ---------------------------------------------------------------------------

void CudaBackend::copy(float* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  const size_t bytes = size_t(n) * 4;
  const bool d = mine(dst, n * 4), s = mine(src, n * 4);
  if (d && s)
    QLFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  else if (d)
    mem_.to_device(dst, src, bytes);
  else if (s)
    mem_.to_host(dst, src, bytes);
  else
    Backend::copy(dst, src, n);
}
void CudaBackend::add(float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  if (!mine(y, n * 4) || !mine(x, n * 4)) return Backend::add(y, x, n);
  cu::accumulate(y, x, n, stream_);
}
void CudaBackend::to_16(DType t, const float* src, uint16_t* dst, int64_t n) {
  if (n <= 0) return;
  if (!mine(src, n * 4) || !mine(dst, n * 2)) return Backend::to_16(t, src, dst, n);
  cu::convert_tile(src, 1, n, n, dst, tile_of(t), stream_);
}
void CudaBackend::from_16(DType t, const uint16_t* src, float* dst, int64_t n) {
  if (n <= 0) return;
  if (!mine(src, n * 2) || !mine(dst, n * 4)) return Backend::from_16(t, src, dst, n);
  cu::widen_tile(src, tile_of(t), n, dst, stream_);
}
void CudaBackend::round_16(DType t, float* x, int64_t n) {
  if (n <= 0) return;
  if (!mine(x, n * 4)) return Backend::round_16(t, x, n);
  cu::round_through(x, n, tile_of(t), x, stream_);
}

// ---- optimizer arithmetic (device arrays; host arrays take the host loops) --------------------

double CudaBackend::sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0;
  if (!mine(x, n * 4)) return Backend::sum_squares(x, n);
  DeviceMemory acc = dev(8, MemCategory::Workspace, "sum of squares");
  QLFT_CUDA_CHECK(cudaMemsetAsync(acc.data(), 0, 8, stream_));
  cu::sum_squares(x, n, acc.as<double>(), stream_);
  double s = 0;
  copy_down(&s, acc.data(), 8);
  return s;
}
void CudaBackend::scale(float* x, int64_t n, float s) {
  if (n <= 0) return;
  if (!mine(x, n * 4)) return Backend::scale(x, n, s);
  cu::scale(x, n, s, stream_);
}
int64_t CudaBackend::count_nonfinite(const float* x, int64_t n) {
  if (n <= 0) return 0;
  if (!mine(x, n * 4)) return Backend::count_nonfinite(x, n);
  DeviceMemory acc = dev(8, MemCategory::Workspace, "non-finite count");
  QLFT_CUDA_CHECK(cudaMemsetAsync(acc.data(), 0, 8, stream_));
  cu::count_nonfinite(x, n, acc.as<unsigned long long>(), stream_);
  unsigned long long c = 0;
  copy_down(&c, acc.data(), 8);
  return int64_t(c);
}
void CudaBackend::adamw_torch(float* p, float* m, float* v, const float* g, int64_t n,
                              const AdamWTorchCoeffs& c) {
  if (n <= 0) return;
  if (!mine(p, n * 4) || !mine(m, n * 4) || !mine(v, n * 4) || !mine(g, n * 4))
    return Backend::adamw_torch(p, m, v, g, n, c);
  cu::adamw_torch(p, m, v, g, n, c, stream_);
}
void CudaBackend::adamw_torch_to_16(float* p, float* m, float* v, const float* g, int64_t n,
                                    const AdamWTorchCoeffs& c, DType t, uint16_t* p16) {
  if (n <= 0) return;
  if (t != DType::BF16 || !mine(p16, n * 2) || !mine(p, n * 4) || !mine(m, n * 4) ||
      !mine(v, n * 4) || !mine(g, n * 4))
    return Backend::adamw_torch_to_16(p, m, v, g, n, c, t, p16);
  cu::adamw_torch(p, m, v, g, n, c, stream_, p16);
}
// p and g in the backend's memory; the state there or in its managed state store (a GPU would
// fault on host memory, the emulator would not notice).
void CudaBackend::adamw_bnb8(float* p, uint8_t* q1, uint8_t* q2, float* absmax1, float* absmax2,
                             const float* g, int64_t n, const AdamBnbCoeffs& c) {
  if (n <= 0) return;
  const int64_t nb = (n + 255) / 256 * 4;
  auto state = [&](const void* a, int64_t bytes) {
    return mine(a, bytes) || managed_holds(a, bytes);
  };
  if (!mine(p, n * 4) || !mine(g, n * 4) || !state(q1, n) || !state(q2, n) || !state(absmax1, nb) ||
      !state(absmax2, nb))
    return Backend::adamw_bnb8(p, q1, q2, absmax1, absmax2, g, n, c);
  const cu::Bnb8Maps t = cu::bnb8_maps();
  cu::adamw_bnb8(p, q1, q2, absmax1, absmax2, g, n, c, t.code1, t.code2, t.lut1, t.lut2, nullptr,
                 stream_);
}
void CudaBackend::adamw_bnb32(float* p, float* m, float* v, const float* g, int64_t n,
                              const AdamBnbCoeffs& c) {
  if (n <= 0) return;
  auto state = [&](const void* a) { return mine(a, n * 4) || managed_holds(a, n * 4); };
  if (!mine(p, n * 4) || !mine(g, n * 4) || !state(m) || !state(v))
    return Backend::adamw_bnb32(p, m, v, g, n, c);
  cu::adamw_bnb32(p, m, v, g, n, c, nullptr, stream_);
}
std::unique_ptr<StateStore> CudaBackend::managed_state_store() {
  return make_managed_state_store(tracker(), opt_.device, stream_);
}

}  // namespace cu

std::unique_ptr<Backend> make_cuda_backend(MemoryTracker* tracker, const CudaBackendOptions& o) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0)
    throw_error(QLFT_ERR_BACKEND, "backend=cuda: no usable CUDA device (%s)", why.c_str());
  CudaBackendOptions opt = o;
  // As the NCCL communicator picks its device (comm_nccl.cu): one GPU per process of a node.
  if (opt.device < 0) opt.device = dist::detect_launch().local_rank % n;
  QLFT_CHECK_ARG(opt.device >= 0 && opt.device < n, "backend=cuda: device %d of %d", opt.device, n);
  QLFT_CUDA_CHECK(cudaSetDevice(opt.device));
  cuda_check_precision(opt.device, opt.spec.precision);
  if (!cu::kernels_loadable(&why))
    throw_error(QLFT_ERR_UNSUPPORTED, "backend=cuda: %s: %s",
                cuda_device_description(opt.device).c_str(), why.c_str());
  QLFT_LOG_I("cuda backend on %s, GEMM precision %s", cuda_device_description(opt.device).c_str(),
             cu::tile_name(cu::gemm_tile(opt.spec.precision)));
  return std::make_unique<cu::CudaBackend>(tracker, opt);
}

}  // namespace qlft
