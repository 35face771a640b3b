// Launchers of the CUDA kernels (device pointers, one stream). Every launcher goes through
// cu::launch (check.h). Activations are row-major fp32 with a leading dimension `ld`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/adamw_math.h"
#include "quant/qweight.h"

namespace qlft::cu {

// Element type of a dequantized / converted tile.
enum class TileType { F32, BF16, F16 };
inline size_t tile_elem_bytes(TileType t) {
  return t == TileType::F32 ? 4 : 2;
}

// A frozen weight resident on the device, in its storage format.
struct DevWeight {
  QuantKind kind = QuantKind::F32;
  uint32_t ggml_type = 0;
  int64_t rows = 0, cols = 0;
  int32_t blocksize = 64;         // NF4
  const void* data = nullptr;     // codes / blocks / values
  const float* scales = nullptr;  // NF4: absmax per block (null when absmax_q is set); INT8: SCB
  // A double-quantized NF4 weight as bitsandbytes keeps it: one 8-bit absmax code per block,
  // decoded in the dequantization kernel (nested_absmax_decode) with one fp32 scale per
  // nested_blocksize codes, the 256-entry code book and the subtracted mean.
  const uint8_t* absmax_q = nullptr;
  const float* nested_absmax = nullptr;
  const float* nested_code = nullptr;
  int32_t nested_blocksize = 256;
  float nested_offset = 0.f;
};

// ---- k_quant.cu ------------------------------------------------------------------------------
// out[i, :] = row (row_ids ? row_ids[i] : r0 + i) of W, dequantized, for i < n (n * cols values).
void dequant_rows(const DevWeight& w, const int32_t* row_ids, int64_t r0, int64_t n, void* out,
                  TileType t, cudaStream_t s);
// out (compact [rows, cols], type t) = x (fp32, leading dimension ld), rounded to nearest even.
void convert_tile(const float* x, int64_t rows, int64_t cols, int64_t ld, void* out, TileType t,
                  cudaStream_t s);
// out[i] = 16-bit x[i] (t = BF16 / F16) as fp32.
void widen_tile(const void* x, TileType t, int64_t n, float* out, cudaStream_t s);
// out[i] = x[i] rounded through t (BF16 / F16) to nearest even; out may be x.
void round_through(const float* x, int64_t n, TileType t, float* out, cudaStream_t s);
// y[i, j] += bias[j].
void add_bias(float* y, int64_t rows, int64_t cols, int64_t ld, const float* bias, cudaStream_t s);
// out (compact) = LoRA dropout of x rows [0, rows) whose global row index starts at row0.
void dropout_apply(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t row0, float p,
                   uint64_t seed, float* out, cudaStream_t s);
// dx[i, c] += keep(row0 + i, c) ? scale * t[i, c] : 0 (t compact).
void dropout_masked_add(float* dx, int64_t ld, const float* t, int64_t rows, int64_t cols,
                        int64_t row0, float p, uint64_t seed, float scale, cudaStream_t s);
// dst[i] += src[i].
void accumulate(float* dst, const float* src, int64_t n, cudaStream_t s);

// ---- k_pointwise.cu --------------------------------------------------------------------------
void rmsnorm_fwd(const float* x, const float* w, float eps, float* y, float* rstd, int64_t rows,
                 int64_t cols, cudaStream_t s);
void rmsnorm_bwd(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                 int64_t rows, int64_t cols, cudaStream_t s);
// inv_freq: head_dim / 2 values on the device (the host's RopeFreqs table, uploaded); cos and
// sin are multiplied by scale.
void rope(float* x, int64_t ld, const int32_t* pos, const float* inv_freq, float scale,
          int64_t rows, int n_heads, int head_dim, bool adjacent, bool inverse, cudaStream_t s);
// The bf16-writing forms (BF16 only: the runner's 16-bit operands, CudaBackend's *_16 ops):
// rmsnorm of x (after x += res where res is given) into y (fp32) and / or y16 (bf16), either may
// be null; RoPE of x written rotated to x16 (x unchanged); SwiGLU from bf16 gate / up to bf16,
// and its backward from them and fp32 dout to bf16 dgate / dup (row strides ldd, ld16).
void rmsnorm_fwd16(float* x, const float* res, const float* w, float eps, float* y, uint16_t* y16,
                   float* rstd, int64_t rows, int64_t cols, cudaStream_t s);
// rmsnorm_bwd with dx's updated values also written rounded to bf16 into dx16 (dense).
void rmsnorm_bwd16(const float* x, const float* w, const float* rstd, const float* dy, float* dx,
                   uint16_t* dx16, int64_t rows, int64_t cols, cudaStream_t s);
void rope16(const float* x, int64_t ld, uint16_t* x16, int64_t ld16, const int32_t* pos,
            const float* inv_freq, float scale, int64_t rows, int n_heads, int head_dim,
            bool adjacent, bool inverse, cudaStream_t s);
void swiglu_fwd16(const uint16_t* g16, const uint16_t* u16, uint16_t* o16, int64_t n,
                  cudaStream_t s);
void swiglu_bwd16(const uint16_t* g16, const uint16_t* u16, const float* dout, int64_t ldd,
                  uint16_t* dg16, uint16_t* du16, int64_t ld16, int64_t rows, int64_t cols,
                  cudaStream_t s);
void swiglu_fwd(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);
void swiglu_bwd(const float* gate, const float* up, const float* dout, float* dgate, float* dup,
                int64_t n, cudaStream_t s);

// ---- k_gemma.cu ------------------------------------------------------------------------------
// out = gelu_tanh(gate) * up (transformers' gelu_pytorch_tanh), n elements.
void geglu_fwd(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);
// dgate = dout * up * gelu_tanh'(gate); dup = dout * gelu_tanh(gate).
void geglu_bwd(const float* gate, const float* up, const float* dout, float* dgate, float* dup,
               int64_t n, cudaStream_t s);
// x = cap * tanh(x / cap) in place (Gemma 2's final logit soft-cap), n elements.
void softcap(float* x, int64_t n, float cap, cudaStream_t s);

// ---- k_attention.cu --------------------------------------------------------------------------
struct AttnArgs {
  int batch, seq, n_heads, n_kv_heads, head_dim;
  int64_t ldq, ldk, ldv, ldo;      // leading dimensions of q / dq, k / dk, v / dv, out / dout
  const int32_t* doc = nullptr;    // [rows] document ids or nullptr
  const int32_t* first = nullptr;  // [rows] first position of the same document
  int window = 0;                  // sliding window (AttnShape::window), 0: none
  float scale = 0.f;               // the scores' scale (AttnShape::scale), 0: head_dim^-0.5
  float softcap = 0.f;             // the scaled scores' tanh cap (AttnShape::softcap), 0: none
  // Precision bf16: the backward's P and dS rounded to bf16 where they enter dV and dQ / dK, as
  // the CPU backend's bf16 attention does (its forward also rounds P before P V, which this
  // online-softmax forward cannot: it never holds the normalized P).
  bool round_bf16 = false;
};
constexpr int kAttnMaxHeadDim = 128;
void attention_fwd(const AttnArgs& a, const float* q, const float* k, const float* v, float* out,
                   float* lse, cudaStream_t s);
// dq, dk, dv accumulate (+=). delta: scratch of n_heads * rows floats.
void attention_bwd(const AttnArgs& a, const float* q, const float* k, const float* v,
                   const float* out, const float* lse, const float* dout, float* dq, float* dk,
                   float* dv, float* delta, cudaStream_t s);
// first[row] = the first position in row's batch element with row's document id.
void doc_first(const int32_t* doc, int batch, int seq, int32_t* first, cudaStream_t s);
// Throws QLFT_ERR_INVALID_ARGUMENT for a shape the kernels (or the grid) cannot take.
void attention_check_args(const AttnArgs& a);
// delta[h * rows + row] = dout_row . out_row of head h (the backward's softmax correction).
void attention_delta(const AttnArgs& a, const float* out, const float* dout, float* delta,
                     cudaStream_t s);
// The same from fp32 out and bf16 dout (its values widened).
void attention_delta(const AttnArgs& a, const float* out, const uint16_t* dout16, float* delta,
                     cudaStream_t s);
// The same from bf16 out / dout.
void attention_delta16(const AttnArgs& a, const uint16_t* out16, const uint16_t* dout16,
                       float* delta, cudaStream_t s);

// ---- k_attention_tc.cu -----------------------------------------------------------------------
// Flash attention on tensor cores (nvcuda::wmma, bf16 16x16x16, fp32 accumulation): q, k, v and
// dout16 are bf16 (their bits, uint16_t) with AttnArgs' leading dimensions; head_dim one of
// 64, 80, 96, 128 (attention_tc_supported). The same contract as attention_fwd / attention_bwd,
// with P (forward and backward) and dS rounded to bf16 where they enter a product, as the CPU's
// bf16 attention rounds them; dQ is accumulated without atomics (deterministic).
bool attention_tc_supported(int head_dim);
// out (fp32, ld a.ldo) and, when out16 is not null, out rounded to bf16 (ld a.ldo); lse as
// attention_fwd's (may be null).
void attention_tc_fwd(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                      float* out, uint16_t* out16, float* lse, cudaStream_t s);
// dq, dk, dv accumulate (+=), fp32. out fp32 and dout16 (dout rounded to bf16, as autocast
// rounds it) for delta, scratch of n_heads * rows floats: no fp32 copy of dout.
void attention_tc_bwd(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                      const float* out, const uint16_t* dout16, const float* lse, float* dq,
                      float* dk, float* dv, float* delta, cudaStream_t s);
// The same with out given in bf16 (out16) and delta taken from out16 and dout16; dv16 not null:
// dv written rounded to bf16 there (ld a.ldv, overwritten) instead of added into dv.
void attention_tc_bwd16(const AttnArgs& a, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                        const uint16_t* out16, const uint16_t* dout16, const float* lse, float* dq,
                        float* dk, float* dv, float* delta, cudaStream_t s,
                        uint16_t* dv16 = nullptr);

// ---- k_decode.cu -----------------------------------------------------------------------------
// pos[i] = start + i for i < n.
void positions(int32_t* pos, int n, int32_t start, cudaStream_t s);
// *out = the index of the largest of x[0, n), the lowest on ties (NaN never wins; 0 if all are).
void argmax(const float* x, int64_t n, int32_t* out, cudaStream_t s);
// Backend::attention_decode: rows new query rows (q, out: leading dimensions ldq / ldo) over
// cache rows [0, past + rows) (dense, kv_dim floats a row), causal from past, sliding window.
// The scores scaled by scale (0: head_dim^-0.5) and soft-capped at softcap (0: none), as
// Backend::attention_decode_capped's.
struct DecodeArgs {
  int n_heads, n_kv_heads, head_dim;
  int past, window;
  int64_t rows, kv_dim, ldq, ldo;
  float scale = 0.f, softcap = 0.f;
};
void attention_decode(const DecodeArgs& a, const float* q, const float* k_cache,
                      const float* v_cache, float* out, cudaStream_t s);

// ---- k_xent.cu -------------------------------------------------------------------------------
// Per row of a logits chunk [rc, n] (columns p0 .. p0 + n of the vocabulary): merges the chunk
// into the row's online softmax state (m, sum) and records the target logit if it lies here.
// cap > 0: over the soft-capped logits cap * tanh(x / cap) (Gemma 2's final_logit_softcapping).
void ce_merge_panel(const float* logits, int64_t rc, int64_t n, int64_t p0, const int32_t* targets,
                    float* m, double* sum, float* target_logit, cudaStream_t s, float cap = 0.f);
// lse[i] = m[i] + log(sum[i]); loss_terms[i] = lse[i] - target_logit[i] (double), or 0 for a
// row whose target is ignore_index.
void ce_finish(const float* m, const double* sum, const float* target_logit, const int32_t* targets,
               int32_t ignore_index, int64_t rc, float* lse, double* loss_terms, cudaStream_t s);
// logits[i, j] = (softmax - onehot(target)) * grad_scale in place; 0 on ignored rows. cap > 0:
// softmax of the capped logits, the result times the cap's derivative 1 - tanh^2. out16 (not
// null, t BF16 / F16): the gradient written there rounded to t ([rc, n] compact, the operand of
// the bf16 dh GEMM) instead of in place.
void ce_grad_panel(float* logits, int64_t rc, int64_t n, int64_t p0, const int32_t* targets,
                   int32_t ignore_index, const float* lse, float grad_scale, cudaStream_t s,
                   float cap = 0.f, void* out16 = nullptr, TileType t = TileType::F32);
// acc[0] += the rc loss terms in row order, count[0] += rows whose target is not ignore_index
// (one thread: the CPU's summation order, so the loss is the same double).
void ce_sum(const double* loss_terms, const int32_t* targets, int64_t rc, int32_t ignore_index,
            double* acc, unsigned long long* count, cudaStream_t s);

// ---- k_optim.cu ------------------------------------------------------------------------------
// p16 (not null): the updated p also written rounded to bf16 (nearest even).
void adamw_torch(float* p, float* m, float* v, const float* g, int64_t n, const AdamWTorchCoeffs& c,
                 cudaStream_t s, uint16_t* p16 = nullptr);
// skipped: device int64 counter incremented per non-finite gradient element (nullptr: not
// counted; the trainer steps only finite gradients).
void adamw_bnb8(float* p, uint8_t* q1, uint8_t* q2, float* absmax1, float* absmax2, const float* g,
                int64_t n, const AdamBnbCoeffs& c, const float* code1, const float* code2,
                const uint8_t* lut1, const uint8_t* lut2, unsigned long long* skipped,
                cudaStream_t s);
void adamw_bnb32(float* p, float* m, float* v, const float* g, int64_t n, const AdamBnbCoeffs& c,
                 unsigned long long* skipped, cudaStream_t s);
// The bnb dynamic maps (signed for m, unsigned for v) and their quantization tables that
// adamw_bnb8 takes, resident on the device once per process (optim_entry.cu).
struct Bnb8Maps {
  const float *code1, *code2;
  const uint8_t *lut1, *lut2;
};
Bnb8Maps bnb8_maps();
// *out += sum of g[i]^2 (double).
void sum_squares(const float* g, int64_t n, double* out, cudaStream_t s);
void scale(float* g, int64_t n, float f, cudaStream_t s);
// *count += number of non-finite g[i].
void count_nonfinite(const float* g, int64_t n, unsigned long long* count, cudaStream_t s);

}  // namespace qlft::cu
