// CudaBackend: the Backend interface on one CUDA device (private to cuda/src).
//
// Tensors made by Backend::alloc live in device memory (BackendMemory below): an operation given
// such arrays runs its kernels and cuBLASLt GEMMs on them in place, on the backend's one stream,
// and returns without waiting for the device. Host arrays (tests, generation, the LoRA tensors
// until they move too) are staged through allocator buffers and copied back, which waits; every
// such byte and wait is counted (transfers(), metrics h2d_bytes / d2h_bytes / device_syncs).
// Frozen base weights are uploaded once and stay resident (cached by QWeight address, shape,
// storage pointer and a content fingerprint).
//
// The class is declared once here and defined by operation family:
//   cuda_backend.cu       construction, elementwise glue, optimizer arithmetic, make_cuda_backend
//   backend_staging.cu    operands: device views of the caller's arrays, host staging, autocast
//   backend_weights.cu    resident / in-place frozen weights, X W^T by dequantized panels
//   backend_linear.cu     linear forward and backward with LoRA
//   backend_pointwise.cu  RMSNorm, RoPE, SwiGLU
//   backend_attention.cu  attention forward and backward
//   backend_decode.cu     generation's positions, greedy argmax, attention over the KV cache
//   backend_head.cu       embedding, head logits, fused linear + cross-entropy (soft-capped too)
//   backend_gemma.cu      Gemma's GeGLU and final logit soft-cap
//   backend_moe.cu        the mixture-of-experts rows: gather, weighted combine, row dots
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda_entry.h"
#include "backend/cuda_sizes.h"
#include "check.h"
#include "copy_stream.h"
#include "gemm.h"
#include "kernels.h"

namespace qlft::cu {

// True when [p, p + bytes) lies in one allocation of a managed state store (allocator.cu).
bool managed_holds(const void* p, int64_t bytes);

// Shared with the memory planner's model of this backend (backend/cuda_workspace.cpp).
constexpr int64_t kPanelBytes = kCudaPanelBytes;  // dequantized weight tile
constexpr int64_t kCeLogitsBytes = kCudaCeLogitsBytes;

// A QWeight has no identity of its own: a weight destroyed and another built at the same address
// with its bytes at the same heap address (and the same shape) would find the old device copy.
// The fingerprint (kind, size and 64 evenly spaced 8-byte samples of the bytes) catches that in
// O(1); found by the CUDA emulator's run of test_cuda_ops (issue 17). A weight identity in
// QWeight would make it exact.
uint64_t weight_fingerprint(const QWeight& W);

struct ResidentWeight {
  const void* host_data = nullptr;
  uint64_t fingerprint = 0;
  int64_t rows = 0, cols = 0;
  DevWeight w;
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
    stamps_[reinterpret_cast<uintptr_t>(p)] = ++clock_;
    return p;
  }
  void release(void* p) noexcept override {
    std::lock_guard<std::mutex> lk(mu_);
    blocks_.erase(reinterpret_cast<uintptr_t>(p));
    stamps_.erase(reinterpret_cast<uintptr_t>(p));
  }
  void fill(void* p, uint8_t byte, size_t bytes) override {
    touch(p);
    if (bytes) QLFT_CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, *stream_));
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    graph_flush(*stream_);  // a graph would read the host bytes later (graph.h)
    touch(dst);
    moved_->host_to_device += bytes;
    QLFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, *stream_));
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    moved_->device_to_host += bytes;
    ++moved_->syncs;
    graph_flush(*stream_);
    QLFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, *stream_));
    QLFT_CUDA_CHECK(cudaStreamSynchronize(*stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    touch(dst);
    if (bytes)
      QLFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, *stream_));
  }
  // A stamp of the block holding p that changes whenever it is made or written through this
  // allocator (the runner's batch arrays are written so), 0 outside its blocks: what an
  // operation keys something derived from those bytes on (attention's document starts).
  uint64_t version(const void* p) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = block_of(p);
    return it == blocks_.end() ? 0 : stamps_.at(it->first);
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
  // The block containing address p, or blocks_.end() (mu_ held).
  std::map<uintptr_t, DeviceMemory>::const_iterator block_of(const void* p) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return blocks_.end();
    --it;
    return a < it->first + it->second.size() ? it : blocks_.end();
  }
  void touch(const void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = block_of(p);
    if (it != blocks_.end()) stamps_[it->first] = ++clock_;
  }

  MemoryTracker* tracker_;
  const cudaStream_t* stream_;
  TransferCounts* moved_;
  mutable std::mutex mu_;
  std::map<uintptr_t, DeviceMemory> blocks_;
  std::map<uintptr_t, uint64_t> stamps_;  // version() of each block
  uint64_t clock_ = 0;
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
  CudaBackend(MemoryTracker* tracker, const CudaBackendOptions& o);
  ~CudaBackend() override;
  const char* name() const override { return "cuda"; }
  TransferCounts transfers() const override {
    TransferCounts t = moved_;
    t.launches = launches_total();  // launch_count.h: every launch of this process
    return t;
  }
  std::vector<KernelLaunches> launch_counts() const override {
    std::vector<KernelLaunches> v;
    for (const LaunchCount& c : cu::launch_counts()) v.push_back({c.name, c.count});
    return v;
  }

  // ---- elementwise glue (cuda_backend.cu) -----------------------------------------------------
  int device_index() const override { return opt_.device; }
  void* native_stream() const override { return stream_; }
  // Offloaded checkpoints' copies on a second stream, pinned host memory (backend_offload.cu).
  Buffer alloc_pinned(MemCategory c, size_t bytes, const char* what) override;
  uint64_t copy_async(void* dst, const void* src, size_t bytes) override;
  void wait_copy(uint64_t ticket) override;
  void sync_copies() override;
  void copy(float* dst, const float* src, int64_t n) override;
  void add(float* y, const float* x, int64_t n) override;
  void to_16(DType t, const float* src, uint16_t* dst, int64_t n) override;
  void from_16(DType t, const uint16_t* src, float* dst, int64_t n) override;
  void round_16(DType t, float* x, int64_t n) override;

  // ---- optimizer arithmetic (cuda_backend.cu; host arrays take the host loops) ------------------
  double sum_squares(const float* x, int64_t n) override;
  void scale(float* x, int64_t n, float s) override;
  int64_t count_nonfinite(const float* x, int64_t n) override;
  void adamw_torch(float* p, float* m, float* v, const float* g, int64_t n,
                   const AdamWTorchCoeffs& c) override;
  // The bf16 copy written by the same kernel (BF16; any other type takes Backend's default).
  void adamw_torch_to_16(float* p, float* m, float* v, const float* g, int64_t n,
                         const AdamWTorchCoeffs& c, DType t, uint16_t* p16) override;
  // The 8-bit state may also lie in managed_state_store()'s memory (allocator.cu).
  void adamw_bnb8(float* p, uint8_t* q1, uint8_t* q2, float* absmax1, float* absmax2,
                  const float* g, int64_t n, const AdamBnbCoeffs& c) override;
  void adamw_bnb32(float* p, float* m, float* v, const float* g, int64_t n,
                   const AdamBnbCoeffs& c) override;
  std::unique_ptr<StateStore> managed_state_store() override;

  // ---- linear (backend_linear.cu) -------------------------------------------------------------
  void linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                  float* xa) override;
  void linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa, CMatF dy,
                  MatF dx, float* dA, float* dB) override;
  // The GEMMs write y16 themselves (takes_input_16's type, no bias or dropout; else Backend's
  // default): the LoRA term first, then each weight panel's GEMM adds x W^T reading it.
  void linear_fwd_to_16(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                        float* xa, DType t, uint16_t* y16) override;
  // Taken where W's dx GEMM is one panel and LoRA (if any) runs on bf16 operands: the LoRA dx
  // GEMM writes dx16, the base GEMM adds dy W reading it.
  bool next_dx_16(DType t, uint16_t* dx16, const QWeight& W, const LoraRef* lora) override;

  // ---- the runner's 16-bit operands (Backend's 16-bit protocol; backend_linear.cu and
  // backend_attention.cu read them) --------------------------------------------------------------
  // At precision bf16 with autocast the GEMMs and the tensor-core attention read bf16 operands:
  // given the runner's stored bf16 copies they take those as they are, with no rounding or
  // conversion kernel between the op that wrote them and the one that reads them.
  bool takes_input_16(DType t) const override {
    return t == DType::BF16 && tile_ == TileType::BF16 && round_;
  }
  void begin_shared_input_16(CMatF x, DType t, const uint16_t* x16) override {
    h16_.x = takes_input_16(t) && x16 ? x.data : nullptr;
    h16_.x16 = h16_.x ? x16 : nullptr;
  }
  void end_shared_input() override { h16_.x = nullptr, h16_.x16 = nullptr; }
  void next_dy_16(DType t, View2<uint16_t> dy16) override {
    if (takes_input_16(t)) h16_.dy16 = dy16;
  }
  // LoRA's xa kept in bf16 (written by its GEMM in linear_fwd, read as it is by linear_bwd).
  bool takes_xa_16(DType t) const override { return takes_input_16(t); }
  void next_xa_16(DType t, uint16_t* xa16) override {
    if (takes_xa_16(t)) h16_.xa16 = xa16;
  }
  void attention_inputs_16(DType t, const uint16_t* q16, const uint16_t* k16,
                           const uint16_t* v16) override {
    if (!takes_input_16(t)) return;
    h16_.q16 = q16, h16_.k16 = k16, h16_.v16 = v16;
  }
  void attention_out_16(DType t, const uint16_t* out16, const uint16_t* dout16) override {
    if (!takes_input_16(t)) return;
    h16_.out16 = out16, h16_.dout16 = dout16;
  }

  // ---- pointwise (backend_pointwise.cu) ---------------------------------------------------------
  void rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) override;
  void rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) override;
  // dx16 written by the same kernel (takes_input_16's type; any other: Backend's default).
  void rmsnorm_bwd_16(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx, DType t,
                      uint16_t* dx16) override;
  void rope(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
            bool adjacent, bool inverse) override;
  void swiglu_fwd(CMatF gate, CMatF up, MatF out_) override;
  void swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override;
  // The 16-bit forms write the bf16 their consumer reads in the same kernel (takes_input_16's
  // type; any other goes through Backend's defaults).
  void rmsnorm_fwd_16(CMatF x, const float* w, float eps, MatF y, float* rstd, DType t,
                      uint16_t* y16) override;
  void add_rmsnorm_fwd_16(MatF x, const float* r, const float* w, float eps, float* rstd, DType t,
                          uint16_t* y16) override;
  void rope_to_16(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
                  bool adjacent, DType t, uint16_t* x16) override;
  void swiglu_fwd_from_16(DType t, const uint16_t* g16, const uint16_t* u16, uint16_t* o16,
                          int64_t rows, int64_t cols) override;
  void swiglu_bwd_to_16(DType t, const uint16_t* g16, const uint16_t* u16, CMatF dout,
                        View2<uint16_t> dg16, View2<uint16_t> du16) override;

  // ---- attention (backend_attention.cu) ---------------------------------------------------------
  void attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out_, float* lse) override;
  void attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out_, const float* lse,
                     CMatF dout, MatF dq, MatF dk, MatF dv) override;
  // The tensor-core kernel writes out16 itself (tensor_cores: else Backend's default).
  void attention_fwd_to_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out_, float* lse,
                           DType t, uint16_t* out16) override;
  // dq / dk rotated back straight into bf16 (k_rope16), dv written in bf16 by the tensor-core
  // kernel (converted on the fp32 kernels' path).
  void attention_bwd_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out_, const float* lse,
                        CMatF dout, const RopeArgs& rope, DType t, View2<uint16_t> dq16,
                        View2<uint16_t> dk16, View2<uint16_t> dv16) override;

  // ---- decoding with a KV cache (backend_decode.cu) ---------------------------------------------
  void positions(int32_t* pos, int n, int32_t start) override;
  int32_t argmax(const float* x, int64_t n) override;
  void attention_decode(const HeadGeometry& g, int window, int past, CMatF q, const float* k_cache,
                        const float* v_cache, MatF out_) override;
  void attention_decode_capped(const HeadGeometry& g, int window, float scale, float softcap,
                               int past, CMatF q, const float* k_cache, const float* v_cache,
                               MatF out_) override;

  // ---- embedding and head (backend_head.cu) -----------------------------------------------------
  void embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out_) override;
  void head_logits(const QWeight& head, CMatF h, MatF logits) override;
  double linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                              int32_t ignore_index, float grad_scale, MatF dh,
                              int64_t* count) override;
  double linear_cross_entropy_capped(const QWeight& head, CMatF h, const int32_t* targets,
                                     int32_t ignore_index, float grad_scale, float cap, MatF dh,
                                     int64_t* count) override;

  // ---- Gemma's ops (backend_gemma.cu; the attention's cap and scale in AttnArgs) ----------------
  bool gemma_ops() const override { return true; }
  void geglu_fwd(CMatF gate, CMatF up, MatF out_) override;
  void geglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override;
  void softcap(MatF x, float cap) override;

  // ---- mixture-of-experts rows (backend_moe.cu, kernels in k_moe.cu) ---------------------------
  void gather_rows(CMatF x, const int32_t* rows, const float* scale, MatF out_) override;
  void combine_rows(CMatF src, const int32_t* pos, const float* w, int k, MatF out_,
                    bool accumulate) override;
  void row_dots(CMatF a, const int32_t* rows, CMatF b, float* out_) override;

 private:
  struct AttnStage {
    Dev Q, K, V, doc, first;
  };

  // ---- operands (backend_staging.cu) ------------------------------------------------------------
  bool mine(const void* p, int64_t bytes) const { return p && mem_.holds(p, bytes); }
  static int64_t extent(CMatF m, int64_t cols) {  // bytes from m.data to its last used element
    return m.rows > 0 ? ((m.rows - 1) * m.stride + cols) * 4 : 0;
  }
  static Dev view(const void* p);
  static Dev owned(DeviceMemory m);
  Dev scratch(int64_t bytes, const char* what) {
    return owned(dev(bytes, MemCategory::Workspace, what));
  }
  // The first `cols` columns of m as a compact [rows, cols] device array.
  Dev in(CMatF m, int64_t cols, MemCategory c, const char* what);
  Dev in_raw(const void* p, int64_t bytes, const char* what);
  // Where an operation writes the first `cols` columns of m (finish() puts them there).
  Dev out(MatF m, int64_t cols, MemCategory c, const char* what);
  Dev out_raw(void* p, int64_t bytes, MemCategory c, const char* what);
  // Read and written (the accumulating gradients).
  Dev inout(MatF m, int64_t cols, MemCategory c, const char* what);
  Dev inout_raw(void* p, int64_t bytes, const char* what) { return in_raw(p, bytes, what); }
  void finish(const Dev& d, int64_t cols, MatF m);
  void finish_raw(const Dev& d, void* p, int64_t bytes);
  // Autocast (train.precision bf16 / fp16): the operand rounded through the 16-bit type, as
  // torch.autocast rounds a matmul's inputs; a copy, since the caller's tensor is kept as it is.
  Dev autocast(Dev d, int64_t n);
  static TileType tile_of(DType t);
  // Precision bf16 rounds more than the matmul inputs, as the CPU backend does (torch.autocast's
  // bf16 LoRA and SDPA): LoRA's A, B and intermediates xa, g, and attention's P and dS.
  bool round_lora_bf16() const { return round_ && tile_ == TileType::BF16; }
  // A rounded copy of n floats (the original is kept: xa is the caller's fp32 tensor).
  Dev rounded_copy(const float* d, int64_t n, const char* what);
  Dev lora_operand(Dev d, int64_t n) {
    if (round_lora_bf16()) return autocast(std::move(d), n);
    return d;
  }

  // ---- staging (backend_staging.cu) -------------------------------------------------------------
  DeviceMemory dev(int64_t bytes, MemCategory c, const char* what) {
    return DeviceMemory(tracker_, c, size_t(std::max<int64_t>(bytes, 1)), what);
  }
  // The first `cols` columns of host matrix m into a compact [rows, cols] device array.
  DeviceMemory upload(CMatF m, int64_t cols, MemCategory c, const char* what);
  DeviceMemory upload_raw(const void* p, int64_t bytes, const char* what);
  // (From pageable host memory the copy has read the source when the call returns.)
  void copy_up(void* d, const void* h, int64_t bytes);
  // Synchronous: the host reads the result right after.
  void copy_down(void* h, const void* d, int64_t bytes);
  // Compact [rows, cols] device array into the first `cols` columns of host matrix m.
  void download(const DeviceMemory& d, int64_t cols, MatF m);
  void sync();
  static GemmOperand f32(const void* p, int64_t ld, bool trans) {
    return {p, TileType::F32, ld, trans};
  }

  // ---- weights (backend_weights.cu) -------------------------------------------------------------
  // The kernels' view of W's kind and shape (data and scales not set).
  static DevWeight describe(const QWeight& W);
  // A weight whose storage already lives in this backend's memory, used in place.
  const DevWeight& in_place(const QWeight& W);
  // W on the device: in place, or its resident copy (uploaded on first use).
  const DevWeight& resident(const QWeight& W);
  // resident(W) for the embedding and head: a plain fp32 matrix is kept in the GEMM tile type
  // when that is 16-bit (train.precision bf16 / fp16), half the bytes; every GEMM reads it as
  // it is, the embedding lookup widens its rows. Any other storage: resident(W).
  const DevWeight& resident16(const QWeight& W);
  int64_t panel_rows(int64_t cols) const {
    const int64_t eb = int64_t(tile_elem_bytes(tile_));
    return std::max<int64_t>(kCudaPanelMinRows, kPanelBytes / std::max<int64_t>(1, cols * eb));
  }
  // Y [M, N] = X W^T (X fp32 compact [M, K] on the device, or X16 already in the tile type),
  // panel by panel of W rows.
  void matmul_xwt(const QWeight& W, const float* X, int64_t M, float* Y,
                  const uint16_t* X16 = nullptr);
  // The runner's 16-bit copy of x where x is the shared input it was handed with (else null).
  const uint16_t* shared_x16(CMatF x) const {
    return h16_.x16 && x.data == h16_.x && x.stride == x.cols ? h16_.x16 : nullptr;
  }
  // n floats converted to the tile type (a LoRA factor or intermediate entering a bf16 GEMM).
  Dev to_tile(const Dev& d, int64_t n, const char* what);
  // linear_bwd's LoRA part on bf16 operands (fp32 accumulation): dyb the 16-bit dy (row stride
  // ldy), x16 the 16-bit x or null (then x is converted).
  // xa16: the runner's bf16 xa (next_xa_16) or null (then xa's fp32 values, else made again).
  // DX: dx (type dxt, fp32 or the tile type) += scale * g A, or = where dx_beta is 0; null: none.
  void lora_bwd16(const LoraRef& l, CMatF x, const uint16_t* x16, const float* xa,
                  const uint16_t* xa16, const void* dyb, int64_t ldy, int64_t M, int64_t N,
                  int64_t K, void* DX, TileType dxt, float dx_beta, float* dA, float* dB);
  // linear_fwd's LoRA part on the 16-bit input x16 (bf16 operands, fp32 accumulation): Y +=
  // scale * (x16 A^T) B^T, the intermediate written in bf16 by its GEMM into xa16 (the runner's,
  // next_xa_16) or scratch; xa (fp32, not null) also written where the caller keeps it.
  // Y of type yt (fp32 or the tile type): Y = beta * Y + scale * (x16 A^T) B^T.
  void lora_fwd16(const LoraRef& l, const uint16_t* x16, int64_t M, int64_t N, int64_t K, void* Y,
                  TileType yt, float beta, float* xa, uint16_t* xa16);
  // A LoRA factor's bf16 operand: its copy p16 (LoraRef::A16 / B16) where that lives in this
  // backend's memory, else p's n values converted.
  Dev lora_factor16(const uint16_t* p16, const float* p, int64_t n, const char* what);
  // linear_cross_entropy over soft-capped logits (cap > 0) or plain ones (cap 0)
  // (backend_head.cu).
  double cross_entropy_panels(const QWeight& head, CMatF h, const int32_t* targets,
                              int32_t ignore_index, float grad_scale, float cap, MatF dh,
                              int64_t* count);

  // ---- LoRA, RoPE table and attention staging ---------------------------------------------------
  // xa = drop(x) A^T on the device (backend_linear.cu).
  void lora_down(const LoraRef& l, const float* X, int64_t M, int64_t K, const float* A, float* XA);
  // The table's inverse frequencies on the device (backend_pointwise.cu).
  const float* inv_freq(const RopeFreqs& f);
  static void check_attn(const AttnShape& s, CMatF q, CMatF k, CMatF v, const char* op);
  // attention_fwd, with out16 (not null) also written by the tensor-core kernel.
  void attention_fwd_to(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out_, float* lse,
                        uint16_t* out16);
  // attention_bwd, with dv16 (not null) written instead of adding into dv where the tensor-core
  // kernel reads the runner's bf16 out (dv then not read or written); converted otherwise.
  void attention_bwd_to(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out_, const float* lse,
                        CMatF dout, MatF dq, MatF dk, MatF dv, uint16_t* dv16);
  AttnStage stage_attn(const AttnShape& s, CMatF q, CMatF k, CMatF v);
  // AttnArgs::first for s.doc_ids (doc: their device copy): made by cu::doc_first once per
  // batch, i.e. again only when doc_ids or its bytes changed (BackendMemory::version; host ids
  // are staged and so derived at every call).
  const int32_t* doc_starts(const AttnShape& s, const Dev& doc);
  static AttnArgs args(const AttnShape& s, int64_t Wq, int64_t Wk, const AttnStage& st);

  CudaBackendOptions opt_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<StreamGraphs> graphs_;  // QLFT_CUDA_GRAPHS=1: stream_ recorded (graph.h)
  TransferCounts moved_;                  // every staging copy and wait counts here
  BackendMemory mem_;  // what alloc() hands out; outlives nothing that uses it (see ~Trainer)
  TileType tile_ = TileType::F32;
  bool round_ = false;         // autocast: 16-bit rounding of matmul and attention operands
  struct Hints16 {             // the runner's 16-bit operands for the next ops (takes_input_16)
    const float* x = nullptr;  // the shared input x16 holds (begin_shared_input_16)
    const uint16_t* x16 = nullptr;
    View2<uint16_t> dy16;      // the next linear_bwd's dy (taken by it)
    uint16_t* xa16 = nullptr;  // the next LoRA linear_fwd / linear_bwd's xa (taken by it)
    uint16_t* dx16 = nullptr;  // the next linear_bwd's dx in bf16 (next_dx_16), of weight dx_w
    const QWeight* dx_w = nullptr;
    const uint16_t *q16 = nullptr, *k16 = nullptr, *v16 = nullptr;  // the next attention's
    const uint16_t *out16 = nullptr, *dout16 = nullptr;             // the next backward's
  } h16_;
  std::unique_ptr<CopyStream> copies_;  // made at its first use (backend_offload.cu)
  CopyStream& copies();
  std::unique_ptr<LtGemm> gemm_;
  std::unordered_map<const QWeight*, ResidentWeight> weights_;
  ResidentWeight in_place_;  // the view of the last device-held weight (in_place)
  std::map<std::vector<float>, DeviceMemory> inv_freq_;
  struct DocStarts {
    const void* doc = nullptr;  // the doc_ids they were made from, while kept
    int batch = 0, seq = 0;
    uint64_t version = 0;
    DeviceMemory first;
  } doc_starts_;
};

}  // namespace qlft::cu
