// The Backend interface: coarse, layer-level operations the model is written against once.
// CPU implements it in backend/cpu/, CUDA in cuda/. Fused kernels replace straightforward ones
// behind the same calls.
//
// Layout conventions (all row-major, fp32 unless said):
//  - Activations are [rows, features] with rows = batch * seq, sequence-major inside a batch
//    element: row = b * seq + t.
//  - Attention q is [rows, q_dim()], k and v are [rows, kv_dim()] (AttnShape's HeadGeometry,
//    arch/model_shapes.h); head h uses KV head h / group() (GQA).
//  - Base weights are QWeight [out, in]; y = x W^T.
//  - LoRA A is [r, in], B is [out, r]; y += scale * dropout(x) A^T B^T (PEFT semantics).
//  - "bwd" functions ACCUMULATE into input gradients (+=) so residual branches can share a
//    buffer, and accumulate into LoRA gradients (+=) so micro-batches can accumulate.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arch/model_shapes.h"
#include "config/run_spec.h"
#include "backend/rope_freqs.h"
#include "backend/softmax_math.h"
#include "core/dtype.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "backend/adamw_math.h"
#include "quant/qweight.h"

namespace qlft {

class StateStore;

// A LoRA adapter on one linear layer, as the kernels see it.
struct LoraRef {
  const float* A = nullptr;  // [r, in]
  const float* B = nullptr;  // [out, r]
  int r = 0;
  float scale = 1.f;  // alpha / r, or alpha / sqrt(r) with rsLoRA
  // Dropout on the LoRA input: element (row, col) of x is kept iff
  // lora_dropout_keep(seed, row, col, p) (see backend/dropout.h); kept values are scaled by
  // 1 / (1 - p). p = 0 disables it. The mask is recomputed in backward, never stored.
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0;
  // The mask's row of x's first row: a call on rows [r0, r0 + n) of a larger batch (the runner's
  // sequence tiles, model/llama_mlp_tiles.cpp) draws that batch's mask.
  int64_t dropout_row0 = 0;
  // bf16 copies of A and B kept beside them (the device runner's, written where A and B are:
  // upload and the device optimizer step), or null. A backend whose LoRA GEMMs take bf16
  // operands reads these instead of converting A and B at every call; others ignore them.
  const uint16_t* A16 = nullptr;
  const uint16_t* B16 = nullptr;
};

// Attention shape and masking for one call: the model's head geometry (arch/model_shapes.h)
// over batch sequences of seq tokens.
struct AttnShape : HeadGeometry {
  int batch = 1, seq = 1;  // rows = batch * seq
  // Optional [rows] document id per position (sequence packing): position i may attend to j
  // iff j <= i (same batch element) and doc[i] == doc[j]. nullptr = plain causal.
  const int32_t* doc_ids = nullptr;
  // Sliding-window attention (Mistral, Gemma 2/3's local layers): position i attends to key j
  // only when j > i - window as well (transformers' sliding_window_overlay: the window keys up
  // to and including i), positions counted within the batch element. 0: no window.
  int window = 0;
  // Soft-capping of the scaled scores before the mask and softmax (Gemma 2's
  // attn_logit_softcapping): s = softcap * tanh(s / softcap); 0: none. Only a backend with
  // gemma_ops() is handed a nonzero one.
  float softcap = 0.f;
  // The scores' scale (Gemma's query_pre_attn_scalar^-0.5); 0: head_dim^-0.5.
  float scale = 0.f;
  float score_scale() const { return scale > 0 ? scale : 1.0f / std::sqrt(float(head_dim)); }
};

// What a backend with its own memory moved between host and device, and how often the host
// waited for the device, since the backend was made. The trainer reports the per-step difference
// (metrics.jsonl h2d_bytes / d2h_bytes / device_syncs); the CPU backend moves nothing.
// One row of a cross-entropy computed over a head in slices (Backend::cross_entropy_stats): the
// running softmax over the vocabulary rows seen so far and the target's logit once its slice
// was seen; for the one walk (Backend::cross_entropy_walk) the shift of the row's dh
// accumulator, shift ln 2 (ce_acc_shift; INT32_MIN until the row's first finite logit).
struct CrossEntropyRow {
  OnlineSoftmax<double> sm;
  float target_logit = 0.f;
  int32_t shift = INT32_MIN;
};

// The one walk's accumulator shift for a running max m: the least k with k ln 2 >= m. Shifts are
// multiples of ln 2 so that a raised max rescales the accumulator by an exact power of two and an
// exponential rounded to bf16 under one shift is the one rounded under the final shift: the walk's
// rounded dh operand does not depend on how the head is cut into panels or slices.
inline int32_t ce_acc_shift(float m) {
  return static_cast<int32_t>(std::ceil(double(m) * 1.4426950408889634));
}
inline double ce_shift_value(int32_t shift) {
  return double(shift) * 0.6931471805599453;
}
// What turns a row's accumulator (sum of exp(logit - shift ln 2) x head rows) into
// grad_scale softmax x head: grad_scale exp(shift ln 2 - max) / sum.
inline float ce_acc_factor(const CrossEntropyRow& row, float grad_scale) {
  return float(double(grad_scale) * std::exp(ce_shift_value(row.shift) - row.sm.m) / row.sm.s);
}

// RoPE's position arguments, for an operation that applies it itself (Backend::attention_bwd_16).
struct RopeArgs {
  const int32_t* pos = nullptr;      // [rows]
  const RopeFreqs* freqs = nullptr;  // the rotation table (as Backend::rope's)
  bool adjacent = false;             // as Backend::rope's
};

struct TransferCounts {
  uint64_t host_to_device = 0;
  uint64_t device_to_host = 0;
  uint64_t syncs = 0;
  uint64_t launches = 0;  // kernels and library calls (GEMMs) submitted to the device
};

// Launches of one kernel (its name with template arguments, "k_convert<...>"), or of a library
// call that launches ("cublasLtMatmul").
struct KernelLaunches {
  std::string name;
  uint64_t count = 0;
};
// The launches of `now` not yet in `before` (two launch_counts() of one backend), by name;
// kernels launched no more often are left out.
std::vector<KernelLaunches> launches_since(const std::vector<KernelLaunches>& before,
                                           const std::vector<KernelLaunches>& now);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  MemoryTracker* tracker() const { return tracker_; }
  virtual TransferCounts transfers() const { return {}; }
  // transfers().launches by kernel, in name order (a device backend's; empty on the host).
  virtual std::vector<KernelLaunches> launch_counts() const { return {}; }

  // ---- the memory the operations work in ----------------------------------------------------
  // A buffer in the backend's memory: host memory on the CPU, device memory on a GPU. The runner
  // keeps its activations there, so a device backend moves nothing per operation; host code
  // reaches such a buffer only through Buffer's zero and copies. Every operation below also
  // takes host arrays (a device backend stages them, counted in transfers()).
  Buffer alloc(MemCategory c, size_t bytes, const char* what,
               BufferInit init = BufferInit::Zero) const {
    return device_ ? Buffer(device_, c, bytes, what, init) : Buffer(tracker_, c, bytes, what, init);
  }
  // The device memory alloc() hands out; nullptr for host memory.
  DeviceAllocator* device_memory() const { return device_; }
  // The device the operations run on (-1: the host) and the queue they are ordered on (a
  // cudaStream_t for CUDA; nullptr on the host), for a communicator that must follow it
  // (dist::Communicator::follow_stream).
  virtual int device_index() const { return -1; }
  virtual void* native_stream() const { return nullptr; }

  // ---- copies beside the compute (offloaded checkpoints: model/checkpoint_offload.h) --------
  // Host memory the copies below read and write without staging (page-locked on a GPU:
  // cudaHostAlloc), counted as host bytes of category c. The host default: a plain host Buffer.
  virtual Buffer alloc_pinned(MemCategory c, size_t bytes, const char* what);
  // Copies bytes between the backend's memory and alloc_pinned memory (either way) on a copy
  // stream beside the compute: after all work queued so far (an event the copy stream waits on),
  // without holding up work queued later. Returns a ticket for wait_copy. The host default
  // copies now (the copy is done when it returns) and returns 0.
  virtual uint64_t copy_async(void* dst, const void* src, size_t bytes);
  // Work queued after this waits for copy `ticket` (and every copy issued before it).
  virtual void wait_copy(uint64_t ticket) { (void)ticket; }
  // The host waits for every copy issued (before a pinned buffer a copy may use is freed).
  virtual void sync_copies() {}

  // ---- elementwise glue between the layer operations ------------------------------------------
  // (Host loops here, backend/backend.cpp; a device backend overrides them.)
  // y += x over n elements (the residual connections).
  virtual void add(float* y, const float* x, int64_t n);
  // dst = src over n elements (no overlap), within the backend's memory (gradient and weight
  // exchange between ranks) or between it and the host.
  virtual void copy(float* dst, const float* src, int64_t n);
  // Activation storage: fp32 -> t (BF16 or F16, round to nearest even), back to fp32, and fp32
  // values rounded through t in place.
  virtual void to_16(DType t, const float* src, uint16_t* dst, int64_t n);
  virtual void from_16(DType t, const uint16_t* src, float* dst, int64_t n);
  virtual void round_16(DType t, float* x, int64_t n);

  // ---- the optimizer's arithmetic, on parameters and gradients in the backend's memory --------
  // (The trainer's device step, train/device_adamw.h; the host path keeps its own loops.)
  // Sum of the squares of n values, in double.
  virtual double sum_squares(const float* x, int64_t n);
  // x *= s over n values.
  virtual void scale(float* x, int64_t n, float s);
  // How many of n values are inf or NaN.
  virtual int64_t count_nonfinite(const float* x, int64_t n);
  // torch.optim.AdamW over n elements (adamw_torch_update on each).
  virtual void adamw_torch(float* p, float* m, float* v, const float* g, int64_t n,
                           const AdamWTorchCoeffs& c);
  // adamw_torch, and p16 = the updated p rounded to t (a bf16 copy kept beside the parameters,
  // LoraRef::A16 / B16) written in the same pass. The default: adamw_torch, then to_16.
  virtual void adamw_torch_to_16(float* p, float* m, float* v, const float* g, int64_t n,
                                 const AdamWTorchCoeffs& c, DType t, uint16_t* p16);
  // bitsandbytes' 8-bit AdamW over one tensor of n elements (optim/adamw8bit.h): q1 / q2 the
  // blockwise (256) codes of m and v, absmax1 / absmax2 their per-block scales, each block
  // dequantized, updated (adam_bnb_8bit_update) and re-quantized; adamw_bnb32 the fp32-state
  // path of small tensors. The state may also lie in managed_state_store()'s memory. No host
  // default: the host optimizer keeps its own loops (optim/adamw8bit.cpp).
  virtual void adamw_bnb8(float* p, uint8_t* q1, uint8_t* q2, float* absmax1, float* absmax2,
                          const float* g, int64_t n, const AdamBnbCoeffs& c);
  virtual void adamw_bnb32(float* p, float* m, float* v, const float* g, int64_t n,
                           const AdamBnbCoeffs& c);
  // Optimizer state the driver pages between the device and the host (paged_adamw8bit on a GPU:
  // CUDA managed memory, prefetched to the device group by group as the step begins each);
  // nullptr where the backend has none.
  virtual std::unique_ptr<StateStore> managed_state_store();

  // ---- linear with LoRA -------------------------------------------------------------------
  // y = x W^T + bias + scale * drop(x) A^T B^T. x: [rows, in], y: [rows, out] (overwritten).
  // If lora and xa are given, xa ([rows, r]) receives drop(x) A^T for the backward pass.
  virtual void linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                          float* xa) = 0;
  // linear_fwd for an output that only enters 16-bit operands (the runner's gate / up): y's
  // values rounded to t written to y16 ([x.rows, W.rows] dense). y is fp32 room the backend may
  // leave unwritten. The default: linear_fwd, then to_16. The CPU backend at precision bf16 on
  // oneDNN, fused LoRA path, no bias: the GEMM writes y16 itself (gemm_bf16_out16: the same fp32
  // sums, maybe in another order, rounded in its kernel, subnormal results flushed to zero).
  virtual void linear_fwd_to_16(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x,
                                MatF y, float* xa, DType t, uint16_t* y16);
  // dx += dy W + scale * (dy B) A (masked by the dropout mask, scaled by 1/(1-p));
  // dA += scale * (dy B)^T drop(x); dB += scale * dy^T xa.
  // dx may be empty (data == nullptr) when the input gradient is not needed.
  virtual void linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa, CMatF dy,
                          MatF dx, float* dA, float* dB) = 0;

  // In place of zeroing dx (n floats, dense) before the linear_bwd that takes it as dx next:
  // true when the backend makes that call write dx as if it had been zeroed (its first GEMM
  // overwrites: no memset, no read of the old values); false: the caller zeroes it. A call
  // with another dx (or none) in between zeroes it first.
  virtual bool defer_zero(float* dx, int64_t n) {
    (void)dx;
    (void)n;
    return false;
  }

  // A hint: the linear_fwd / linear_bwd calls up to end_shared_input() that take x as their
  // input take the same matrix, unchanged (q, k and v share the normed hidden state; gate and
  // up too), so a backend that converts its input (the CPU backend's bf16 copy) may convert it
  // once. The caller must not write x in between. Calls with other inputs are unaffected.
  virtual void begin_shared_input(CMatF x) { (void)x; }
  virtual void end_shared_input() {}
  // The same scope with x's values already rounded to t (x16: [rows, cols] dense, as to_16
  // writes them; the runner's stored 16-bit activation). A backend for which takes_input_16(t)
  // holds takes the GEMM input of the scope's calls from x16 and reads x's fp32 values only
  // for LoRA dropout, so without dropout x need not hold its values (the runner skips writing
  // or unpacking them); any other backend sees begin_shared_input(x).
  virtual void begin_shared_input_16(CMatF x, DType t, const uint16_t* x16) {
    (void)t;
    (void)x16;
    begin_shared_input(x);
  }
  virtual bool takes_input_16(DType t) const {
    (void)t;
    return false;
  }
  // The output gradient of a linear_bwd in 16 bits (the runner's direct16() backward: SwiGLU's
  // and attention's gradients written rounded, not in fp32). grad_16_stride: the row stride (in
  // elements, >= W.rows) a dy should have for linear_bwd(W, lora, ...) with a dx; the columns
  // past W.rows are the backend's to write (the CPU backend's fused LoRA GEMM puts dy B there).
  // next_dy_16: a hint for the next linear_bwd, which takes it: its dy's values rounded to t
  // are dy16 ([dy.rows, dy.cols], any stride >= dy.cols). A backend for which takes_input_16(t)
  // holds reads them instead of dy's, which need not hold values; any other backend ignores it.
  virtual int64_t grad_16_stride(const QWeight& W, const LoraRef* lora) const {
    (void)lora;
    return W.rows;
  }
  virtual void next_dy_16(DType t, View2<uint16_t> dy16) {
    (void)t;
    (void)dy16;
  }
  // LoRA's intermediate xa = x A^T in 16 bits. takes_xa_16(t): the backend can keep a
  // linear's xa as values rounded to t in 16-bit memory the caller owns. next_xa_16: a hint for
  // the next linear_fwd / linear_bwd with LoRA, which takes it: its xa lives in xa16
  // ([x.rows, r] dense), written by linear_fwd (its fp32 xa argument left unwritten) and read by
  // linear_bwd (its fp32 xa argument not read). Any other backend ignores it.
  virtual bool takes_xa_16(DType t) const {
    (void)t;
    return false;
  }
  virtual void next_xa_16(DType t, uint16_t* xa16) {
    (void)t;
    (void)xa16;
  }
  // The input gradient of a linear_bwd in 16 bits, for a dx that only enters 16-bit operands
  // (the o projection's, attention's dout). True when the backend takes the hint: the next
  // linear_bwd(W, lora, ...), whose dx was handed to defer_zero, writes dx's values rounded to t
  // into dx16 ([dx.rows, dx.cols] dense) and leaves dx unwritten; false: no hint taken (the
  // default; the CPU backend at precision bf16 on oneDNN takes it for the fused LoRA dx GEMM).
  virtual bool next_dx_16(DType t, uint16_t* dx16, const QWeight& W, const LoraRef* lora) {
    (void)t;
    (void)dx16;
    (void)W;
    (void)lora;
    return false;
  }

  // ---- normalization, position, activation -----------------------------------------------
  // y = x * rstd * w, rstd[row] = 1 / sqrt(mean(x^2) + eps). rstd may be nullptr.
  virtual void rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) = 0;
  // dx += d/dx of the above (w frozen). rstd from the forward pass.
  virtual void rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) = 0;
  // rmsnorm_bwd, and dx16 = dx's updated values rounded to t ([rows, cols] dense): the residual
  // gradient in 16 bits for the linear_bwd that takes it as its dy next (next_dy_16), written by
  // the norm's own pass where the backend fuses them. The default: rmsnorm_bwd, then to_16.
  virtual void rmsnorm_bwd_16(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx,
                              DType t, uint16_t* dx16);

  // Rotates x ([rows, n_heads * head_dim]) in place at positions pos[row]. adjacent = true
  // pairs (2i, 2i+1) (GGUF llama order), false pairs (i, i + head_dim/2) (HF rotate-half).
  // inverse = true applies the transpose rotation (its backward). freqs: the per-pair inverse
  // frequencies (head_dim / 2) and the cos / sin scale, made by rope_freqs (model/rope_scaling.h);
  // angle = float(pos) * inv_freq, cos and sin each times freqs.scale.
  virtual void rope(MatF x, const int32_t* pos, int n_heads, int head_dim, const RopeFreqs& freqs,
                    bool adjacent, bool inverse) = 0;

  // rope (inverse = false) with the rotated rows written rounded to t into x16 ([rows, cols]
  // dense; the values rope then to_16 give); x may be left unrotated (the runner's direct16()
  // forward, whose attention takes q and k from the 16-bit copies). The default: rope, to_16.
  virtual void rope_to_16(MatF x, const int32_t* pos, int n_heads, int head_dim,
                          const RopeFreqs& freqs, bool adjacent, DType t, uint16_t* x16);

  // out = silu(gate) * up, all [rows, ffn].
  virtual void swiglu_fwd(CMatF gate, CMatF up, MatF out) = 0;
  // 16-bit activation storage in one pass (the defaults are the separate ops). A null fp32
  // output (y.data, out.data) is not written where nothing reads it (the runner's direct16()
  // path, whose GEMMs take the 16-bit copies); the defaults then use workspace.
  // rmsnorm_fwd, and y16 = y rounded to t (to_16);
  virtual void rmsnorm_fwd_16(CMatF x, const float* w, float eps, MatF y, float* rstd, DType t,
                              uint16_t* y16);
  // x += r (the residual add, x and r dense), then rmsnorm_fwd_16 of x without an fp32 output:
  // the values add then rmsnorm_fwd_16 give, in one pass where the backend fuses them.
  virtual void add_rmsnorm_fwd_16(MatF x, const float* r, const float* w, float eps, float* rstd,
                                  DType t, uint16_t* y16);
  // gate and up rounded to t into g16 / u16 (and in place), then swiglu_fwd of the rounded
  // values and o16 = out rounded to t. keep_rounded = false: gate and up need not keep the
  // rounded values (nothing reads them after).
  virtual void swiglu_fwd_16(MatF gate, MatF up, MatF out, DType t, uint16_t* g16, uint16_t* u16,
                             uint16_t* o16, bool keep_rounded = true);
  // swiglu_fwd of gate and up given rounded to t (g16 / u16, [rows, cols] dense), its output
  // rounded to t into o16: swiglu_fwd_16's o16 for gate / up that round to g16 / u16 (gate and up
  // written rounded by linear_fwd_to_16). The default goes through fp32 workspace.
  virtual void swiglu_fwd_from_16(DType t, const uint16_t* g16, const uint16_t* u16, uint16_t* o16,
                                  int64_t rows, int64_t cols);
  // swiglu_bwd of gate and up given as g16 / u16 (16-bit, dense); gate and up: fp32 room the
  // default fills with their values (a backend may leave them untouched).
  virtual void swiglu_bwd_16(MatF gate, MatF up, DType t, const uint16_t* g16, const uint16_t* u16,
                             CMatF dout, MatF dgate, MatF dup);
  // swiglu_bwd_16 with dgate and dup written rounded to t into dg16 / du16 (the values
  // swiglu_bwd_16 then to_16 give), no fp32 output: the dy of the gate / up linear_bwd
  // (next_dy_16). The default goes through fp32 workspace.
  virtual void swiglu_bwd_to_16(DType t, const uint16_t* g16, const uint16_t* u16, CMatF dout,
                                View2<uint16_t> dg16, View2<uint16_t> du16);
  // dgate = dout * up * silu'(gate); dup = dout * silu(gate) (overwritten, not accumulated).
  virtual void swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) = 0;

  // ---- Gemma's ops (gemma_ops()) -------------------------------------------------------------
  // Whether this backend has the ops below and honours AttnShape::softcap in attention_fwd /
  // attention_bwd (and their 16-bit forms): the runner refuses a Gemma model on one without.
  // The defaults refuse.
  virtual bool gemma_ops() const { return false; }
  // out = gelu_tanh(gate) * up (GeGLU with transformers' gelu_pytorch_tanh), all [rows, ffn].
  virtual void geglu_fwd(CMatF gate, CMatF up, MatF out);
  // dgate = dout * up * gelu_tanh'(gate); dup = dout * gelu_tanh(gate) (overwritten).
  virtual void geglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup);
  // x = cap * tanh(x / cap) in place (Gemma 2's final logit soft-capping of head_logits).
  virtual void softcap(MatF x, float cap);
  // linear_cross_entropy of the soft-capped logits cap * tanh(h head^T / cap), dh through the
  // cap (its derivative 1 - tanh^2).
  // attention_decode with the scores scaled by scale (0: head_dim^-0.5) and soft-capped at
  // softcap (0: none), as AttnShape's; the default handles (0, 0) alone.
  virtual void attention_decode_capped(const HeadGeometry& g, int window, float scale,
                                       float softcap, int past, CMatF q, const float* k_cache,
                                       const float* v_cache, MatF out);
  virtual double linear_cross_entropy_capped(const QWeight& head, CMatF h, const int32_t* targets,
                                             int32_t ignore_index, float grad_scale, float cap,
                                             MatF dh, int64_t* count);

  // ---- mixture-of-experts rows (model/moe.cpp) ----------------------------------------------
  // The experts' rows gathered from the layer's rows and combined back, in the backend's memory.
  // (Host loops in backend.cpp; a device backend overrides them.) The index and weight arrays lie
  // in the backend's memory or on the host (a device backend stages those); indices read on the
  // host are checked against their range (op_checks::row_indices), a device backend's own are not.
  // out[i] = x[rows[i]], times scale[i] where scale is given, for i < out.rows (x.cols columns).
  virtual void gather_rows(CMatF x, const int32_t* rows, const float* scale, MatF out);
  // out[r] = (accumulate ? out[r] : 0) + sum over j < k of (w ? w[r k + j] : 1) src[pos[r k + j]]
  // for r < out.rows, summed in double in the order j = 0, 1, ... (so every backend rounds the
  // same sum once).
  virtual void combine_rows(CMatF src, const int32_t* pos, const float* w, int k, MatF out,
                            bool accumulate);
  // out[i] = <a[rows ? rows[i] : i], b[i]> (a double sum over the columns) for i < b.rows.
  virtual void row_dots(CMatF a, const int32_t* rows, CMatF b, float* out);

  // ---- attention --------------------------------------------------------------------------
  // A hint for the next attention_fwd / attention_bwd: its q, k, v rounded to t (16-bit, dense,
  // their layout). A backend that takes_input_16(t) then reads q, k and v only through these
  // (their fp32 values need not be there: the runner's stored bf16 q / k / v); any other
  // backend ignores it.
  virtual void attention_inputs_16(DType t, const uint16_t* q16, const uint16_t* k16,
                                   const uint16_t* v16) {
    (void)t;
    (void)q16;
    (void)k16;
    (void)v16;
  }
  // out = softmax(q k^T / sqrt(head_dim) + mask) v per head. lse ([n_heads * rows], indexed
  // head * rows + row) receives the log-sum-exp of each score row for the backward pass; it may
  // be nullptr when no backward pass follows (generation).
  virtual void attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out,
                             float* lse) = 0;
  // dq, dk, dv += gradients. out and lse from the forward pass.
  virtual void attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                             const float* lse, CMatF dout, MatF dq, MatF dk, MatF dv) = 0;
  // attention_fwd with out's values rounded to t written to out16 ([rows, n_heads * head_dim]
  // dense; the runner's stored attention output). out is fp32 room the backend may leave
  // unwritten. The default: attention_fwd, then to_16.
  virtual void attention_fwd_to_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out,
                                   float* lse, DType t, uint16_t* out16);
  // A hint for the next attention_bwd / attention_bwd_16: its out rounded to t (out16, dense, out's
  // layout; out's values are the rounded ones). A backend that takes_input_16(t) then reads out
  // only through it (out's fp32 values need not be there); any other backend ignores it.
  // dout16: likewise the next attention backward's dout rounded to t (dout's values need not be
  // there), e.g. written by next_dx_16; either may be null.
  virtual void attention_out_16(DType t, const uint16_t* out16, const uint16_t* dout16 = nullptr) {
    (void)t;
    (void)out16;
    (void)dout16;
  }

  // attention_bwd into zeroed dq, dk, dv, then rope(inverse) of dq and dk at rope's positions,
  // the three written rounded to t into dq16 / dk16 / dv16 (overwritten; the values those ops
  // then to_16 give), no fp32 gradients: the dy of the q / k / v linear_bwd (next_dy_16). The
  // default goes through fp32 workspace.
  virtual void attention_bwd_16(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out,
                                const float* lse, CMatF dout, const RopeArgs& rope, DType t,
                                View2<uint16_t> dq16, View2<uint16_t> dk16, View2<uint16_t> dv16);

  // ---- embedding and head ------------------------------------------------------------------
  // out[row] = emb[tokens[row]]. Throws QLFT_ERR_INVALID_ARGUMENT for an id outside the vocab.
  virtual void embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out) = 0;
  // logits = h head^T ([rows, vocab]); for generation and tests.
  virtual void head_logits(const QWeight& head, CMatF h, MatF logits) = 0;
  // Fused linear + cross-entropy over chunks of rows (full logits never materialized).
  // Returns the SUM of -log softmax(h head^T)[target] over rows whose target != ignore_index,
  // and the number of such rows in *count. If dh.data != nullptr, dh += grad_scale * d(sum)/dh.
  virtual double linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                                      int32_t ignore_index, float grad_scale, MatF dh,
                                      int64_t* count) = 0;
  // The same loss over a head given in row slices, one at a time (a ZeRO-3 row-sharded head,
  // dist/zero3_stream.h, never whole in memory): `slice` holds head rows [row0, row0 +
  // slice.rows) of a head of `vocab` rows. Pass 1 merges each slice's logits into st (one per
  // row of h, rows whose target counts); cross_entropy_finish turns them into the loss and each
  // row's log-sum-exp; pass 2 adds each slice's share of grad_scale * d(sum)/dh into dh.
  // linear_cross_entropy: the same loss over one slice, the whole head. Host backends only:
  // the default throws QLFT_ERR_UNSUPPORTED.
  virtual void cross_entropy_stats(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                                   const int32_t* targets, int32_t ignore_index,
                                   CrossEntropyRow* st);
  virtual void cross_entropy_grad(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                                  const int32_t* targets, int32_t ignore_index, const float* lse,
                                  float grad_scale, MatF dh);
  // The walks of a sliced head the loss with dh takes here: 1 when cross_entropy_walk does it
  // (the CPU backend in every precision, as its whole head), else 2 (stats, then grad).
  virtual int cross_entropy_walks() const { return 2; }
  // The one walk: per slice, pass 1's merge into st, and into acc (a row of h's width for each
  // row whose target counts, in row order; zeroed before the first slice) the slice's
  // exp(logits - shift ln 2) times its rows (ce_acc_shift of the row's running max; acc
  // rescaled by a power of two when it rises), and dh -= grad_scale head[target] for the targets
  // in the slice. After the last slice cross_entropy_walk_end adds ce_acc_factor acc into dh.
  virtual void cross_entropy_walk(const QWeight& slice, int64_t row0, int64_t vocab, CMatF h,
                                  const int32_t* targets, int32_t ignore_index, float grad_scale,
                                  CrossEntropyRow* st, float* acc, MatF dh);

  // ---- decoding with a KV cache (model/generate.h) -------------------------------------------
  // Generation keeps its activations and cache in the backend's memory; these keep a greedy step
  // there too. (positions / argmax: host loops in backend.cpp; a device backend overrides them.)
  // pos[i] = start + i for i < n: RoPE's positions of the rows a feed appends.
  virtual void positions(int32_t* pos, int n, int32_t start);
  // The index of the largest of x[0, n), the lowest on ties: the host Sampler's greedy choice
  // (model/sampler.cpp), returned as one int32 (what a device backend copies back).
  virtual int32_t argmax(const float* x, int64_t n);
  // Attention of n = q.rows new rows over a KV cache whose rows [0, past + n) hold every earlier
  // position's keys / values and these rows' own (already appended): out[i] = softmax(q_i K^T /
  // sqrt(head_dim)) V per head (head h reads KV head h / group()) over cache rows j with
  // from_i <= j <= past + i, from_i = max(0, past + i + 1 - window) when window > 0 (AttnShape's
  // sliding window), else 0. k_cache / v_cache are dense [>= past + n, kv_dim()]; q and out
  // [n, q_dim()]. No default: the CPU backend's is a host loop (cpu/cpu_decode.cpp).
  virtual void attention_decode(const HeadGeometry& g, int window, int past, CMatF q,
                                const float* k_cache, const float* v_cache, MatF out);

 protected:
  explicit Backend(MemoryTracker* tracker, DeviceAllocator* device = nullptr)
      : tracker_(tracker), device_(device) {}
  MemoryTracker* tracker_;
  DeviceAllocator* device_;
};

// The loss (sum over rows whose target counts, in row order) and lse[row] of a cross-entropy
// whose pass 1 (Backend::cross_entropy_stats) has seen every slice of the head; *count gets the
// number of counted rows.
double cross_entropy_finish(const CrossEntropyRow* st, const int32_t* targets, int64_t rows,
                            int32_t ignore_index, float* lse, int64_t* count);
// dh += ce_acc_factor(row) acc for each row whose target counts, after the last slice of
// Backend::cross_entropy_walk (host memory).
void cross_entropy_walk_end(const CrossEntropyRow* st, const int32_t* targets, int32_t ignore_index,
                            float grad_scale, const float* acc, MatF dh);

// begin_shared_input .. end_shared_input over a scope.
class SharedInput {
 public:
  SharedInput(Backend& be, CMatF x) : be_(be) { be_.begin_shared_input(x); }
  // x16 == nullptr: as above.
  SharedInput(Backend& be, CMatF x, DType t, const uint16_t* x16) : be_(be) {
    if (x16)
      be_.begin_shared_input_16(x, t, x16);
    else
      be_.begin_shared_input(x);
  }
  ~SharedInput() { be_.end_shared_input(); }
  SharedInput(const SharedInput&) = delete;
  SharedInput& operator=(const SharedInput&) = delete;

 private:
  Backend& be_;
};

// The CPU backend. spec is kept whole (CpuBackend::spec), so a setting a CPU kernel reads goes
// key table -> BackendSpec -> the kernel, as on CUDA (docs/ARCHITECTURE.md, "Settings").
std::unique_ptr<Backend> make_cpu_backend(MemoryTracker* tracker, const BackendSpec& spec = {});

}  // namespace qlft
