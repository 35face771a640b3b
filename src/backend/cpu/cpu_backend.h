// The CPU backend: OpenBLAS sgemm on dequantized weight panels, OpenMP over rows and heads.
// Internal header shared by the cpu_*.cpp files; users go through make_cpu_backend().
//
// Determinism: every reduction runs in an order that depends only on the shapes (rows, panels,
// heads are split into fixed-size blocks, each block is one task computed sequentially, and
// cross-block sums run in block order), so results are identical across runs and across thread
// counts, given that OpenBLAS sgemm partitions M/N (not K) among its threads.
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>

#include "backend/backend.h"
#include "backend/cpu/amx_gemm.h"
#include "core/dtype.h"

namespace qlft::cpu {

// Block sizes. Defaults suit real models; tests shrink them to reach every loop edge with small
// shapes. Results do not depend on them beyond float rounding.
struct CpuTuning {
  // Weight rows dequantized at once: about panel_bytes of floats, clamped to the row range.
  // sgemm re-packs x for every panel, so small panels cost throughput (measured single-thread
  // on x [1024, 2048]: 256-row panels about 20% slower than 1024-row ones).
  int64_t panel_bytes = int64_t(16) << 20;
  int64_t panel_min_rows = 64, panel_max_rows = 1024;
  int64_t drop_chunk_bytes = int64_t(4) << 20;  // materialized LoRA dropout input
  int64_t ce_logits_bytes = int64_t(8) << 20;   // cross-entropy logits tile
  int64_t ce_hidden_bytes = int64_t(16) << 20;  // cross-entropy gathered hidden rows
  int64_t attn_block_q = 128;                   // query rows per attention task
  // Rows per step of the causal staircase in a task's diagonal block (cpu_attention.cpp:
  // for_stairs; 0 or >= attn_block_q: whole tiles): smaller steps skip more masked keys in
  // more, smaller GEMM calls. attn_stair_rows for the fp32 GEMM engines (fp32, bf16 on sgemm);
  // attn_stair_rows_bf16 for oneDNN's bf16 tiles (AVX512-BF16, AMX), whole until measured there:
  // an AMX call costs more against its FLOPs (bench_kernels attention_fwd|bwd's stair argument).
  int64_t attn_stair_rows = 64;
  int64_t attn_stair_rows_bf16 = 0;
  // With precision bf16, which GEMM runs the bf16 operands: Auto = oneDNN when the CPU has
  // native bf16 dot products (gemm_bf16_native()), else OpenBLAS sgemm on the bf16 values
  // widened to fp32 (same products, same fp32 accumulation; only the summation order differs).
  enum class Bf16Gemm : uint8_t { Auto, OneDnn, Sgemm };
  Bf16Gemm bf16_gemm = Bf16Gemm::Auto;
  // Keep the big per-call scratch of the linear layers (weight panels, rounded activations,
  // oneDNN's scratchpad) between calls instead of allocating it each call: a fresh large Buffer
  // is fresh mmap pages, and faulting them in is a visible part of a step. Off by default: the
  // backend's contract (tests, train/planner.cpp) is that workspace is released after each call;
  // kept buffers stay counted as workspace until release_scratch() or the backend's end.
  bool reuse_scratch = false;
  // The fp32 x W^T GEMMs (forward of the linear layers and the head's logits, including the
  // bf16-rounded operands of precision bf16 on the sgemm path) on oneDNN's fp32 matmul instead
  // of OpenBLAS: measured 7-16% more GFLOP per CPU-second at M 512, N/K 576..1536 on a Cascade
  // Lake. The dx (x W) GEMMs stay on OpenBLAS, which is faster there.
  bool f32_xwt_onednn = true;
  // The fp32 LoRA products with r output columns (xa = x A^T, g = dy B: OpGemm::gemm_thin) or r
  // output rows (dA = s g^T x and dB^T = s xa^T dy: OpGemm::gemm_grad; dB is then added
  // transposed from an [r, N] scratch) on oneDNN's fp32 matmul too. Measured at M 2048, r 16,
  // K / N 576 and 1536 on a Sapphire Rapids guest capped at AVX512_CORE_VNNI, GFLOP per
  // CPU-second against OpenBLAS: xa, g 1.6-1.8x, dA 1.45x, dB 1.25x (OpenBLAS packs the whole
  // wide operand for 16 rows or columns of output).
  bool f32_thin_onednn = true;
  // Precision bf16: the LoRA gradient dB as dB^T = s xa^T dy ([r, N], the narrow xa the
  // transposed operand) added transposed, as the fp32 oneDNN path does, instead of
  // dB = s dy^T xa (the wide dy transposed, [N, r]). The same bf16 products in another order.
  // Off until measured on AMX, where oneDNN copies a transposed operand before its tiles (an A/B
  // knob for QLFT_CPU_TUNE: the op profile's linear_bwd/lora_grads).
  bool bf16_lora_db_rows = false;
  // fp32 attention's tile products with a plain left operand (Q K^T, P V, dO V^T, dS K:
  // OpGemm::gemm_tile) on oneDNN's fp32 matmul, on the strided q / k / v / dout as they are;
  // each tile's first key is then rounded down to a multiple of attn_block_q (the keys added are
  // other documents', masked) so that packed documents give few shapes to create primitives for.
  // The transposed-left products (dK, dV) stay on OpenBLAS, as fast there. Measured on the capped
  // Sapphire Rapids guest at batch 4 x 512, 9 heads (3 KV) of 64: forward -17%, backward -8%
  // CPU time.
  bool f32_attn_onednn = true;
  // Attention's tiles run with subnormals flushed to zero (FTZ / DAZ, core/fp_env.h) on their
  // threads. Measured on an Emerald Rapids guest (e2e.sh, SmolLM2): the fp32 backward (capped
  // to AVX-512) took half the time against the step's GEMMs, the AMX bf16 one about a fifth less.
  bool flush_denormals = true;
  // Precision bf16: attention's tile products on hand-written AMX tiles (amx_gemm.h,
  // cpu_attention_amx.cpp: K and V packed once per head for all its query blocks, causal 32 x 32
  // blocks skipped) instead of oneDNN's matmul, which repacks its B operand on every call and
  // ran the bf16 attention at about a quarter of the GEMM peak on an Emerald Rapids host. On: where
  // the CPU has AMX (elsewhere the tiles above). Emulated: the same code with the six tile
  // instructions done in C++, on any CPU (slow; how tests run it without AMX). Off until measured
  // on an AMX host.
  enum class AttnAmx : uint8_t { Off, On, Emulated };
  AttnAmx attn_amx = AttnAmx::Off;
  // The library under sgemm() (the fp32 GEMMs not routed above: dx = dy W, the head's dh, the
  // LoRA merge, dK and dV, and all of them when the flags above are off). Auto = OpenBLAS, unless
  // the kernels it chose are older than the CPU (f32_blas.h: f32_blas_onednn_auto), then oneDNN's
  // dnnl_sgemm. Measured on a Zen 3, where OpenBLAS knows the CPU: dnnl_sgemm equal at the
  // layers' shapes (170-188 GFLOP/s both on 2 threads), so Auto keeps OpenBLAS where it fits.
  enum class F32Blas : uint8_t { Auto, OpenBlas, OneDnn };
  F32Blas f32_blas = F32Blas::Auto;
};

// Developer overrides of t from QLFT_CPU_TUNE ("name=value,..."; the fields above by name, bools
// as 0 / 1, bf16_gemm, f32_blas and attn_amx as their enumerators in lower case: auto, onednn,
// sgemm, openblas; off, on, emulated), for A/B runs of a setting on a lent machine without a
// rebuild. Not a user setting: the defaults are what the benchmarks chose. Throws
// QLFT_ERR_INVALID_ARGUMENT naming an unknown name or a bad value, leaving t as it was.
void apply_tuning_env(CpuTuning& t, const char* spec);
// The defaults with QLFT_CPU_TUNE applied: what make_cpu_backend's backends run and the memory
// planner's workspace model (cpu_workspace.cpp) predicts.
CpuTuning tuning_from_env();
// The AMX tiles' execution for attention under tuning t at precision bf16 (t.attn_amx and the
// CPU), or none (the oneDNN / sgemm tiles); what the backend runs and the workspace model counts.
std::optional<AmxExec> attn_amx_exec(const CpuTuning& t, bool bf16);

// The reusable scratch buffers of CpuBackend (one of each kind in use at a time).
// Count as a slot: a buffer of the call's own (small operands).
enum class Scratch : int { Panel, In, Out, Attn, GemmPad, Count };

// Memory for one call: a kept slot of the backend, or (slot busy / reuse off) an own Buffer.
// Not zeroed when reused: users overwrite what they read.
class ScratchLease {
 public:
  ScratchLease() = default;
  ScratchLease(ScratchLease&& o) noexcept { *this = std::move(o); }
  ScratchLease& operator=(ScratchLease&& o) noexcept;
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  ~ScratchLease() { release(); }
  void* data() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  void release();

 private:
  friend class CpuBackend;
  Buffer own_;
  void* p_ = nullptr;
  std::atomic<bool>* busy_ = nullptr;
};

// An lp matrix holds bf16 bit patterns (uint16_t) when the GEMMs run on oneDNN, or fp32 values
// already rounded to bf16 when they run on sgemm; lp_bytes() is its element size.
struct LpMat {
  ScratchLease buf;
  int64_t rows = 0, cols = 0;
  int64_t ld = 0;  // row stride: cols, or more where columns were asked for beyond them
  bool bf16 = false;
  const void* view = nullptr;  // borrowed bf16 values (Backend::begin_shared_input_16), no buf
  const void* data() const { return view ? view : buf.data(); }
};

class CpuBackend final : public Backend {
 public:
  CpuTuning tune;
  BackendSpec spec;  // the run's backend settings (make_cpu_backend)

  explicit CpuBackend(MemoryTracker* tracker, const BackendSpec& s = {})
      : Backend(tracker), spec(s) {}
  const char* name() const override { return "cpu"; }

  // Compute precision of the linear layers and the head (DType::F32 or DType::BF16). With BF16
  // the GEMMs of linear_fwd/linear_bwd (base weight: y and dx), head_logits and
  // linear_cross_entropy (logits and dh) take bf16 operands: activations, incoming gradients,
  // dequantized base weights and the cross-entropy's dlogits are rounded to bf16, products
  // accumulate in fp32. The LoRA GEMMs take bf16 operands too (x, dy, A, B, and their fp32
  // intermediates xa and g rounded where they enter the next GEMM; fp32 master weights, see
  // cpu_linear.cpp); everything else (norms, softmax, attention, outputs) stays fp32. This is
  // what bf16 autocast defines, with the base weights rounded as torch.autocast rounds them.
  void set_precision(DType t);
  DType precision() const { return precision_; }
  // True when the bf16 GEMMs run on oneDNN (per tune.bf16_gemm and the CPU).
  bool bf16_onednn() const;

  void linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                  float* xa) override;
  void linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa, CMatF dy,
                  MatF dx, float* dA, float* dB) override;
  // Precision bf16 on oneDNN, t bf16, the fused LoRA path (or no LoRA), no bias: the GEMM writes
  // y16 (gemm_bf16_out16), y untouched. Otherwise Backend's default.
  void linear_fwd_to_16(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                        float* xa, DType t, uint16_t* y16) override;

  void begin_shared_input(CMatF x) override;
  void end_shared_input() override;
  // With precision bf16 the GEMM inputs come from x16 (borrowed as they are where no columns
  // are added, else copied with them).
  void begin_shared_input_16(CMatF x, DType t, const uint16_t* x16) override;
  // Precision bf16: the next linear_bwd's first dx GEMM runs with beta 0.
  bool defer_zero(float* dx, int64_t n) override;
  void attention_inputs_16(DType t, const uint16_t* q16, const uint16_t* k16,
                           const uint16_t* v16) override {
    if (takes_input_16(t)) attn16_ = {q16, k16, v16};
  }
  bool takes_input_16(DType t) const override {
    return t == DType::BF16 && precision_ == DType::BF16;
  }
  void rmsnorm_fwd_16(CMatF x, const float* w, float eps, MatF y, float* rstd, DType t,
                      uint16_t* y16) override;
  // A row at a time: the add, the norm into a row buffer, its rounding.
  void add_rmsnorm_fwd_16(MatF x, const float* r, const float* w, float eps, float* rstd, DType t,
                          uint16_t* y16) override;
  void swiglu_fwd_16(MatF gate, MatF up, MatF out, DType t, uint16_t* g16, uint16_t* u16,
                     uint16_t* o16, bool keep_rounded) override;
  // A row at a time: gate and up widened into row buffers, SwiGLU, its rounding.
  void swiglu_fwd_from_16(DType t, const uint16_t* g16, const uint16_t* u16, uint16_t* o16,
                          int64_t rows, int64_t cols) override;
  void swiglu_bwd_16(MatF gate, MatF up, DType t, const uint16_t* g16, const uint16_t* u16,
                     CMatF dout, MatF dgate, MatF dup) override;
  // Precision bf16: fused_width(W.rows, r, ...) where linear_bwd takes the fused dx GEMM (room for
  // its columns), else W.rows (the stride of the dy copy it would make itself).
  int64_t grad_16_stride(const QWeight& W, const LoraRef* lora) const override;
  void next_dy_16(DType t, View2<uint16_t> dy16) override {
    dy16_ = takes_input_16(t) ? dy16 : View2<uint16_t>();
  }
  // Where linear_bwd takes the fused dx GEMM on oneDNN: that GEMM writes dx16 (beta 0).
  bool next_dx_16(DType t, uint16_t* dx16, const QWeight& W, const LoraRef* lora) override;
  void swiglu_bwd_to_16(DType t, const uint16_t* g16, const uint16_t* u16, CMatF dout,
                        View2<uint16_t> dg16, View2<uint16_t> du16) override;
  void attention_bwd_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out, const float* lse,
                        CMatF dout, const RopeArgs& rope, DType t, View2<uint16_t> dq16,
                        View2<uint16_t> dk16, View2<uint16_t> dv16) override;

  void rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) override;
  void rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) override;
  void rope(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
            bool adjacent, bool inverse) override;
  // One pass: each row rotated in a row buffer of the thread's and rounded (x untouched).
  void rope_to_16(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
                  bool adjacent, DType t, uint16_t* x16) override;
  void swiglu_fwd(CMatF gate, CMatF up, MatF out) override;
  void swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override;
  // Gemma's ops (cpu_gemma.cpp; attention's soft-cap in the attention tiles).
  bool gemma_ops() const override { return true; }
  void geglu_fwd(CMatF gate, CMatF up, MatF out) override;
  void geglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override;
  void softcap(MatF x, float cap) override;
  // The two-walk cross-entropy (cross_entropy_stats, cross_entropy_grad) with ce_softcap_ set.
  double linear_cross_entropy_capped(const QWeight& head, CMatF h, const int32_t* targets,
                                     int32_t ignore_index, float grad_scale, float cap, MatF dh,
                                     int64_t* count) override;

  void attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out, float* lse) override;
  // Precision bf16: each task's dense output tile rounded into out16's rows (out untouched).
  void attention_fwd_to_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out, float* lse,
                           DType t, uint16_t* out16) override;
  // Precision bf16: D_i's out rows widened from out16.
  void attention_out_16(DType t, const uint16_t* out16, const uint16_t* dout16) override {
    if (takes_input_16(t)) attn_out16_ = {out16, dout16};
  }
  void attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out, const float* lse,
                     CMatF dout, MatF dq, MatF dk, MatF dv) override;
  // Generation's attention over its KV cache (cpu_decode.cpp): a plain loop per (row, head).
  void attention_decode(const HeadGeometry& g, int window, int past, CMatF q, const float* k_cache,
                        const float* v_cache, MatF out) override;
  void attention_decode_capped(const HeadGeometry& g, int window, float scale, float softcap,
                               int past, CMatF q, const float* k_cache, const float* v_cache,
                               MatF out) override;

  void embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out) override;
  void head_logits(const QWeight& head, CMatF h, MatF logits) override;
  double linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                              int32_t ignore_index, float grad_scale, MatF dh,
                              int64_t* count) override;
  void cross_entropy_stats(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                           const int32_t* targets, int32_t ignore_index,
                           CrossEntropyRow* st) override;
  void cross_entropy_grad(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                          const int32_t* targets, int32_t ignore_index, const float* lse,
                          float grad_scale, MatF dh) override;
  int cross_entropy_walks() const override { return 1; }
  void cross_entropy_walk(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                          const int32_t* targets, int32_t ignore_index, float grad_scale,
                          CrossEntropyRow* st, float* acc, MatF dh) override;
  // With dh over the whole head: pass 1's states into st and dh in one walk (the loss from st is
  // pass 1's, bit for bit).
  void cross_entropy_one_walk(const QWeight& head, CMatF h, const int32_t* targets,
                              int32_t ignore_index, float grad_scale, MatF dh, CrossEntropyRow* st);
  // linear_cross_entropy's body, shared with the capped one: the checks, the per-row state, then
  // the one walk (dh given and one_walk) or the two walks (stats; dlogits when dh is given).
  double cross_entropy_loss(const QWeight& head, CMatF h, const int32_t* targets,
                            int32_t ignore_index, float grad_scale, MatF dh, int64_t* count,
                            bool one_walk);

  // A zeroed scratch buffer counted as workspace (throws QLFT_ERR_OUT_OF_MEMORY past the limit).
  Buffer workspace(size_t bytes, const char* what) const {
    return Buffer(tracker_, MemCategory::Workspace, bytes, what);
  }
  // Uninitialized scratch counted as workspace, for users that write before they read.
  Buffer scratch_buffer(size_t bytes, const char* what) const {
    return Buffer(tracker_, MemCategory::Workspace, bytes, what, BufferInit::Uninit);
  }
  // At least `bytes` of reusable scratch of kind s (see CpuTuning::reuse_scratch), not zeroed.
  ScratchLease scratch(Scratch s, size_t bytes, const char* what) const;
  // Frees the kept scratch buffers (they come back on the next call that needs them).
  void release_scratch();

  // x in the lp element type: the shared input's copy when x is the begin_shared_input()
  // matrix (converted on first use, kept until end_shared_input()), else a fresh copy in `slot`.
  // Returns a view; `own` holds the fresh copy.
  // `extra`: as to_lp's (the shared copy serves only calls asking for the same).
  const LpMat& input_lp(CMatF x, Scratch slot, const char* what, LpMat& own,
                        int64_t extra = 0) const;

 private:
  struct SharedInput {
    CMatF x;
    bool held = false;
    const uint16_t* x16 = nullptr;  // x rounded to bf16 (begin_shared_input_16)
    LpMat lp;                       // empty until first used
  };
  // An lp matrix of x16's values ([rows, cols] bf16, row stride src_ld; 0: cols) with `extra`
  // zero columns.
  LpMat lp_from_16(const uint16_t* x16, int64_t rows, int64_t cols, Scratch slot, const char* what,
                   int64_t extra, int64_t src_ld = 0) const;
  mutable SharedInput shared_;
  // The cap cross_entropy_stats / cross_entropy_grad apply to each logit (0: none); set only
  // inside linear_cross_entropy_capped.
  float ce_softcap_ = 0.f;
  // next_dy_16's dy for the next linear_bwd (which clears it).
  View2<uint16_t> dy16_;
  // attention_bwd, and with rope given attention_bwd_16's outputs (dq16 etc.) instead of dq etc.
  void attention_bwd_impl(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                          const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv,
                          const RopeArgs* rope, View2<uint16_t> dq16, View2<uint16_t> dk16,
                          View2<uint16_t> dv16);
  // attention_inputs_16's q, k, v for the next attention call (which clears them).
  std::array<const uint16_t*, 3> attn16_{};
  // attention_out_16's out and dout for the next attention backward (which clears them).
  std::array<const uint16_t*, 2> attn_out16_{};
  // next_dx_16's dx for the next linear_bwd (which clears it).
  uint16_t* dx16_ = nullptr;
  // attention_fwd_impl and attention_bwd_impl on AMX tiles (cpu_attention_amx.cpp), with the
  // 16-bit inputs they took.
  void attention_fwd_amx(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out, float* lse,
                         uint16_t* out16, const std::array<const uint16_t*, 3>& in16, AmxExec ex);
  void attention_bwd_amx(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out, const float* lse,
                         CMatF dout, MatF dq, MatF dk, MatF dv, const RopeArgs* rope,
                         View2<uint16_t> dq16, View2<uint16_t> dk16, View2<uint16_t> dv16,
                         const std::array<const uint16_t*, 3>& in16, const uint16_t* out16,
                         const uint16_t* dout16, AmxExec ex);
  // attention_fwd, and with out16 its output rounded there instead of written to out.
  void attention_fwd_impl(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out, float* lse,
                          uint16_t* out16);
  // defer_zero's dx, until the linear_bwd that overwrites it (or zeroes it).
  float* dx_pending_ = nullptr;
  int64_t dx_pending_n_ = 0;
  // Whether linear_bwd's dx is defer_zero's: ends the deferral, zeroing a different one.
  bool take_pending_zero(MatF dx);
  DType precision_ = DType::F32;
  mutable std::array<Buffer, size_t(Scratch::Count)> slots_;
  mutable std::array<std::atomic<bool>, size_t(Scratch::Count)> busy_{};
};

// ---- helpers shared by the kernels (cpu_common.cpp) ----------------------------------------

// Exceptions must not leave an OpenMP region: each task of one runs through run(), which keeps
// the first exception and skips the tasks after it; rethrow() after the region.
class TaskErrors {
 public:
  template <class F>
  void run(F&& f) {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!err_) err_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  void rethrow() const {
    if (err_) std::rethrow_exception(err_);
  }

 private:
  std::mutex mu_;
  std::exception_ptr err_;
  std::atomic<bool> failed_{false};
};

// Rows of a weight dequantized at once: about tune.panel_bytes of floats, clamped.
int64_t panel_rows(const CpuBackend& be, const QWeight& W);
// Dequantizes rows [r0, r0 + n) of W into out (n * W.cols floats), split across threads. With
// `merged` (fp32, see lora_merged) each thread then adds its rows of scale * B A while they are in
// its cache: the rows of W + scale B A.
void dequant_panel(const CpuBackend& be, const QWeight& W, int64_t r0, int64_t n, float* out,
                   const LoraRef* merged = nullptr);
// C[M, N] = alpha * op(A) op(B) + beta * C, row-major, through cblas_sgemm or, per
// tune.f32_blas, oneDNN's dnnl_sgemm (checks int range).
void sgemm(const CpuBackend& be, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
           float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
           float* C, int64_t ldc);
// sgemm, except that A B^T (trans_b only) runs on oneDNN's fp32 matmul when
// tune.f32_xwt_onednn is set.
void gemm_f32(const CpuBackend& be, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
              float* C, int64_t ldc);
// y[:, p] = x W[p, :]^T for every row p of W (overwrites y), panel by panel. With precision bf16
// x and W are rounded to bf16 first. `merged` (fp32 only): W + scale B A instead of W.
void matmul_xwt(const CpuBackend& be, const QWeight& W, CMatF x, MatF y, const char* what,
                const LoraRef* merged = nullptr);

// fp32 (and fp16 autocast, which runs this path) folds a LoRA without dropout into the weight
// panels: x A^T B^T = x (B A)^T, so y = x (W + s B A)^T and dx = dy (W + s B A) take the LoRA term
// with no GEMM of inner dimension r over the whole output (memory-bound: it reads and writes all of
// y or dx). The merge costs a rank-r update of each panel, [N, K] x r against [M, N] x r (y) or
// [M, K] x r (dx) saved, so it runs when M is at least the output's other side (K forward, N
// backward): training's M = batch x sequence, not generation's few rows. xa (for dB) and the
// LoRA gradients still run their own GEMMs.
inline bool lora_merged(const LoraRef* l, int64_t M, int64_t other) {
  return l && l->r > 0 && l->dropout_p == 0.f && M >= other;
}

// RoPE's cos / sin per position (cpu_pointwise.cpp): what CpuBackend::rope rotates with (the
// same values, so a kernel that applies RoPE itself gives rope's bits): cos(angle) * scale and
// sin(angle) * scale from freqs. inverse: -sin.
class RopeTable {
 public:
  RopeTable(const CpuBackend& be, const int32_t* pos, int64_t rows, int head_dim,
            const RopeFreqs& freqs, bool inverse);
  // The tables of row `row`'s position (head_dim / 2 each).
  const float* cos_of(int64_t row) const { return cs_ + index(row) * half_; }
  const float* sin_of(int64_t row) const { return sn_ + index(row) * half_; }

 private:
  int64_t index(int64_t row) const { return by_pos_ ? pos_[row] : row; }
  Buffer buf_;
  const int32_t* pos_;
  const float *cs_ = nullptr, *sn_ = nullptr;
  int half_;
  bool by_pos_ = true;
};

// ---- the bf16 ("low precision", lp) operands of precision bf16 ------------------------------
size_t lp_bytes(const CpuBackend& be);
// x rounded to bf16 into an lp matrix in scratch slot s (Scratch::Count: a buffer of its own),
// rows split across threads; `extra` zeroed columns after x's (for the fused LoRA GEMMs).
LpMat to_lp(const CpuBackend& be, CMatF x, Scratch s, const char* what, int64_t extra = 0);
inline LpMat to_lp_own(const CpuBackend& be, CMatF x, const char* what) {
  return to_lp(be, x, Scratch::Count, what);
}
// Rows of W per lp panel: about tune.panel_bytes of lp elements (bf16 panels hold twice the rows).
int64_t panel_rows_lp(const CpuBackend& be, const QWeight& W);
// Rows [r0, r0 + n) of W rounded to bf16 into out (row stride ld >= W.cols lp elements; 0: W.cols),
// split across threads.
void dequant_panel_lp(const CpuBackend& be, const QWeight& W, int64_t r0, int64_t n, void* out,
                      int64_t ld = 0);
// C = alpha op(A) op(B) + beta C on lp operands (element offsets and leading dims in elements).
void gemm_lp(const CpuBackend& be, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
             float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta,
             float* C, int64_t ldc);
// gemm_lp with beta 0 and C written as bf16 [M, N] (gemm_bf16_out16; bf16 on oneDNN only).
void gemm_lp_out16(const CpuBackend& be, bool trans_a, bool trans_b, int64_t M, int64_t N,
                   int64_t K, float alpha, const void* A, int64_t lda, const void* B, int64_t ldb,
                   uint16_t* C, int64_t ldc);
// p + off elements of the lp element type.
inline const void* lp_at(const CpuBackend& be, const void* p, int64_t off) {
  return static_cast<const char*>(p) + off * int64_t(lp_bytes(be));
}
// matmul_xwt on an lp x (shapes checked by the caller).
void matmul_xwt_lp(const CpuBackend& be, const QWeight& W, const LpMat& xl, MatF y);

// Precision bf16 folds a LoRA's rank-r GEMMs into the base GEMM (cpu_linear.cpp) when scale * B
// and scale * A round as B and A do (scale a power of two) and no dropout mask sits between
// x and xa; the inner dimension grows by r, padded to a multiple of kFusedAlign where the
// operands are bf16 (oneDNN: AMX tiles; the unpadded concatenation was slower there than the
// separate GEMMs). The sgemm engine's fp32 operands (lp elements of 4 bytes) take k + r as it is:
// the padding's zeros were about 2% of a bf16 step on a Zen 3 (issue 19's shape).
constexpr int64_t kFusedAlign = 32;
inline bool lora_fusable(int r, float scale, float dropout_p) {
  int e;
  return r > 0 && dropout_p == 0.f && scale != 0.f && std::fabs(std::frexp(scale, &e)) == 0.5f;
}
inline int64_t fused_width(int64_t k, int r, size_t lp_elem_bytes) {
  const int64_t a = lp_elem_bytes == 2 ? kFusedAlign : 1;
  return (k + r + a - 1) / a * a;
}

// A GEMM operand in the element type of a call: the fp32 matrix itself, or (lp) its bf16 rounding
// as gemm_lp takes it (dense, leading dimension = cols).
struct Operand {
  ScratchLease buf;
  const void* p = nullptr;
  int64_t ld = 0;
};

// GEMMs in one element type: fp32 (sgemm) or lp (precision bf16: gemm_lp). The LoRA path and
// attention are written once over it.
struct OpGemm {
  const CpuBackend& be;
  bool lp;

  // m as an operand: itself (fp32), or rounded into scratch slot `slot` (Scratch::Count: a
  // buffer of its own).
  Operand operand(CMatF m, Scratch slot, const char* what) const;
  // An operand already rounded (the base GEMM's lp copy of x or dy).
  Operand borrow(const LpMat& l) const;
  // o.p + off elements.
  const void* at(const Operand& o, int64_t off) const { return at(o.p, off); }
  const void* at(const void* p, int64_t off) const {
    return static_cast<const char*>(p) + off * int64_t(elem_bytes());
  }
  // Bytes per element.
  size_t elem_bytes() const { return lp ? lp_bytes(be) : 4; }
  // n fp32 values into dst in the element type (lp: rounded; fp32: copied).
  void convert(const float* src, void* dst, size_t n) const;
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) const;
  // gemm for an output of few columns (the LoRA's [M, r] xa and g; op(A) not transposed): fp32
  // runs it on oneDNN where CpuTuning::f32_thin_onednn says so.
  void gemm_thin(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                 const void* B, int64_t ldb, float beta, float* C, int64_t ldc) const;
  // C = alpha A^T B + beta C for an output of few rows (a LoRA gradient summed over the K rows:
  // A is [K, M], B [K, N], C [M, N]), on oneDNN like gemm_thin.
  void gemm_grad(int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                 const void* B, int64_t ldb, float beta, float* C, int64_t ldc) const;
  // gemm for an attention tile product with op(A) not transposed (Q K^T, P V, dO V^T, dS K):
  // fp32 runs it on oneDNN where CpuTuning::f32_attn_onednn says so.
  void gemm_tile(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                 const void* B, int64_t ldb, float beta, float* C, int64_t ldc) const;
  // Whether gemm_thin and gemm_grad run on oneDNN (fp32 with CpuTuning::f32_thin_onednn).
  bool thin_onednn() const { return !lp && be.tune.f32_thin_onednn; }
  // Whether gemm_tile runs on oneDNN (fp32 with CpuTuning::f32_attn_onednn).
  bool tile_onednn() const { return !lp && be.tune.f32_attn_onednn; }
  // gemm with op(A) not transposed, on oneDNN's fp32 GEMM when `onednn` (gemm_thin, gemm_tile).
  void gemm_an(bool onednn, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
               int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) const;
};

}  // namespace qlft::cpu
