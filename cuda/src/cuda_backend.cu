// CudaBackend: the Backend interface on one CUDA device.
//
// Tensors made by Backend::alloc live in device memory (BackendMemory below): an operation given
// such arrays runs its kernels and cuBLASLt GEMMs on them in place, on the backend's one stream,
// and returns without waiting for the device. Host arrays (tests, generation, the LoRA tensors
// until they move too) are staged through allocator buffers and copied back, which waits; every
// such byte and wait is counted (transfers(), metrics h2d_bytes / d2h_bytes / device_syncs).
// Frozen base weights are uploaded once and stay resident (cached by QWeight address, shape,
// storage pointer and a content fingerprint).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda_entry.h"
#include "backend/cuda_sizes.h"
#include "backend/op_checks.h"
#include "backend/rope_math.h"
#include "check.h"
#include "core/log.h"
#include "parallel/communicator.h"
#include "gemm.h"
#include "kernels.h"
#include "quant/ggml_types.h"

namespace qlft {

namespace cu {
bool kernels_loadable(std::string* why);  // k_probe.cu
}

namespace {

using cu::GemmOperand;
using cu::TileType;

// Shared with the memory planner's model of this backend (backend/cuda_workspace.cpp).
constexpr int64_t kPanelBytes = kCudaPanelBytes;  // dequantized weight tile
constexpr int64_t kCeLogitsBytes = kCudaCeLogitsBytes;

// A QWeight has no identity of its own: a weight destroyed and another built at the same address
// with its bytes at the same heap address (and the same shape) would find the old device copy.
// The fingerprint (kind, size and 64 evenly spaced 8-byte samples of the bytes) catches that in
// O(1); found by the CUDA emulator's run of test_cuda_ops (issue 17). A weight identity in
// QWeight would make it exact.
uint64_t weight_fingerprint(const QWeight& W) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(uint64_t(W.kind));
  mix(W.ggml_type);
  const size_t n = W.data.size();
  const uint8_t* b = static_cast<const uint8_t*>(W.data.data());
  mix(n);
  if (n >= 8)
    for (size_t i = 0; i < 64; ++i) {
      uint64_t v;
      std::memcpy(&v, b + (n - 8) * i / 63, 8);
      mix(v);
    }
  else
    for (size_t i = 0; i < n; ++i) mix(b[i]);
  return h;
}

struct ResidentWeight {
  const void* host_data = nullptr;
  uint64_t fingerprint = 0;
  int64_t rows = 0, cols = 0;
  cu::DevWeight w;
  DeviceMemory data, scales;
};

// The device memory Backend::alloc hands out: blocks of the caching allocator, registered by
// address so an operation can tell its own device buffers (used in place) from host arrays
// (staged). Copies and fills run on the backend's stream.
class BackendMemory final : public DeviceAllocator {
 public:
  BackendMemory(MemoryTracker* t, const cudaStream_t* s, TransferCounts* moved)
      : tracker_(t), stream_(s), moved_(moved) {}
  ~BackendMemory() = default;

  void* allocate(MemCategory c, size_t bytes, const char* what) override {
    DeviceMemory m(tracker_, c, bytes, what);
    void* p = m.data();
    std::lock_guard<std::mutex> lk(mu_);
    blocks_.emplace(reinterpret_cast<uintptr_t>(p), std::move(m));
    return p;
  }
  void release(void* p) noexcept override {
    std::lock_guard<std::mutex> lk(mu_);
    blocks_.erase(reinterpret_cast<uintptr_t>(p));
  }
  void fill(void* p, uint8_t byte, size_t bytes) override {
    if (bytes) QLFT_CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, *stream_));
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    moved_->host_to_device += bytes;
    QLFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, *stream_));
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    moved_->device_to_host += bytes;
    ++moved_->syncs;
    QLFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, *stream_));
    QLFT_CUDA_CHECK(cudaStreamSynchronize(*stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes)
      QLFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, *stream_));
  }
  // True when [p, p + bytes) lies inside one block this allocator handed out.
  bool holds(const void* p, int64_t bytes) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return false;
    --it;
    return a + uint64_t(std::max<int64_t>(bytes, 0)) <= it->first + it->second.size();
  }

 private:
  MemoryTracker* tracker_;
  const cudaStream_t* stream_;
  TransferCounts* moved_;
  mutable std::mutex mu_;
  std::map<uintptr_t, DeviceMemory> blocks_;
};

// An operand of one operation on the device: the caller's array itself when it lives in this
// backend's memory (nothing copied), else a staged device copy (counted in transfers()).
struct Dev {
  DeviceMemory own;
  void* p = nullptr;
  void* data() const { return p; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  bool staged() const { return own.data() != nullptr; }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(MemoryTracker* tracker, const CudaBackendOptions& o)
      : Backend(tracker, &mem_), opt_(o), mem_(tracker, &stream_, &moved_) {
    QLFT_CUDA_CHECK(cudaSetDevice(o.device));
    QLFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    tile_ = o.gemm_precision == "bf16"   ? TileType::BF16
            : o.gemm_precision == "fp16" ? TileType::F16
                                         : TileType::F32;
    round_ = o.autocast && tile_ != TileType::F32;
    gemm_ = std::make_unique<cu::LtGemm>(tracker, stream_, o.tf32);
  }
  ~CudaBackend() override {
    weights_.clear();
    in_place_ = ResidentWeight();
    gemm_.reset();
    if (stream_) {
      QLFT_CUDA_WARN(cudaStreamSynchronize(stream_));
      QLFT_CUDA_WARN(cudaStreamDestroy(stream_));
    }
  }
  const char* name() const override { return "cuda"; }
  TransferCounts transfers() const override { return moved_; }

  // ---- elementwise glue -----------------------------------------------------------------------

  int device_index() const override { return opt_.device; }
  void* native_stream() const override { return stream_; }
  void copy(float* dst, const float* src, int64_t n) override {
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
  void add(float* y, const float* x, int64_t n) override {
    if (n <= 0) return;
    if (!mine(y, n * 4) || !mine(x, n * 4)) return Backend::add(y, x, n);
    cu::accumulate(y, x, n, stream_);
  }
  void to_16(DType t, const float* src, uint16_t* dst, int64_t n) override {
    if (n <= 0) return;
    if (!mine(src, n * 4) || !mine(dst, n * 2)) return Backend::to_16(t, src, dst, n);
    cu::convert_tile(src, 1, n, n, dst, tile_of(t), stream_);
  }
  void from_16(DType t, const uint16_t* src, float* dst, int64_t n) override {
    if (n <= 0) return;
    if (!mine(src, n * 2) || !mine(dst, n * 4)) return Backend::from_16(t, src, dst, n);
    cu::widen_tile(src, tile_of(t), n, dst, stream_);
  }
  void round_16(DType t, float* x, int64_t n) override {
    if (n <= 0) return;
    if (!mine(x, n * 4)) return Backend::round_16(t, x, n);
    cu::round_through(x, n, tile_of(t), x, stream_);
  }

  // ---- optimizer arithmetic (device arrays; host arrays take the host loops) ------------------

  double sum_squares(const float* x, int64_t n) override {
    if (n <= 0) return 0;
    if (!mine(x, n * 4)) return Backend::sum_squares(x, n);
    DeviceMemory acc = dev(8, MemCategory::Workspace, "sum of squares");
    QLFT_CUDA_CHECK(cudaMemsetAsync(acc.data(), 0, 8, stream_));
    cu::sum_squares(x, n, acc.as<double>(), stream_);
    double s = 0;
    copy_down(&s, acc.data(), 8);
    return s;
  }
  void scale(float* x, int64_t n, float s) override {
    if (n <= 0) return;
    if (!mine(x, n * 4)) return Backend::scale(x, n, s);
    cu::scale(x, n, s, stream_);
  }
  int64_t count_nonfinite(const float* x, int64_t n) override {
    if (n <= 0) return 0;
    if (!mine(x, n * 4)) return Backend::count_nonfinite(x, n);
    DeviceMemory acc = dev(8, MemCategory::Workspace, "non-finite count");
    QLFT_CUDA_CHECK(cudaMemsetAsync(acc.data(), 0, 8, stream_));
    cu::count_nonfinite(x, n, acc.as<unsigned long long>(), stream_);
    unsigned long long c = 0;
    copy_down(&c, acc.data(), 8);
    return int64_t(c);
  }
  void adamw_torch(float* p, float* m, float* v, const float* g, int64_t n,
                   const AdamWTorchCoeffs& c) override {
    if (n <= 0) return;
    if (!mine(p, n * 4) || !mine(m, n * 4) || !mine(v, n * 4) || !mine(g, n * 4))
      return Backend::adamw_torch(p, m, v, g, n, c);
    cu::adamw_torch(p, m, v, g, n, c, stream_);
  }

  // ---- linear ---------------------------------------------------------------------------------

  void linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                  float* xa) override {
    const int64_t M = x.rows, K = W.cols, N = W.rows;
    op_checks::linear(W, x, y.as_const(), "linear_fwd");
    if (M == 0) return;
    Dev X = autocast(in(x, K, MemCategory::Activations, "linear input"), M * K);
    Dev Y = out(y, N, MemCategory::Activations, "linear output");
    matmul_xwt(W, X.as<float>(), M, Y.as<float>());
    if (bias) {
      Dev Bd = in_raw(bias, N * 4, "linear bias");
      cu::add_bias(Y.as<float>(), M, N, N, Bd.as<float>(), stream_);
    }
    if (lora && lora->r > 0) {
      op_checks::lora(*lora);
      const int r = lora->r;
      Dev Ad = lora_operand(in_raw(lora->A, int64_t(r) * K * 4, "lora A"), int64_t(r) * K);
      Dev Bd = lora_operand(in_raw(lora->B, N * r * 4, "lora B"), N * r);
      Dev XA = xa ? out_raw(xa, M * r * 4, MemCategory::Activations, "lora xa")
                  : scratch(M * r * 4, "lora xa");
      lora_down(*lora, X.as<float>(), M, K, Ad.as<float>(), XA.as<float>());
      // y += scale * xa B^T (xa rounded where it enters the GEMM under bf16; kept fp32)
      Dev XAr;
      const void* xap = XA.data();
      if (round_lora_bf16()) {
        XAr = rounded_copy(XA.as<float>(), M * r, "lora xa, rounded");
        xap = XAr.data();
      }
      gemm_->run(M, N, r, lora->scale, f32(xap, r, false), f32(Bd.data(), r, true), 1.f,
                 Y.as<float>(), N);
      if (xa) finish_raw(XA, xa, M * r * 4);
    }
    finish(Y, N, y);
  }

  void linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa, CMatF dy,
                  MatF dx, float* dA, float* dB) override {
    const int64_t M = dy.rows, N = W.rows, K = W.cols;
    op_checks::linear_bwd(W, x, dy, dx.as_const());
    const bool want_dx = dx.data != nullptr;
    if (M == 0) return;
    const bool has_lora = lora && lora->r > 0;
    if (has_lora) op_checks::lora(*lora);
    Dev dY = autocast(in(dy, N, MemCategory::Activations, "linear_bwd dy"), M * N);
    Dev DX;
    if (want_dx) {
      DX = inout(dx, K, MemCategory::Activations, "linear_bwd dx");
      // dx += dy W, panel by panel of W rows (columns of dy).
      DeviceMemory dYh;
      const void* dyp = dY.data();
      if (tile_ != TileType::F32) {
        dYh = dev(M * N * 2, MemCategory::Workspace, "linear_bwd dy (16-bit)");
        cu::convert_tile(dY.as<float>(), M, N, N, dYh.data(), tile_, stream_);
        dyp = dYh.data();
      }
      // A panel of at most kPanelBytes, and no larger than the weight itself.
      const int64_t P = std::min(panel_rows(K), std::max<int64_t>(N, 1));
      DeviceMemory T = dev(P * K * int64_t(cu::tile_elem_bytes(tile_)), MemCategory::Workspace,
                           "linear_bwd weight panel");
      const cu::DevWeight& dw = resident(W);
      const size_t eb = cu::tile_elem_bytes(tile_);
      for (int64_t p0 = 0; p0 < N; p0 += P) {
        const int64_t n = std::min(P, N - p0);
        cu::dequant_rows(dw, nullptr, p0, n, T.data(), tile_, stream_);
        gemm_->run(M, K, n, 1.f, {static_cast<const char*>(dyp) + p0 * eb, tile_, N, false},
                   {T.data(), tile_, K, false}, 1.f, DX.as<float>(), K);
      }
    }
    if (has_lora) {
      const LoraRef& l = *lora;
      const int r = l.r;
      Dev Ad = lora_operand(in_raw(l.A, int64_t(r) * K * 4, "lora A"), int64_t(r) * K);
      Dev Bd = lora_operand(in_raw(l.B, N * r * 4, "lora B"), N * r);
      // g = dy B: [M, r] (rounded under bf16: it only enters the dA and dx GEMMs)
      DeviceMemory G = dev(M * r * 4, MemCategory::Workspace, "lora dy B");
      gemm_->run(M, r, N, 1.f, f32(dY.data(), N, false), f32(Bd.data(), r, false), 0.f,
                 G.as<float>(), r);
      if (round_lora_bf16()) cu::round_through(G.as<float>(), M * r, tile_, G.as<float>(), stream_);
      Dev X;
      const bool need_x = dA || (dB && !xa);
      if (need_x) X = autocast(in(x, K, MemCategory::Activations, "linear_bwd x"), M * K);
      if (dB) {
        Dev XA;
        if (xa) {
          XA = in_raw(xa, M * r * 4, "lora xa");
        } else {
          XA = scratch(M * r * 4, "lora xa");
          lora_down(l, X.as<float>(), M, K, Ad.as<float>(), XA.as<float>());
        }
        XA = lora_operand(std::move(XA), M * r);
        Dev dBd = inout_raw(dB, N * r * 4, "lora dB");
        // dB += scale * dy^T xa
        gemm_->run(N, r, M, l.scale, f32(dY.data(), N, true), f32(XA.data(), r, false), 1.f,
                   dBd.as<float>(), r);
        finish_raw(dBd, dB, N * r * 4);
      }
      if (dA) {
        DeviceMemory XD;
        const float* xin = X.as<float>();
        if (l.dropout_p > 0.f) {
          XD = dev(M * K * 4, MemCategory::Workspace, "lora dropout input");
          cu::dropout_apply(X.as<float>(), M, K, K, 0, l.dropout_p, l.dropout_seed, XD.as<float>(),
                            stream_);
          xin = XD.as<float>();
        }
        Dev dAd = inout_raw(dA, int64_t(r) * K * 4, "lora dA");
        // dA += scale * g^T drop(x)
        gemm_->run(r, K, M, l.scale, f32(G.data(), r, true), f32(xin, K, false), 1.f,
                   dAd.as<float>(), K);
        finish_raw(dAd, dA, int64_t(r) * K * 4);
      }
      if (want_dx) {
        if (l.dropout_p == 0.f) {
          gemm_->run(M, K, r, l.scale, f32(G.data(), r, false), f32(Ad.data(), K, false), 1.f,
                     DX.as<float>(), K);
        } else {
          DeviceMemory Tm = dev(M * K * 4, MemCategory::Workspace, "lora dx");
          gemm_->run(M, K, r, 1.f, f32(G.data(), r, false), f32(Ad.data(), K, false), 0.f,
                     Tm.as<float>(), K);
          cu::dropout_masked_add(DX.as<float>(), K, Tm.as<float>(), M, K, 0, l.dropout_p,
                                 l.dropout_seed, l.scale / (1.f - l.dropout_p), stream_);
        }
      }
    }
    if (want_dx) finish(DX, K, dx);
  }

  // ---- pointwise ----------------------------------------------------------------------------

  void rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) override {
    op_checks::same_shape(x, y.as_const(), "rmsnorm_fwd", "x", "y");
    const int64_t M = x.rows, C = x.cols;
    if (M == 0) return;
    Dev X = in(x, C, MemCategory::Activations, "rmsnorm x");
    Dev Wd = in_raw(w, C * 4, "rmsnorm weight");
    Dev Y = out(y, C, MemCategory::Activations, "rmsnorm y");
    Dev R = rstd ? out_raw(rstd, M * 4, MemCategory::Activations, "rmsnorm rstd")
                 : scratch(M * 4, "rmsnorm rstd");
    cu::rmsnorm_fwd(X.as<float>(), Wd.as<float>(), eps, Y.as<float>(), R.as<float>(), M, C,
                    stream_);
    finish(Y, C, y);
    if (rstd) finish_raw(R, rstd, M * 4);
  }

  void rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) override {
    op_checks::same_shape(x, dy, "rmsnorm_bwd", "x", "dy");
    op_checks::same_shape(x, dx.as_const(), "rmsnorm_bwd", "x", "dx");
    op_checks::rstd_given(rstd);
    const int64_t M = x.rows, C = x.cols;
    if (M == 0) return;
    Dev X = in(x, C, MemCategory::Activations, "rmsnorm x");
    Dev dY = in(dy, C, MemCategory::Activations, "rmsnorm dy");
    Dev DX = inout(dx, C, MemCategory::Activations, "rmsnorm dx");
    Dev Wd = in_raw(w, C * 4, "rmsnorm weight");
    Dev R = in_raw(rstd, M * 4, "rmsnorm rstd");
    cu::rmsnorm_bwd(X.as<float>(), Wd.as<float>(), R.as<float>(), dY.as<float>(), DX.as<float>(), M,
                    C, stream_);
    finish(DX, C, dx);
  }

  void rope(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
            bool adjacent, bool inverse) override {
    op_checks::rope(x.cols, n_heads, head_dim, freqs);
    if (x.rows == 0) return;
    const int64_t W = int64_t(n_heads) * head_dim;
    Dev X = inout(x, W, MemCategory::Activations, "rope x");
    Dev P = in_raw(pos, x.rows * 4, "rope positions");
    cu::rope(X.as<float>(), W, P.as<int32_t>(), inv_freq(freqs), freqs.scale, x.rows, n_heads,
             head_dim, adjacent, inverse, stream_);
    finish(X, W, x);
  }

  void swiglu_fwd(CMatF gate, CMatF up, MatF out_) override {
    op_checks::same_shape(gate, up, "swiglu_fwd", "gate", "up");
    op_checks::same_shape(gate, out_.as_const(), "swiglu_fwd", "gate", "out");
    const int64_t M = gate.rows, C = gate.cols;
    if (M == 0) return;
    Dev G = in(gate, C, MemCategory::Activations, "swiglu gate");
    Dev U = in(up, C, MemCategory::Activations, "swiglu up");
    Dev O = out(out_, C, MemCategory::Activations, "swiglu out");
    cu::swiglu_fwd(G.as<float>(), U.as<float>(), O.as<float>(), M * C, stream_);
    finish(O, C, out_);
  }

  void swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override {
    op_checks::same_shape(gate, up, "swiglu_bwd", "gate", "up");
    op_checks::same_shape(gate, dout, "swiglu_bwd", "gate", "dout");
    op_checks::same_shape(gate, dgate.as_const(), "swiglu_bwd", "gate", "dgate");
    op_checks::same_shape(gate, dup.as_const(), "swiglu_bwd", "gate", "dup");
    const int64_t M = gate.rows, C = gate.cols;
    if (M == 0) return;
    Dev G = in(gate, C, MemCategory::Activations, "swiglu gate");
    Dev U = in(up, C, MemCategory::Activations, "swiglu up");
    Dev D = in(dout, C, MemCategory::Activations, "swiglu dout");
    Dev DG = out(dgate, C, MemCategory::Activations, "swiglu dgate");
    Dev DU = out(dup, C, MemCategory::Activations, "swiglu dup");
    cu::swiglu_bwd(G.as<float>(), U.as<float>(), D.as<float>(), DG.as<float>(), DU.as<float>(),
                   M * C, stream_);
    finish(DG, C, dgate);
    finish(DU, C, dup);
  }

  // ---- attention ------------------------------------------------------------------------------

  void attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out_,
                     float* lse) override {
    check_attn(s, q, k, v, "attention_fwd");
    op_checks::attention_fwd_out(s, q, out_.as_const());
    const int64_t rows = q.rows, Wq = int64_t(s.n_heads) * s.head_dim,
                  Wk = int64_t(s.n_kv_heads) * s.head_dim;
    AttnStage st = stage_attn(s, q, k, v);
    Dev O = out(out_, Wq, MemCategory::Activations, "attention out");
    const int64_t nl = int64_t(s.n_heads) * rows * 4;
    Dev L = lse ? out_raw(lse, nl, MemCategory::Activations, "attention lse")
                : scratch(nl, "attention lse");
    cu::AttnArgs a = args(s, Wq, Wk, st);
    cu::attention_fwd(a, st.Q.as<float>(), st.K.as<float>(), st.V.as<float>(), O.as<float>(),
                      L.as<float>(), stream_);
    finish(O, Wq, out_);
    if (lse) finish_raw(L, lse, nl);
  }

  void attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out_, const float* lse,
                     CMatF dout, MatF dq, MatF dk, MatF dv) override {
    check_attn(s, q, k, v, "attention_bwd");
    op_checks::attention_bwd_grads(q, k, v, out_, dout, dq.as_const(), dk.as_const(), dv.as_const(),
                                   lse);
    const int64_t rows = q.rows, Wq = int64_t(s.n_heads) * s.head_dim,
                  Wk = int64_t(s.n_kv_heads) * s.head_dim;
    AttnStage st = stage_attn(s, q, k, v);
    Dev O = in(out_, Wq, MemCategory::Activations, "attention out");
    Dev dO = autocast(in(dout, Wq, MemCategory::Activations, "attention dout"), rows * Wq);
    Dev L = in_raw(lse, int64_t(s.n_heads) * rows * 4, "attention lse");
    Dev dQ = inout(dq, Wq, MemCategory::Activations, "attention dq");
    Dev dK = inout(dk, Wk, MemCategory::Activations, "attention dk");
    Dev dV = inout(dv, Wk, MemCategory::Activations, "attention dv");
    DeviceMemory delta =
        dev(int64_t(s.n_heads) * rows * 4, MemCategory::Workspace, "attention delta");
    cu::AttnArgs a = args(s, Wq, Wk, st);
    a.round_bf16 = round_lora_bf16();
    cu::attention_bwd(a, st.Q.as<float>(), st.K.as<float>(), st.V.as<float>(), O.as<float>(),
                      L.as<float>(), dO.as<float>(), dQ.as<float>(), dK.as<float>(), dV.as<float>(),
                      delta.as<float>(), stream_);
    finish(dQ, Wq, dq);
    finish(dK, Wk, dk);
    finish(dV, Wk, dv);
  }

  // ---- embedding and head ---------------------------------------------------------------------

  void embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out_) override {
    op_checks::embedding(emb, out_.as_const());
    if (out_.rows == 0) return;
    // Ids in this backend's memory were checked where they were made (the runner's batch).
    if (!mine(tokens, out_.rows * 4)) op_checks::token_ids(tokens, out_.rows, emb.rows);
    Dev T = in_raw(tokens, out_.rows * 4, "embedding tokens");
    Dev O = out(out_, out_.cols, MemCategory::Activations, "embedding out");
    cu::dequant_rows(resident(emb), T.as<int32_t>(), 0, out_.rows, O.data(), TileType::F32,
                     stream_);
    finish(O, out_.cols, out_);
  }

  void head_logits(const QWeight& head, CMatF h, MatF logits) override {
    op_checks::linear(head, h, logits.as_const(), "head_logits");
    if (h.rows == 0) return;
    Dev H = autocast(in(h, h.cols, MemCategory::Activations, "head input"), h.rows * h.cols);
    Dev L = out(logits, head.rows, MemCategory::Activations, "head logits");
    matmul_xwt(head, H.as<float>(), h.rows, L.as<float>());
    finish(L, head.rows, logits);
  }

  // Every row is computed; rows whose target is ignore_index contribute 0 to the loss and the
  // gradient (the kernels mask them), so targets in device memory never come to the host. The
  // loss is summed on the device in row order (the CPU's order): one 16-byte download.
  double linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                              int32_t ignore_index, float grad_scale, MatF dh,
                              int64_t* count) override {
    const int64_t M = h.rows, V = head.rows, H = head.cols;
    op_checks::cross_entropy(head, h, dh.as_const());
    const bool want_dh = dh.data != nullptr;
    if (!mine(targets, M * 4)) op_checks::targets(targets, M, V, ignore_index);
    if (count) *count = 0;
    if (M == 0 || V == 0) return 0.0;
    const int64_t P = panel_rows(H);
    const int64_t Rc = std::clamp<int64_t>(kCeLogitsBytes / (std::min(P, V) * 4), 1, M);
    const size_t eb = cu::tile_elem_bytes(tile_);
    const cu::DevWeight& dw = resident(head);

    Dev Hd = autocast(in(h, H, MemCategory::Activations, "ce hidden"), M * H);
    Dev Tg = in_raw(targets, M * 4, "ce targets");
    Dev DH;
    if (want_dh) DH = inout(dh, H, MemCategory::Activations, "ce hidden grads");
    DeviceMemory Tw =
        dev(std::min(P, V) * H * int64_t(eb), MemCategory::Workspace, "ce head panel");
    DeviceMemory L = dev(Rc * std::min(P, V) * 4, MemCategory::Workspace, "ce logits chunk");
    DeviceMemory Lh;
    if (tile_ != TileType::F32)
      Lh = dev(Rc * std::min(P, V) * 2, MemCategory::Workspace, "ce logits chunk (16-bit)");
    DeviceMemory HCh;
    if (tile_ != TileType::F32) HCh = dev(Rc * H * 2, MemCategory::Workspace, "ce hidden (16-bit)");
    DeviceMemory DHC;
    if (want_dh) DHC = dev(Rc * H * 4, MemCategory::Workspace, "ce hidden grads chunk");
    DeviceMemory Mx = dev(Rc * 4, MemCategory::Workspace, "ce row max");
    DeviceMemory Sm = dev(Rc * 8, MemCategory::Workspace, "ce row sum");
    DeviceMemory TL = dev(Rc * 4, MemCategory::Workspace, "ce target logit");
    DeviceMemory LS = dev(Rc * 4, MemCategory::Workspace, "ce row lse");
    DeviceMemory LT = dev(Rc * 8, MemCategory::Workspace, "ce loss terms");
    DeviceMemory Acc = dev(16, MemCategory::Workspace, "ce loss sum and count");
    QLFT_CUDA_CHECK(cudaMemsetAsync(Acc.data(), 0, 16, stream_));

    for (int64_t c0 = 0; c0 < M; c0 += Rc) {
      const int64_t rc = std::min(Rc, M - c0);
      const float* hc = Hd.as<float>() + c0 * H;
      const int32_t* tc = Tg.as<int32_t>() + c0;
      const void* hin = hc;
      if (tile_ != TileType::F32) {
        cu::convert_tile(hc, rc, H, H, HCh.data(), tile_, stream_);
        hin = HCh.data();
      }
      for (int64_t p0 = 0; p0 < V; p0 += P) {  // pass 1: online log-sum-exp
        const int64_t n = std::min(P, V - p0);
        cu::dequant_rows(dw, nullptr, p0, n, Tw.data(), tile_, stream_);
        gemm_->run(rc, n, H, 1.f, {hin, tile_, H, false}, {Tw.data(), tile_, H, true}, 0.f,
                   L.as<float>(), n);
        cu::ce_merge_panel(L.as<float>(), rc, n, p0, tc, Mx.as<float>(), Sm.as<double>(),
                           TL.as<float>(), stream_);
      }
      cu::ce_finish(Mx.as<float>(), Sm.as<double>(), TL.as<float>(), tc, ignore_index, rc,
                    LS.as<float>(), LT.as<double>(), stream_);
      cu::ce_sum(LT.as<double>(), tc, rc, ignore_index, Acc.as<double>(),
                 reinterpret_cast<unsigned long long*>(Acc.as<double>() + 1), stream_);
      if (!want_dh) continue;
      for (int64_t p0 = 0; p0 < V; p0 += P) {  // pass 2: dh = (softmax - onehot) * s * panel
        const int64_t n = std::min(P, V - p0);
        cu::dequant_rows(dw, nullptr, p0, n, Tw.data(), tile_, stream_);
        gemm_->run(rc, n, H, 1.f, {hin, tile_, H, false}, {Tw.data(), tile_, H, true}, 0.f,
                   L.as<float>(), n);
        cu::ce_grad_panel(L.as<float>(), rc, n, p0, tc, ignore_index, LS.as<float>(), grad_scale,
                          stream_);
        const void* lin = L.data();
        if (tile_ != TileType::F32) {
          cu::convert_tile(L.as<float>(), rc, n, n, Lh.data(), tile_, stream_);
          lin = Lh.data();
        }
        gemm_->run(rc, H, n, 1.f, {lin, tile_, n, false}, {Tw.data(), tile_, H, false},
                   p0 == 0 ? 0.f : 1.f, DHC.as<float>(), H);
      }
      cu::accumulate(DH.as<float>() + c0 * H, DHC.as<float>(), rc * H, stream_);
    }
    if (want_dh) finish(DH, H, dh);
    double acc[2];
    copy_down(acc, Acc.data(), 16);
    unsigned long long n_counted;
    std::memcpy(&n_counted, &acc[1], 8);
    if (count) *count = int64_t(n_counted);
    return acc[0];
  }

 private:
  struct AttnStage {
    Dev Q, K, V, doc, first;
  };

  // ---- operands ---------------------------------------------------------------------------------

  bool mine(const void* p, int64_t bytes) const { return p && mem_.holds(p, bytes); }
  static int64_t extent(CMatF m, int64_t cols) {  // bytes from m.data to its last used element
    return m.rows > 0 ? ((m.rows - 1) * m.stride + cols) * 4 : 0;
  }
  static Dev view(const void* p) {
    Dev d;
    d.p = const_cast<void*>(p);
    return d;
  }
  static Dev owned(DeviceMemory m) {
    Dev d;
    d.p = m.data();
    d.own = std::move(m);
    return d;
  }
  Dev scratch(int64_t bytes, const char* what) {
    return owned(dev(bytes, MemCategory::Workspace, what));
  }
  // The first `cols` columns of m as a compact [rows, cols] device array.
  Dev in(CMatF m, int64_t cols, MemCategory c, const char* what) {
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
  Dev in_raw(const void* p, int64_t bytes, const char* what) {
    if (mine(p, bytes)) return view(p);
    return owned(upload_raw(p, bytes, what));
  }
  // Where an operation writes the first `cols` columns of m (finish() puts them there).
  Dev out(MatF m, int64_t cols, MemCategory c, const char* what) {
    if (m.stride == cols && mine(m.data, extent(m.as_const(), cols))) return view(m.data);
    return owned(dev(m.rows * cols * 4, c, what));
  }
  Dev out_raw(void* p, int64_t bytes, MemCategory c, const char* what) {
    if (mine(p, bytes)) return view(p);
    return owned(dev(bytes, c, what));
  }
  // Read and written (the accumulating gradients).
  Dev inout(MatF m, int64_t cols, MemCategory c, const char* what) {
    if (m.stride == cols && mine(m.data, extent(m.as_const(), cols))) return view(m.data);
    return in(m.as_const(), cols, c, what);
  }
  Dev inout_raw(void* p, int64_t bytes, const char* what) { return in_raw(p, bytes, what); }
  void finish(const Dev& d, int64_t cols, MatF m) {
    if (!d.staged() || m.rows == 0 || cols == 0) return;
    if (mine(m.data, extent(m.as_const(), cols))) {
      QLFT_CUDA_CHECK(cudaMemcpy2DAsync(m.data, size_t(m.stride) * 4, d.data(), size_t(cols) * 4,
                                        size_t(cols) * 4, size_t(m.rows), cudaMemcpyDeviceToDevice,
                                        stream_));
      return;
    }
    download(d.own, cols, m);
  }
  void finish_raw(const Dev& d, void* p, int64_t bytes) {
    if (!d.staged() || bytes == 0) return;
    if (mine(p, bytes)) {
      QLFT_CUDA_CHECK(
          cudaMemcpyAsync(p, d.data(), size_t(bytes), cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    copy_down(p, d.data(), bytes);
  }
  // Autocast (train.precision bf16 / fp16): the operand rounded through the 16-bit type, as
  // torch.autocast rounds a matmul's inputs; a copy, since the caller's tensor is kept as it is.
  Dev autocast(Dev d, int64_t n) {
    if (!round_ || n == 0) return d;
    if (d.staged()) {  // already a private copy: round it in place
      cu::round_through(d.as<float>(), n, tile_, d.as<float>(), stream_);
      return d;
    }
    Dev r = owned(dev(n * 4, MemCategory::Workspace, "autocast copy"));
    cu::round_through(d.as<float>(), n, tile_, r.as<float>(), stream_);
    return r;
  }
  static TileType tile_of(DType t) {
    QLFT_CHECK_ARG(t == DType::BF16 || t == DType::F16, "16-bit storage is BF16 or F16, not %s",
                   dtype_name(t));
    return t == DType::BF16 ? TileType::BF16 : TileType::F16;
  }
  // The table's inverse frequencies on the device, uploaded once per distinct table. Dynamic NTK
  // makes a new table per sequence length (each generated token): past kRopeDeviceTables the
  // cache is emptied after a sync (no queued kernel still reads a freed table).
  const float* inv_freq(const RopeFreqs& f) {
    auto it = inv_freq_.find(f.inv_freq);
    if (it != inv_freq_.end()) return it->second.as<float>();
    if (inv_freq_.size() >= size_t(kRopeDeviceTables)) {
      sync();
      inv_freq_.clear();
    }
    const size_t half = f.inv_freq.size();
    DeviceMemory d(tracker_, MemCategory::Weights, half * 4, "rope frequencies");
    copy_up(d.data(), f.inv_freq.data(), int64_t(half) * 4);
    sync();  // the caller's table may not outlive the call
    return inv_freq_.emplace(f.inv_freq, std::move(d)).first->second.as<float>();
  }

  // ---- staging --------------------------------------------------------------------------------

  DeviceMemory dev(int64_t bytes, MemCategory c, const char* what) {
    return DeviceMemory(tracker_, c, size_t(std::max<int64_t>(bytes, 1)), what);
  }
  // The first `cols` columns of host matrix m into a compact [rows, cols] device array.
  DeviceMemory upload(CMatF m, int64_t cols, MemCategory c, const char* what) {
    DeviceMemory d = dev(m.rows * cols * 4, c, what);
    moved_.host_to_device += uint64_t(m.rows) * uint64_t(std::max<int64_t>(cols, 0)) * 4;
    if (m.rows > 0 && cols > 0)
      QLFT_CUDA_CHECK(cudaMemcpy2DAsync(d.data(), size_t(cols) * 4, m.data, size_t(m.stride) * 4,
                                        size_t(cols) * 4, size_t(m.rows), cudaMemcpyHostToDevice,
                                        stream_));
    return d;
  }
  DeviceMemory upload_raw(const void* p, int64_t bytes, const char* what) {
    DeviceMemory d = dev(bytes, MemCategory::Workspace, what);
    copy_up(d.data(), p, bytes);
    return d;
  }
  // (From pageable host memory the copy has read the source when the call returns.)
  void copy_up(void* d, const void* h, int64_t bytes) {
    moved_.host_to_device += uint64_t(std::max<int64_t>(bytes, 0));
    if (bytes > 0)
      QLFT_CUDA_CHECK(cudaMemcpyAsync(d, h, size_t(bytes), cudaMemcpyHostToDevice, stream_));
  }
  // Synchronous: the host reads the result right after.
  void copy_down(void* h, const void* d, int64_t bytes) {
    moved_.device_to_host += uint64_t(std::max<int64_t>(bytes, 0));
    if (bytes > 0)
      QLFT_CUDA_CHECK(cudaMemcpyAsync(h, d, size_t(bytes), cudaMemcpyDeviceToHost, stream_));
    sync();
  }
  // Compact [rows, cols] device array into the first `cols` columns of host matrix m.
  void download(const DeviceMemory& d, int64_t cols, MatF m) {
    moved_.device_to_host += uint64_t(m.rows) * uint64_t(std::max<int64_t>(cols, 0)) * 4;
    if (m.rows > 0 && cols > 0)
      QLFT_CUDA_CHECK(cudaMemcpy2DAsync(m.data, size_t(m.stride) * 4, d.data(), size_t(cols) * 4,
                                        size_t(cols) * 4, size_t(m.rows), cudaMemcpyDeviceToHost,
                                        stream_));
    sync();
  }
  void sync() {
    ++moved_.syncs;
    QLFT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  static GemmOperand f32(const void* p, int64_t ld, bool trans) {
    return {p, TileType::F32, ld, trans};
  }

  // ---- weights --------------------------------------------------------------------------------

  // The kernels' view of W's kind and shape (data and scales not set).
  static cu::DevWeight describe(const QWeight& W) {
    cu::DevWeight w;
    w.kind = W.kind;
    w.ggml_type = W.ggml_type;
    w.rows = W.rows;
    w.cols = W.cols;
    w.blocksize = W.blocksize;
    if (W.kind == QuantKind::GGML) {
      const GgmlTypeTraits* t = ggml_type_traits(W.ggml_type);
      QLFT_CHECK_ARG(t && t->dequantizable, "cuda backend: unknown GGUF type %u", W.ggml_type);
      if (t->block == 1) {  // plain GGUF F32/F16/BF16 tensors kept as GGML: treat as such
        const GgmlType g = static_cast<GgmlType>(W.ggml_type);
        QLFT_CHECK_ARG(g == GgmlType::F32 || g == GgmlType::F16 || g == GgmlType::BF16,
                       "cuda backend: GGUF type %s is not supported on the device", t->name);
        w.kind = g == GgmlType::F32   ? QuantKind::F32
                 : g == GgmlType::F16 ? QuantKind::F16
                                      : QuantKind::BF16;
      }
    }
    return w;
  }

  // A weight whose storage already lives in this backend's memory (ZeRO-3 over NCCL gathers
  // units there): used in place, never cached (the next gather reuses the memory). A double-
  // quantized NF4 weight's block absmax is decoded into one scratch array that every such weight
  // shares: the stream orders each decode after the previous weight's kernels.
  const cu::DevWeight& in_place(const QWeight& W) {
    auto held = [&](const Buffer& b) {
      QLFT_CHECK_ARG(b.empty() || mem_.holds(b.data(), int64_t(b.size())),
                     "cuda backend: a %s weight is partly in device memory, partly on the host",
                     W.type_name().c_str());
    };
    for (const Buffer* b : {&W.absmax, &W.nested_absmax, &W.nested_code, &W.scb}) held(*b);
    cu::DevWeight& w = in_place_.w;
    w = describe(W);
    w.data = W.data.data();
    w.scales = nullptr;
    if (W.kind == QuantKind::NF4 && !W.double_quant) {
      w.scales = W.absmax.as<float>();
    } else if (W.kind == QuantKind::NF4) {
      const int64_t nb = (W.numel() + W.blocksize - 1) / W.blocksize;
      if (in_place_.scales.size() < size_t(nb) * 4)
        in_place_.scales =
            DeviceMemory(tracker_, MemCategory::Workspace, size_t(nb) * 4, "nf4 absmax (decoded)");
      cu::nf4_absmax_decode(W.absmax.as<uint8_t>(), W.nested_absmax.as<float>(),
                            W.nested_code.as<float>(), W.nested_blocksize, W.nested_offset, nb,
                            in_place_.scales.as<float>(), stream_);
      w.scales = in_place_.scales.as<float>();
    } else if (W.kind == QuantKind::INT8) {
      w.scales = W.scb.as<float>();
    }
    return w;
  }

  const cu::DevWeight& resident(const QWeight& W) {
    if (!W.data.empty() && mem_.holds(W.data.data(), int64_t(W.data.size()))) return in_place(W);
    auto it = weights_.find(&W);
    if (it != weights_.end() && it->second.host_data == W.data.data() &&
        it->second.rows == W.rows && it->second.cols == W.cols &&
        it->second.fingerprint == weight_fingerprint(W))
      return it->second.w;
    ResidentWeight rw;
    rw.host_data = W.data.data();
    rw.fingerprint = weight_fingerprint(W);
    rw.rows = W.rows;
    rw.cols = W.cols;
    cu::DevWeight& w = rw.w;
    w = describe(W);
    rw.data = DeviceMemory(tracker_, MemCategory::Weights, std::max<size_t>(W.data.size(), 1),
                           "device weight");
    copy_up(rw.data.data(), W.data.data(), int64_t(W.data.size()));
    if (W.kind == QuantKind::NF4) {
      const int64_t nb = (W.numel() + W.blocksize - 1) / W.blocksize;
      std::vector<float> am(size_t(std::max<int64_t>(nb, 1)));
      for (int64_t b = 0; b < nb; ++b) am[size_t(b)] = W.nf4_block_absmax(b);
      rw.scales = DeviceMemory(tracker_, MemCategory::Weights, am.size() * 4, "device nf4 absmax");
      copy_up(rw.scales.data(), am.data(), nb * 4);
    } else if (W.kind == QuantKind::INT8) {
      rw.scales = DeviceMemory(tracker_, MemCategory::Weights, std::max<size_t>(W.scb.size(), 1),
                               "device int8 scales");
      copy_up(rw.scales.data(), W.scb.data(), int64_t(W.scb.size()));
    }
    sync();  // the host vectors above go out of scope
    w.data = rw.data.data();
    w.scales = rw.scales.as<float>();
    auto& slot = weights_[&W];
    slot = std::move(rw);
    return slot.w;
  }

  int64_t panel_rows(int64_t cols) const {
    const int64_t eb = int64_t(cu::tile_elem_bytes(tile_));
    return std::max<int64_t>(kCudaPanelMinRows, kPanelBytes / std::max<int64_t>(1, cols * eb));
  }

  // Y [M, N] = X W^T (X fp32 compact [M, K] on the device), panel by panel of W rows.
  void matmul_xwt(const QWeight& W, const float* X, int64_t M, float* Y) {
    const int64_t N = W.rows, K = W.cols;
    const cu::DevWeight& dw = resident(W);
    const void* xin = X;
    DeviceMemory Xh;
    if (tile_ != TileType::F32) {
      Xh = dev(M * K * 2, MemCategory::Workspace, "linear input (16-bit)");
      cu::convert_tile(X, M, K, K, Xh.data(), tile_, stream_);
      xin = Xh.data();
    }
    const int64_t P = std::min(panel_rows(K), std::max<int64_t>(N, 1));
    DeviceMemory T =
        dev(P * K * int64_t(cu::tile_elem_bytes(tile_)), MemCategory::Workspace, "weight panel");
    for (int64_t p0 = 0; p0 < N; p0 += P) {
      const int64_t n = std::min(P, N - p0);
      cu::dequant_rows(dw, nullptr, p0, n, T.data(), tile_, stream_);
      gemm_->run(M, n, K, 1.f, {xin, tile_, K, false}, {T.data(), tile_, K, true}, 0.f, Y + p0, N);
    }
    if (K == 0 && N > 0) QLFT_CUDA_CHECK(cudaMemsetAsync(Y, 0, size_t(M * N) * 4, stream_));
  }

  // xa = drop(x) A^T on the device.
  void lora_down(const LoraRef& l, const float* X, int64_t M, int64_t K, const float* A,
                 float* XA) {
    const float* xin = X;
    DeviceMemory XD;
    if (l.dropout_p > 0.f) {
      XD = dev(M * K * 4, MemCategory::Workspace, "lora dropout input");
      cu::dropout_apply(X, M, K, K, 0, l.dropout_p, l.dropout_seed, XD.as<float>(), stream_);
      xin = XD.as<float>();
    }
    // XD goes back to the cache on return: work queued later on this stream runs after it.
    gemm_->run(M, l.r, K, 1.f, f32(xin, K, false), f32(A, K, true), 0.f, XA, l.r);
  }

  static void check_attn(const AttnShape& s, CMatF q, CMatF k, CMatF v, const char* op) {
    op_checks::attention(s, q, k, v, op);
    if (s.head_dim > cu::kAttnMaxHeadDim)
      throw_error(QLFT_ERR_UNSUPPORTED, "%s: head_dim %d is above the CUDA kernels' %d", op,
                  s.head_dim, cu::kAttnMaxHeadDim);
  }

  AttnStage stage_attn(const AttnShape& s, CMatF q, CMatF k, CMatF v) {
    const int64_t rows = q.rows, Wq = int64_t(s.n_heads) * s.head_dim,
                  Wk = int64_t(s.n_kv_heads) * s.head_dim;
    AttnStage st;
    st.Q = autocast(in(q, Wq, MemCategory::Activations, "attention q"), rows * Wq);
    st.K = autocast(in(k, Wk, MemCategory::Activations, "attention k"), rows * Wk);
    st.V = autocast(in(v, Wk, MemCategory::Activations, "attention v"), rows * Wk);
    if (s.doc_ids) {
      // first[row]: the first position of the same document in this batch element (bounds the
      // key range of a query tile, as on the CPU).
      st.doc = in_raw(s.doc_ids, rows * 4, "attention doc ids");
      st.first = scratch(rows * 4, "attention doc starts");
      cu::doc_first(st.doc.as<int32_t>(), s.batch, s.seq, st.first.as<int32_t>(), stream_);
    }
    return st;
  }

  static cu::AttnArgs args(const AttnShape& s, int64_t Wq, int64_t Wk, const AttnStage& st) {
    cu::AttnArgs a;
    a.batch = s.batch;
    a.seq = s.seq;
    a.n_heads = s.n_heads;
    a.n_kv_heads = s.n_kv_heads;
    a.head_dim = s.head_dim;
    a.ldq = Wq;
    a.ldo = Wq;
    a.ldk = Wk;
    a.ldv = Wk;
    a.doc = st.doc.as<int32_t>();
    a.first = st.first.as<int32_t>();
    return a;
  }
  // Precision bf16 rounds more than the matmul inputs, as the CPU backend does (torch.autocast's
  // bf16 LoRA and SDPA): LoRA's A, B and intermediates xa, g, and attention's P and dS.
  bool round_lora_bf16() const { return round_ && tile_ == TileType::BF16; }
  // A rounded copy of n floats (the original is kept: xa is the caller's fp32 tensor).
  Dev rounded_copy(const float* d, int64_t n, const char* what) {
    Dev r = owned(dev(n * 4, MemCategory::Workspace, what));
    cu::round_through(d, n, tile_, r.as<float>(), stream_);
    return r;
  }
  Dev lora_operand(Dev d, int64_t n) {
    if (round_lora_bf16()) return autocast(std::move(d), n);
    return d;
  }

  CudaBackendOptions opt_;
  cudaStream_t stream_ = nullptr;
  TransferCounts moved_;  // every staging copy and wait counts here
  BackendMemory mem_;     // what alloc() hands out; outlives nothing that uses it (see ~Trainer)
  TileType tile_ = TileType::F32;
  bool round_ = false;  // autocast: 16-bit rounding of matmul and attention operands
  std::unique_ptr<cu::LtGemm> gemm_;
  std::unordered_map<const QWeight*, ResidentWeight> weights_;
  ResidentWeight in_place_;  // the view of the last device-held weight (in_place)
  std::map<std::vector<float>, DeviceMemory> inv_freq_;
};

}  // namespace

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
  cuda_check_precision(opt.device, opt.gemm_precision);
  if (!cu::kernels_loadable(&why))
    throw_error(QLFT_ERR_UNSUPPORTED, "backend=cuda: %s: %s",
                cuda_device_description(opt.device).c_str(), why.c_str());
  QLFT_LOG_I("cuda backend on %s, GEMM precision %s", cuda_device_description(opt.device).c_str(),
             opt.gemm_precision.c_str());
  return std::make_unique<CudaBackend>(tracker, opt);
}

}  // namespace qlft
