// The CUDA backend's workspace model for the memory planner (backend/workspace_model.h), read off
// cuda/src/cuda_backend.cu's operations on device tensors (the runner's own: views, nothing
// staged but what is listed here) with the block sizes it allocates with (backend/cuda_sizes.h),
// each block rounded as the caching allocator rounds it. What an operation holds at once:
//  - autocast (bf16/fp16): a rounded fp32 copy of each matmul/attention input it reads;
//  - base GEMMs: the 16-bit input copy and one dequantized weight panel (kCudaPanelBytes of rows,
//    no more than the weight), freed before the LoRA GEMMs run;
//  - LoRA (its A/B and dA/dB are device copies the runner keeps): the dropout input, dy B;
//  - attention: the document-start table (forward), the softmax delta (backward);
//  - fused cross-entropy: the head panel (fp32 only: a 16-bit head is read in place), the logits
//    chunk (kCudaCeLogitsBytes over the panel's rows, at most every row), its gradient in 16
//    bits, the hidden rows' chunks (the 16-bit one only without the runner's copy) and per-row
//    statistics;
//  - for the backend's life: the cuBLASLt workspace (fixed()).
#include <algorithm>

#include "backend/cuda_sizes.h"
#include "backend/workspace_model.h"

namespace qlft {

namespace {

uint64_t dr(int64_t bytes) {  // a device block of `bytes`
  return cuda_alloc_round(static_cast<uint64_t>(std::max<int64_t>(bytes, 1)));
}
uint64_t round_block(uint64_t n) {
  return cuda_alloc_round(n);
}

class CudaWorkspace final : public WorkspaceModel {
 public:
  explicit CudaWorkspace(const WorkspaceModelSettings& s)
      : low_(is_low_precision(s.precision)),
        bf16_(s.precision == Precision::BF16),
        eb_(low_ ? 2 : 4),
        r_(s.lora_r),
        dropout_(s.dropout) {}

  bool device() const override { return true; }
  RoundFn round_fn() const override { return &round_block; }
  uint64_t fixed() const override { return dr(int64_t(kCudaLtWorkspaceBytes)); }

  uint64_t linear_fwd(int64_t N, int64_t K, int64_t M, bool lora, bool) const override {
    // bf16 without dropout: x's bf16 copy where the runner hands none over (a checkpointed
    // layer's recompute), then the weight panel, or the LoRA's bf16 xa (linear_fwd_to_16 runs it
    // first, linear_fwd after the panel): no fp32 copy.
    if (lora16()) return dr(M * K * 2) + std::max(panel(N, K), lora ? dr(M * r_ * 2) : 0);
    const uint64_t x = low_ ? dr(M * K * 4) : 0;  // autocast copy of x, held throughout
    const uint64_t base = (low_ ? dr(M * K * 2) : 0) + panel(N, K);
    const uint64_t lo = lora && dropout_ ? dr(M * K * 4) : 0;
    return x + std::max(base, lo);
  }

  uint64_t linear_bwd(int64_t N, int64_t K, int64_t M, bool lora, bool) const override {
    // bf16 without dropout: dy's bf16 copy where the runner hands none over (held throughout);
    // the weight panel, then (or before it, for a bf16 dx: next_dx_16) LoRA's bf16 dy B, x's
    // bf16 copy and xa's.
    if (lora16())
      return dr(M * N * 2) +
             std::max(panel(N, K), lora ? 2 * dr(M * r_ * 2) + dr(M * K * 2) : uint64_t(0));
    const uint64_t dy = low_ ? dr(M * N * 4) : 0;  // autocast copy of dy, held throughout
    const uint64_t base = (low_ ? dr(M * N * 2) : 0) + panel(N, K);
    uint64_t lo = 0;
    if (lora) {
      // dy B and x's autocast copy; with dropout, the dropout input (dA), then the dx LoRA term.
      lo = dr(M * r_ * 4) + (low_ ? dr(M * K * 4) : 0) + (dropout_ ? dr(M * K * 4) : 0);
    }
    return dy + std::max(base, lo);
  }

  // The inverse frequencies are uploaded once (weights); positions are the runner's.
  uint64_t rope(const ModelShapes&, int64_t) const override { return 0; }

  uint64_t attention_fwd(const ModelShapes& c, int64_t B, int64_t T) const override {
    const int64_t R = B * T;
    return stage(c, R) + dr(R * 4);  // + the document-start table
  }

  // (A checkpointed layer's: dout's bf16 copy on the tensor cores, which read nothing else of
  // it, delta included; its fp32 autocast copy for the fp32 kernels under bf16/fp16.)
  uint64_t attention_bwd(const ModelShapes& c, int64_t B, int64_t T) const override {
    const int64_t R = B * T, qd = c.q_dim();
    const uint64_t dout = tensor_cores(c) ? dr(R * qd * 2) : low_ ? dr(R * qd * 4) : 0;
    return stage(c, R) + dr(R * 4) + dout + dr(int64_t(c.n_heads) * R * 4);
  }

  // attention_bwd_16 on the tensor cores: the stored bf16 q / k / v / out read in place, fp32
  // dq and dk (dv written in bf16 by the kernel), the delta; dout's bf16 copy unless the o
  // projection's dx GEMM wrote it (next_dx_16: its weight in one panel).
  uint64_t attention_bwd_stored(const ModelShapes& c, int64_t B, int64_t T) const override {
    if (!lora16() || !tensor_cores(c)) return attention_bwd(c, B, T);
    const int64_t R = B * T, qd = c.q_dim(), kvd = c.kv_dim();
    const bool dout16 = c.dim <= panel_rows(qd);
    return dr(R * qd * 4) + dr(R * kvd * 4) + dr(R * 4) + dr(int64_t(c.n_heads) * R * 4) +
           (dout16 ? 0 : dr(R * qd * 2));
  }

  uint64_t cross_entropy(const ModelShapes& c, int64_t M) const override {
    const int64_t V = c.vocab, H = c.dim;
    const int64_t P = std::min(panel_rows(H), int64_t(V));
    const int64_t rc =
        std::clamp<int64_t>(kCudaCeLogitsBytes / (P * 4), 1, std::max<int64_t>(M, 1));
    uint64_t b = dr(rc * P * 4) + dr(rc * H * 4) + dr(rc * 4) + dr(rc * 8) + dr(rc * 4) +
                 dr(rc * 4) + dr(rc * 8) + dr(16);
    if (!low_) return b + dr(P * H * 4);  // the head panel (fp32 GEMMs)
    // 16-bit: the head read in place (the loaders' fp32 head kept in 16 bits), the logits'
    // gradient in 16 bits; h's row chunk converted unless the runner hands its 16-bit copy
    // (direct16(): bf16 without LoRA dropout, per-head q / k norms, post-block norms or experts).
    b += dr(rc * P * 2);
    if (!bf16_ || dropout_ || c.qk_norm() || c.post_norm() || c.any_moe()) b += dr(rc * H * 2);
    return b;
  }

 private:
  int64_t panel_rows(int64_t cols) const {
    return std::max<int64_t>(kCudaPanelMinRows, kCudaPanelBytes / std::max<int64_t>(1, cols * eb_));
  }
  // One dequantized panel of a weight [N, K]: no larger than the weight.
  uint64_t panel(int64_t N, int64_t K) const {
    return dr(std::min(panel_rows(K), std::max<int64_t>(N, 1)) * K * eb_);
  }
  // Attention's q, k, v as it reads them: autocast copies under bf16/fp16, bf16 ones for the
  // tensor cores (none where the runner hands its stored copies over).
  uint64_t stage(const ModelShapes& c, int64_t R) const {
    if (!low_) return 0;
    const int64_t qd = c.q_dim(), kvd = c.kv_dim(), eb = tensor_cores(c) ? 2 : 4;
    return dr(R * qd * eb) + 2 * dr(R * kvd * eb);
  }
  // bf16 with autocast on a head_dim the tensor-core kernels take (cuda_attention_tensor_cores).
  bool tensor_cores(const ModelShapes& c) const {
    const int d = c.head_dim;
    return bf16_ && (d == 64 || d == 80 || d == 96 || d == 128);
  }
  // LoRA and the base GEMMs on bf16 operands with the runner's 16-bit copies (no dropout).
  bool lora16() const { return bf16_ && !dropout_; }

  bool low_;    // bf16/fp16: 16-bit GEMM tiles and autocast copies
  bool bf16_;   // bf16: the runner hands 16-bit operands (CudaBackend::takes_input_16)
  int64_t eb_;  // bytes of a tile element
  int64_t r_;
  bool dropout_;
};

}  // namespace

std::unique_ptr<WorkspaceModel> make_cuda_workspace_model(const WorkspaceModelSettings& s) {
  return std::make_unique<CudaWorkspace>(s);
}

}  // namespace qlft
