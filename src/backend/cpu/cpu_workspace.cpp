// The CPU backend's workspace model for the memory planner (backend/workspace_model.h): the
// largest scratch one of its kernels holds, from CpuTuning's defaults (what the trainer's
// backend uses) and the thread count. Exact against the tracker for fp32/fp16 and for bf16 on
// sgemm (test_planner); bf16 on oneDNN is modelled, not exact.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/softmax_math.h"
#include "backend/workspace_model.h"

namespace qlft {

namespace {

constexpr auto rb = buffer_bytes;
constexpr auto fl = float_buffer_bytes;

class CpuWorkspace final : public WorkspaceModel {
 public:
  explicit CpuWorkspace(const WorkspaceModelSettings& s)
      : threads(std::max(s.threads, 1)),
        // fp16 autocasts (rounded fp32 copies of the inputs); bf16 runs the CPU backend's own
        // bf16 GEMMs (as the trainer sets it up), with 2-byte operands on oneDNN.
        autocast(s.precision == "fp16"),
        lp(s.precision == "bf16"),
        eb(lp && cpu::gemm_bf16_native() ? 2 : 4),
        r(s.lora_r),
        dropout(s.dropout) {}

  bool device() const override { return false; }

  int64_t panel_rows(int64_t rows, int64_t cols) const {
    int64_t p = tune.panel_bytes / std::max<int64_t>(1, cols * 4);
    p = std::clamp<int64_t>(p, std::max<int64_t>(1, tune.panel_min_rows),
                            std::max<int64_t>(1, tune.panel_max_rows));
    return std::min<int64_t>(p, std::max<int64_t>(rows, 1));
  }
  // As cpu::panel_rows_lp: the same bytes, so bf16 panels hold twice the rows.
  int64_t panel_rows_lp(int64_t rows, int64_t cols) const {
    int64_t p = tune.panel_bytes / std::max<int64_t>(1, cols * eb);
    const int64_t lo = std::max<int64_t>(1, tune.panel_min_rows);
    const int64_t hi = std::max<int64_t>(1, tune.panel_max_rows * (4 / eb));
    p = std::clamp<int64_t>(p, lo, std::max(lo, hi));
    return std::min<int64_t>(p, std::max<int64_t>(rows, 1));
  }
  uint64_t lpm(int64_t elems) const { return rb(uint64_t(elems) * eb); }
  int64_t drop_rows(int64_t M, int64_t K) const {
    return std::min(M, std::max<int64_t>(1, tune.drop_chunk_bytes / std::max<int64_t>(1, K * 4)));
  }
  // linear_fwd of W [N, K] on M rows with xa kept by the caller: the weight panel, then (apart
  // from it) the dropout chunk of the LoRA input; autocast holds a rounded copy of x.
  uint64_t linear_fwd(int64_t N, int64_t K, int64_t M, bool lora) const override {
    const uint64_t drop = lora && dropout ? fl(drop_rows(M, K) * K) : 0;
    if (lp) {
      // x as lp, with the lp panel; then x widened to fp32 for the LoRA GEMMs (a copy only
      // when lp holds bf16), briefly beside the lp x, then beside the dropout chunk.
      const uint64_t xl = lpm(M * K), xr = lora && eb == 2 ? fl(M * K) : 0;
      const uint64_t lora_part = lora ? std::max(xl + xr, (eb == 2 ? xr : xl) + drop) : 0;
      return std::max(xl + lpm(panel_rows_lp(N, K) * K), lora_part);
    }
    const uint64_t ws = std::max(fl(panel_rows(N, K) * K), drop);
    return ws + (autocast ? fl(M * K) : 0);
  }
  // linear_bwd with dx wanted: the panel; then dy B and the dropout chunks (for dA and dx).
  uint64_t linear_bwd(int64_t N, int64_t K, int64_t M, bool lora) const override {
    const uint64_t lora_ws = lora ? fl(M * r) + (dropout ? 2 * fl(drop_rows(M, K) * K) : 0) : 0;
    if (lp) {
      // dy as lp with the lp panel; for LoRA dy widened (a copy when lp is bf16) beside it,
      // then the lp dy goes and x rounded to fp32 joins for the LoRA gradients.
      const uint64_t dyl = lpm(M * N), dyr = eb == 2 ? fl(M * N) : 0;
      const uint64_t lora_part =
          lora ? std::max(dyl + dyr, (eb == 2 ? dyr : dyl) + fl(M * K) + lora_ws) : 0;
      return std::max(dyl + lpm(panel_rows_lp(N, K) * K), lora_part);
    }
    const uint64_t ws = std::max(fl(panel_rows(N, K) * K), lora_ws);
    return ws + (autocast ? fl(M * K) + fl(M * N) : 0);
  }
  // The rope cos/sin table: one row per distinct position (positions 0 .. T-1 here).
  uint64_t rope(const ModelConfig& c, int64_t T) const override {
    return fl(T * (c.head_dim / 2) * 2);
  }
  uint64_t attention_fwd(const ModelConfig& c, int64_t B, int64_t T) const override {
    const int64_t R = B * T, bq = std::max<int64_t>(1, tune.attn_block_q);
    const int64_t nqb = (T + bq - 1) / bq;
    const int64_t nt = std::min<int64_t>(threads, B * c.n_heads * nqb);
    const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
    const bool round = autocast || lp;  // attention inputs are rounded copies either way
    return rb(uint64_t(R) * 4) + fl(nt * bq * T) + (round ? fl(R * qd) + 2 * fl(R * kvd) : 0);
  }
  uint64_t attention_bwd(const ModelConfig& c, int64_t B, int64_t T) const override {
    const int64_t R = B * T, bq = std::max<int64_t>(1, tune.attn_block_q);
    const int64_t nt = std::min<int64_t>(threads, B * c.n_kv_heads);
    const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
    const bool round = autocast || lp;
    return rb(uint64_t(R) * 4) + fl(nt * (2 * bq * T + bq)) +
           (round ? 2 * fl(R * qd) + 2 * fl(R * kvd) : 0);
  }
  // Fused linear + cross-entropy with dh, every target trained (the most rows per chunk).
  uint64_t cross_entropy(const ModelConfig& c, int64_t R) const override {
    const int64_t V = c.vocab, H = c.dim, P = lp ? panel_rows_lp(V, H) : panel_rows(V, H);
    int64_t rc = std::min(tune.ce_logits_bytes / (P * 4),
                          tune.ce_hidden_bytes / std::max<int64_t>(1, H * 4));
    rc = std::clamp<int64_t>(rc, 1, R);
    const int64_t e = lp ? eb : 4;
    return rb(uint64_t(P * H * e)) + fl(rc * P) + rb(uint64_t(rc * H * e)) +
           (lp && eb == 2 ? rb(uint64_t(rc * P) * 2) : 0) + fl(rc * H) +
           rb(uint64_t(rc) * (sizeof(OnlineSoftmax<double>) + 8)) + (autocast ? fl(R * H) : 0);
  }

 private:
  cpu::CpuTuning tune;
  int threads;
  bool autocast;  // fp16 (and bf16 without a native CPU path): rounded fp32 copies of inputs
  bool lp;        // bf16: the CPU backend's own bf16 GEMM operands
  int64_t eb;     // bytes of an lp element: 2 (oneDNN bf16) or 4 (rounded fp32 for sgemm)
  int r;
  bool dropout;
};

}  // namespace

std::unique_ptr<WorkspaceModel> make_cpu_workspace_model(const WorkspaceModelSettings& s) {
  return std::make_unique<CpuWorkspace>(s);
}

}  // namespace qlft
