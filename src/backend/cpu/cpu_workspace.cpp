// The CPU backend's workspace model for the memory planner (backend/workspace_model.h): the
// largest scratch one of its kernels holds, from the tuning the trainer's backend runs
// (CpuTuning's defaults with QLFT_CPU_TUNE applied) and the thread count. Exact against the tracker
// for fp32/fp16 and for bf16 on sgemm (test_planner); bf16 on oneDNN is modelled, not exact (its
// scratchpads).
#include <algorithm>

#include "backend/cpu/attention_amx.h"
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
      : tune(cpu::tuning_from_env()),
        threads(std::max(s.threads, 1)),
        // fp16 autocasts (rounded fp32 copies of the inputs); bf16 runs the CPU backend's own
        // bf16 GEMMs (as the trainer sets it up), with 2-byte operands on oneDNN.
        autocast(s.precision == Precision::FP16),
        lp(s.precision == Precision::BF16),
        eb(lp && cpu::gemm_bf16_native() ? 2 : 4),
        r(s.lora_r),
        dropout(s.dropout),
        fused(lp && cpu::lora_fusable(s.lora_r, s.lora_scale, s.dropout ? 1.f : 0.f)) {}

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
  uint64_t linear_fwd(int64_t N, int64_t K, int64_t M, bool lora, bool) const override {
    const uint64_t drop = lora && dropout ? fl(drop_rows(M, K) * K) : 0;
    if (lp) {
      // x as lp (the shared copy is the same size); fused: x with xa's columns beside A's lp
      // copy and a panel of W with B's; else the lp panel, then A, the dropout chunk (fp32 and
      // lp), B and xa as lp.
      if (lora && fused) {
        const int64_t Kp = cpu::fused_width(K, r, size_t(eb));
        const int64_t P = std::min<int64_t>(N, std::max<int64_t>(1, tune.panel_bytes / (Kp * eb)));
        return lpm(M * Kp) + lpm(r * K) + lpm(P * Kp);
      }
      const uint64_t xl = lpm(M * K), base = xl + lpm(panel_rows_lp(N, K) * K);
      if (!lora) return base;
      const uint64_t A = lpm(r * K);
      const uint64_t down = xl + A + (dropout ? drop + lpm(drop_rows(M, K) * K) : 0);
      return std::max({base, down, xl + A + lpm(N * r) + lpm(M * r)});
    }
    const uint64_t ws = std::max(fl(panel_rows(N, K) * K), drop);
    return ws + (autocast ? fl(M * K) : 0);
  }
  // linear_bwd with dx wanted: the panel; then dy B beside dB^T (fp32 on oneDNN: lora_dB) and
  // then the dropout chunks (for dA and dx).
  uint64_t linear_bwd(int64_t N, int64_t K, int64_t M, bool lora, bool shared) const override {
    const uint64_t dBt = tune.f32_thin_onednn ? fl(N * r) : 0;
    const uint64_t lora_ws =
        lora ? fl(M * r) + std::max(dBt, dropout ? 2 * fl(drop_rows(M, K) * K) : 0) : 0;
    if (lp) {
      // The LoRA gradients hold A, B, g (fp32 and lp), x as lp (not with dropout, xa being
      // kept) and xa as lp; a shared x's copy stays for the other projections of its group.
      const uint64_t xl = lora && !dropout ? lpm(M * K) : 0, held = shared ? xl : 0;
      const uint64_t grads = lpm(r * K) + lpm(N * r) + fl(M * r) + lpm(M * r) + xl;
      if (lora && fused && panel_rows_lp(N, K) >= N) {  // [dy | g | 0] [W ; sA ; 0]
        const int64_t Np = cpu::fused_width(N, r, size_t(eb));
        const uint64_t dyl = lpm(M * Np);  // g (fp32) is the caller's here, counted in grads
        return std::max(dyl + grads + lpm(M * r), dyl + fl(M * r) + held + lpm(Np * K));
      }
      const uint64_t dyl = lpm(M * N), panel = dyl + lpm(panel_rows_lp(N, K) * K);
      if (!lora) return panel;
      const int64_t R = drop_rows(M, K);
      const uint64_t tail = dropout ? 2 * fl(R * K) + lpm(R * K) : 0;
      return std::max(panel + held, dyl + grads + std::max(lpm(M * r), tail));
    }
    const uint64_t ws = std::max(fl(panel_rows(N, K) * K), lora_ws);
    return ws + (autocast ? fl(M * K) + fl(M * N) : 0);
  }
  // The rope cos/sin table: one row per distinct position (positions 0 .. T-1 here).
  uint64_t rope(const ModelShapes& c, int64_t T) const override {
    return fl(T * (c.head_dim / 2) * 2);
  }
  // The AMX tile path (CpuTuning::attn_amx), where the trainer's backend would take it.
  bool attn_amx() const { return cpu::attn_amx_exec(tune, lp).has_value(); }
  uint64_t attention_fwd(const ModelShapes& c, int64_t B, int64_t T) const override {
    const int64_t R = B * T, bq = std::max<int64_t>(1, tune.attn_block_q);
    if (attn_amx()) {  // the operands packed for every head; scores per thread
      const cpu::AmxAttnGeometry g =
          cpu::amx_attn_geometry(int(B), int(T), c.n_heads, c.n_kv_heads, c.head_dim, bq);
      return rb(uint64_t(R) * 4) + rb(g.fwd_operands()) +
             rb(uint64_t(g.fwd_team(threads)) * g.fwd_thread());
    }
    const int64_t nqb = (T + bq - 1) / bq;
    const int64_t nt = std::min<int64_t>(threads, B * c.n_heads * nqb);
    const int64_t qd = c.q_dim(), kvd = c.kv_dim();
    // fp16: rounded fp32 copies of q, k, v; bf16: head-major lp copies, and per thread the
    // probabilities as lp and a dense output tile beside the fp32 scores.
    const int64_t tile = bq * T;
    const int64_t per = tile * 4 + (lp ? tile * eb + bq * c.head_dim * 4 : 0);
    const uint64_t copies = autocast ? fl(R * qd) + 2 * fl(R * kvd)
                            : lp     ? lpm(R * qd) + 2 * lpm(R * kvd)
                                     : 0;
    return rb(uint64_t(R) * 4) + rb(uint64_t(nt * per)) + copies;
  }
  uint64_t attention_bwd(const ModelShapes& c, int64_t B, int64_t T) const override {
    const int64_t R = B * T, bq = std::max<int64_t>(1, tune.attn_block_q);
    if (attn_amx()) {  // everything per thread (one KV head's packs and tiles)
      const cpu::AmxAttnGeometry g =
          cpu::amx_attn_geometry(int(B), int(T), c.n_heads, c.n_kv_heads, c.head_dim, bq);
      return rb(uint64_t(R) * 4) + rb(uint64_t(g.bwd_team(threads)) * g.bwd_thread());
    }
    const int64_t nt = std::min<int64_t>(threads, B * c.n_kv_heads);
    const int64_t qd = c.q_dim(), kvd = c.kv_dim();
    // As the forward, with dout too, and per thread P and dS as lp and dense dQ, dK, dV tiles.
    const int64_t tile = bq * T;
    const int64_t per =
        (2 * tile + bq) * 4 + (lp ? 2 * tile * eb + (bq + 2 * T) * c.head_dim * 4 : 0);
    const uint64_t copies = autocast ? 2 * fl(R * qd) + 2 * fl(R * kvd)
                            : lp     ? 2 * lpm(R * qd) + 2 * lpm(R * kvd)
                                     : 0;
    return rb(uint64_t(R) * 4) + rb(uint64_t(nt * per)) + copies;
  }
  // bf16 without dropout (the runner's direct16()): attention_bwd_16 holds RoPE's table too.
  uint64_t attention_bwd_stored(const ModelShapes& c, int64_t B, int64_t T) const override {
    return attention_bwd(c, B, T) + (lp && !dropout ? rope(c, T) : 0);
  }
  // Fused linear + cross-entropy with dh, every target trained (the most rows per chunk).
  uint64_t cross_entropy(const ModelShapes& c, int64_t R) const override {
    const int64_t V = c.vocab, H = c.dim, P = lp ? panel_rows_lp(V, H) : panel_rows(V, H);
    int64_t rc = std::min(tune.ce_logits_bytes / (P * 4),
                          tune.ce_hidden_bytes / std::max<int64_t>(1, H * 4));
    rc = std::clamp<int64_t>(rc, 1, R);
    const int64_t e = lp ? eb : 4;
    return rb(uint64_t(P * H * e)) + fl(rc * P) + rb(uint64_t(rc * H * e)) +
           (lp && eb == 2 ? rb(uint64_t(rc * P) * 2) : 0) + fl(rc * H) +
           rb(uint64_t(R) * sizeof(CrossEntropyRow)) + fl(R) + (autocast ? fl(R * H) : 0);
  }

 private:
  cpu::CpuTuning tune;
  int threads;
  bool autocast;  // fp16 (and bf16 without a native CPU path): rounded fp32 copies of inputs
  bool lp;        // bf16: the CPU backend's own bf16 GEMM operands
  int64_t eb;     // bytes of an lp element: 2 (oneDNN bf16) or 4 (rounded fp32 for sgemm)
  int r;
  bool dropout;
  bool fused;  // the LoRA GEMMs folded into the base ones (cpu::lora_fusable)
};

}  // namespace

std::unique_ptr<WorkspaceModel> make_cpu_workspace_model(const WorkspaceModelSettings& s) {
  return std::make_unique<CpuWorkspace>(s);
}

}  // namespace qlft
