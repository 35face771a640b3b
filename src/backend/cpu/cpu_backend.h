// The CPU backend: OpenBLAS sgemm on dequantized weight panels, OpenMP over rows and heads.
// Internal header shared by the cpu_*.cpp files; users go through make_cpu_backend().
//
// Determinism: every reduction runs in an order that depends only on the shapes (rows, panels,
// heads are split into fixed-size blocks, each block is one task computed sequentially, and
// cross-block sums run in block order), so results are identical across runs and across thread
// counts, given that OpenBLAS sgemm partitions M/N (not K) among its threads.
#pragma once

#include <cstdint>

#include "backend/backend.h"

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
};

class CpuBackend final : public Backend {
 public:
  CpuTuning tune;

  explicit CpuBackend(MemoryTracker* tracker) : Backend(tracker) {}
  const char* name() const override { return "cpu"; }

  void linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                  float* xa) override;
  void linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa, CMatF dy,
                  MatF dx, float* dA, float* dB) override;

  void rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) override;
  void rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) override;
  void rope(MatF x, const int32_t* pos, int n_heads, int head_dim, float theta, bool adjacent,
            bool inverse) override;
  void swiglu_fwd(CMatF gate, CMatF up, MatF out) override;
  void swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override;

  void attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out, float* lse) override;
  void attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out, const float* lse,
                     CMatF dout, MatF dq, MatF dk, MatF dv) override;

  void embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out) override;
  void head_logits(const QWeight& head, CMatF h, MatF logits) override;
  double linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                              int32_t ignore_index, float grad_scale, MatF dh,
                              int64_t* count) override;

  // A zeroed scratch buffer counted as workspace (throws QLFT_ERR_OUT_OF_MEMORY past the limit).
  Buffer workspace(size_t bytes, const char* what) const {
    return Buffer(tracker_, MemCategory::Workspace, bytes, what);
  }
};

// ---- helpers shared by the kernels (cpu_common.cpp) ----------------------------------------

// Rows of a weight dequantized at once: about tune.panel_bytes of floats, clamped.
int64_t panel_rows(const CpuBackend& be, const QWeight& W);
// Dequantizes rows [r0, r0 + n) of W into out (n * W.cols floats), split across threads.
void dequant_panel(const QWeight& W, int64_t r0, int64_t n, float* out);
// C[M, N] = alpha * op(A) op(B) + beta * C, row-major, through cblas_sgemm (checks int range).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// y[:, p] = x W[p, :]^T for every row p of W (overwrites y), panel by panel.
void matmul_xwt(const CpuBackend& be, const QWeight& W, CMatF x, MatF y, const char* what);

}  // namespace qlft::cpu
