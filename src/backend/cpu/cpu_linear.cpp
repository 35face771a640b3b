// Quantized linear with LoRA: base GEMMs run panel by panel on dequantized weight rows; the LoRA
// path is thin GEMMs. Dropout on the LoRA input is recomputed from (seed, row, col).
// fp32 without dropout adds scale B A to the weight panels instead of running the rank-r GEMMs
// over the whole output, where that is cheaper (lora_merged, cpu_backend.h).
// Precision bf16 (what torch.autocast defines for a PEFT LoRA linear): every GEMM takes bf16
// operands and accumulates in fp32. The base GEMMs take x / dy and the weight panels rounded to
// bf16; the LoRA GEMMs take x (after dropout), dy, A and B rounded, and their fp32 intermediates
// xa = drop(x) A^T and g = dy B rounded again where they enter the next GEMM, as lora_A's bf16
// output enters lora_B. fp32 master weights, fp32 xa as kept for dB, fp32 outputs.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/dropout.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threads.h"

namespace qlft::cpu {

namespace {

// Rows per chunk when the dropped-out input has to be materialized.
int64_t drop_chunk_rows(const CpuBackend& be, int64_t cols) {
  return std::max<int64_t>(1, be.tune.drop_chunk_bytes / std::max<int64_t>(1, cols * 4));
}

// out[i, c] = keep(row0 + i, c) ? x[row0 + i, c] / (1 - p) : 0 for n rows.
void apply_dropout(CMatF x, int64_t row0, int64_t n, const LoraRef& l, float* out) {
  const float p = l.dropout_p, inv = 1.f / (1.f - p);
  const uint64_t seed = l.dropout_seed;
  const uint32_t threshold = lora_dropout_threshold(p);
  const int64_t C = x.cols;
  const VecKernels& vk = vec_kernels();
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x.row(row0 + i);
    float* o = out + i * C;
    vk.dropout_row(xr, C, seed, lora_dropout_row_base(l.dropout_row0 + row0 + i), threshold, inv,
                   o);
  }
}

// xa = drop(x) A^T, [rows, r] contiguous. xo is x as an operand (used when there is no dropout).
void lora_down(const OpGemm& mm, const LoraRef& l, CMatF x, const Operand& xo, const Operand& Ao,
               float* xa) {
  QLFT_PROFILE_SCOPE("lora_down");
  const CpuBackend& be = mm.be;
  const int64_t M = x.rows, K = x.cols;
  if (l.dropout_p == 0.f) {
    mm.gemm_thin(true, M, l.r, K, 1.f, xo.p, xo.ld, Ao.p, Ao.ld, 0.f, xa, l.r);
    return;
  }
  const int64_t R = std::min(M, drop_chunk_rows(be, K));
  Buffer xd = be.workspace(size_t(R * K) * 4, "lora dropout input");
  for (int64_t r0 = 0; r0 < M; r0 += R) {
    int64_t n = std::min(R, M - r0);
    apply_dropout(x, r0, n, l, xd.as<float>());
    Operand d = mm.operand(CMatF(xd.as<float>(), n, K), Scratch::Count, "lora dropout input");
    mm.gemm_thin(true, n, l.r, K, 1.f, d.p, d.ld, Ao.p, Ao.ld, 0.f, xa + r0 * l.r, l.r);
  }
}

// dB [N, r] += scale * dy^T xa over the M rows. On oneDNN's fp32 (OpGemm::thin_onednn) as
// dB^T = scale * xa^T dy into an [r, N] scratch added transposed: oneDNN runs the few-row output
// form faster. Precision bf16 likewise with CpuTuning::bf16_lora_db_rows.
void lora_dB(const OpGemm& mm, int64_t M, int64_t N, int r, float scale, const Operand& dyo,
             const Operand& xao, float* dB) {
  if (!mm.thin_onednn() && !(mm.lp && mm.be.tune.bf16_lora_db_rows)) {
    mm.gemm(true, false, N, r, M, scale, dyo.p, dyo.ld, xao.p, xao.ld, 1.f, dB, r);
    return;
  }
  Buffer t_buf = mm.be.scratch_buffer(size_t(N * r) * 4, "lora dB transposed");
  float* t = t_buf.as<float>();
  mm.gemm_grad(r, N, M, scale, xao.p, xao.ld, dyo.p, dyo.ld, 0.f, t, N);
  for (int64_t n = 0; n < N; ++n)
    for (int j = 0; j < r; ++j) dB[n * r + j] += t[j * N + n];
}

// The LoRA part of linear_bwd. dyo: dy as an operand.
// g_out: where g = dy B goes when the caller needs it (the fused dx GEMM), else scratch.
void lora_bwd(const OpGemm& mm, const QWeight& W, const LoraRef& l, CMatF x, const float* xa,
              const Operand& dyo, MatF dx, float* dA, float* dB, float* g_out = nullptr) {
  // (op profile: the rank-r products' share of linear_bwd)
  QLFT_PROFILE_SCOPE("lora_grads");
  op_checks::lora(l);
  const CpuBackend& be = mm.be;
  const int64_t M = x.rows, N = W.rows, K = W.cols;
  const bool want_dx = dx.data != nullptr;
  const int r = l.r;
  const Operand Ao = mm.operand(CMatF(l.A, r, K), Scratch::Count, "lora A");
  const Operand Bo = mm.operand(CMatF(l.B, N, r), Scratch::Count, "lora B");
  // g = dy B: [M, r]
  Buffer g_buf;
  if (!g_out) g_buf = be.scratch_buffer(size_t(M * r) * 4, "lora dy B");
  float* g = g_out ? g_out : g_buf.as<float>();
  mm.gemm_thin(false, M, r, N, 1.f, dyo.p, dyo.ld, Bo.p, Bo.ld, 0.f, g, r);
  const Operand go = mm.operand(CMatF(g, M, r), Scratch::Count, "lora dy B");

  // x as an operand, needed for dA without dropout and to recompute xa.
  Operand xo;
  LpMat x_own;
  const bool need_x = (dA && l.dropout_p == 0.f) || (dB && !xa);
  if (need_x && mm.lp)
    xo = mm.borrow(be.input_lp(x, Scratch::In, "lora input", x_own));
  else if (need_x)
    xo = mm.operand(x, Scratch::In, "lora input");
  if (dB) {
    Buffer xa_ws;
    if (!xa) {  // not kept by the caller: recompute it (same mask, same values)
      xa_ws = be.scratch_buffer(size_t(M * r) * 4, "lora xa");
      lora_down(mm, l, x, xo, Ao, xa_ws.as<float>());
      xa = xa_ws.as<float>();
    }
    const Operand xao = mm.operand(CMatF(xa, M, r), Scratch::Count, "lora xa");
    lora_dB(mm, M, N, r, l.scale, dyo, xao, dB);
  }

  if (l.dropout_p == 0.f) {
    if (dA) mm.gemm_grad(r, K, M, l.scale, go.p, go.ld, xo.p, xo.ld, 1.f, dA, K);
    if (want_dx)
      mm.gemm(false, false, M, K, r, l.scale, go.p, go.ld, Ao.p, Ao.ld, 1.f, dx.data, dx.stride);
    return;
  }

  // With dropout: chunks of rows. One pass over the mask per chunk builds drop(x) (for dA) and
  // adds the masked scale * (g A) / (1 - p) into dx.
  const int64_t R = std::min(M, drop_chunk_rows(be, K));
  Buffer xd_buf, t_buf;
  if (dA) xd_buf = be.scratch_buffer(size_t(R * K) * 4, "lora dropout input");
  if (want_dx) t_buf = be.scratch_buffer(size_t(R * K) * 4, "lora dx chunk");
  float* xd = xd_buf.as<float>();
  float* t = t_buf.as<float>();
  const float p = l.dropout_p, inv = 1.f / (1.f - p), s = l.scale * inv;
  const uint64_t seed = l.dropout_seed;
  const uint32_t threshold = lora_dropout_threshold(p);
  const VecKernels& vk = vec_kernels();
  for (int64_t r0 = 0; r0 < M; r0 += R) {
    const int64_t n = std::min(R, M - r0);
    // t = g_chunk A
    if (want_dx)
      mm.gemm(false, false, n, K, r, 1.f, mm.at(go, r0 * go.ld), go.ld, Ao.p, Ao.ld, 0.f, t, K);
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = r0 + i;
      const float* xr = x.row(row);
      float* xdr = dA ? xd + i * K : nullptr;
      float* dxr = want_dx ? dx.row(row) : nullptr;
      const float* tr = want_dx ? t + i * K : nullptr;
      vk.dropout_bwd_row(xr, tr, K, seed, lora_dropout_row_base(l.dropout_row0 + row), threshold,
                         inv, s, xdr, dxr);
    }
    // dA += scale * g_chunk^T drop(x)_chunk: [r, K]
    if (dA) {
      const Operand d = mm.operand(CMatF(xd, n, K), Scratch::Count, "lora dropout input");
      mm.gemm_grad(r, K, n, l.scale, mm.at(go, r0 * go.ld), go.ld, d.p, d.ld, 1.f, dA, K);
    }
  }
}

// y[i, :] += bias for every row (nothing without a bias).
void add_bias(MatF y, const float* bias) {
  if (!bias) return;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < y.rows; ++i) {
    float* yr = y.row(i);
    for (int64_t j = 0; j < y.cols; ++j) yr[j] += bias[j];
  }
}

// linear_fwd after the base GEMM: bias and the LoRA path. xo: x as an operand.
void linear_fwd_tail(const OpGemm& mm, const QWeight& W, const float* bias, const LoraRef* lora,
                     CMatF x, const Operand& xo, MatF y, float* xa) {
  const CpuBackend& be = mm.be;
  const int64_t M = x.rows, N = W.rows;
  add_bias(y, bias);
  if (!lora || lora->r == 0 || M == 0) return;
  op_checks::lora(*lora);
  const int r = lora->r;
  Buffer xa_ws;
  if (!xa) {
    xa_ws = be.scratch_buffer(size_t(M * r) * 4, "lora xa");
    xa = xa_ws.as<float>();
  }
  const Operand Ao = mm.operand(CMatF(lora->A, r, W.cols), Scratch::Count, "lora A");
  lora_down(mm, *lora, x, xo, Ao, xa);
  // y += scale * xa B^T
  const Operand Bo = mm.operand(CMatF(lora->B, N, r), Scratch::Count, "lora B");
  const Operand xao = mm.operand(CMatF(xa, M, r), Scratch::Count, "lora xa");
  mm.gemm(false, true, M, N, r, lora->scale, xao.p, xao.ld, Bo.p, Bo.ld, 1.f, y.data, y.stride);
}

// ---- the LoRA GEMMs of inner dimension r folded into the base GEMMs (precision bf16) ----------
// A GEMM with inner dimension r only reads and writes its [M, N] output: memory-bound, several
// times slower than the base GEMM's share of the same output. So y = x W^T + scale xa B^T runs
// as one GEMM of [x | xa | 0] and [W | scale B | 0], and dx += dy W + scale g A as one of
// [dy | g | 0] and [W ; scale A ; 0], the inner dimension padded to a multiple of 32 (oneDNN's
// AMX tiles; unpadded it loses more than it saves). When (lora_fusable): see cpu_backend.h;
// otherwise, and in the backward when W takes more than one panel, the separate GEMMs.

bool fusable(const LoraRef* l) {
  return l && lora_fusable(l->r, l->scale, l->dropout_p);
}

// cols [c0, c0 + cols) of each of m's rows (lp, row stride ld) = src [rows, cols] * s, rounded.
void put_lp(const OpGemm& mm, void* m, int64_t ld, int64_t c0, const float* src, int64_t rows,
            int64_t cols, float s) {
  const size_t eb = mm.elem_bytes();
  std::vector<float> t(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[size_t(j)] = s * src[i * cols + j];
    mm.convert(t.data(), static_cast<char*>(m) + size_t(i * ld + c0) * eb, size_t(cols));
  }
}

// y = x W^T + bias + scale x A^T B^T with x as xl (its columns [K, ld) free for xa), xa kept.
// With y16 (no bias): y's values rounded to bf16 there ([M, N] dense) by the GEMM itself, y
// untouched.
void linear_fwd_fused(const CpuBackend& be, const QWeight& W, const float* bias, const LoraRef& l,
                      CMatF x, const LpMat& xl, MatF y, float* xa, uint16_t* y16 = nullptr) {
  const OpGemm mm{be, true};
  const int64_t M = x.rows, N = W.rows, K = W.cols, Kp = xl.ld;
  const int r = l.r;
  Buffer xa_ws;
  if (!xa) {
    xa_ws = be.scratch_buffer(size_t(M * r) * 4, "lora xa");
    xa = xa_ws.as<float>();
  }
  {
    QLFT_PROFILE_SCOPE("lora_down");
    const Operand Ao = mm.operand(CMatF(l.A, r, K), Scratch::Count, "lora A");
    mm.gemm(false, true, M, r, K, 1.f, xl.data(), xl.ld, Ao.p, Ao.ld, 0.f, xa, r);
    // xl's spare columns are this call's (the shared copy's too: calls run one at a time).
    put_lp(mm, const_cast<void*>(xl.data()), Kp, K, xa, M, r, 1.f);
  }
  const int64_t P = std::min<int64_t>(
      N, std::max<int64_t>(1, be.tune.panel_bytes / (Kp * int64_t(mm.elem_bytes()))));
  ScratchLease panel =
      be.scratch(Scratch::Panel, size_t(P * Kp) * mm.elem_bytes(), "bf16 weight panel with LoRA B");
  for (int64_t p0 = 0; p0 < N; p0 += P) {
    const int64_t n = std::min(P, N - p0);
    dequant_panel_lp(be, W, p0, n, panel.data(), Kp);
    put_lp(mm, panel.data(), Kp, K, l.B + p0 * r, n, r, l.scale);
    const std::vector<float> zero(size_t(Kp - K - r), 0.f);
    for (int64_t i = 0; i < n; ++i)
      mm.convert(zero.data(),
                 static_cast<char*>(panel.data()) + size_t(i * Kp + K + r) * mm.elem_bytes(),
                 zero.size());
    if (y16)
      gemm_lp_out16(be, false, true, M, n, Kp, 1.f, xl.data(), Kp, panel.data(), Kp, y16 + p0, N);
    else
      mm.gemm(false, true, M, n, Kp, 1.f, xl.data(), Kp, panel.data(), Kp, 0.f, y.data + p0,
              y.stride);
  }
  if (!y16) add_bias(y, bias);
}

// fp32 y = x (W + scale B A)^T + bias (lora_merged), xa = x A^T when the caller keeps it.
void linear_fwd_merged(const CpuBackend& be, const QWeight& W, const float* bias, const LoraRef& l,
                       CMatF x, MatF y, float* xa) {
  op_checks::lora(l);
  if (xa) {
    const OpGemm mm{be, false};
    lora_down(mm, l, x, mm.operand(x, Scratch::Count, ""),
              mm.operand(CMatF(l.A, l.r, W.cols), Scratch::Count, ""), xa);
  }
  matmul_xwt(be, W, x, y, "linear_fwd", &l);
  add_bias(y, bias);
}

}  // namespace

void CpuBackend::linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x,
                            MatF y, float* xa) {
  QLFT_PROFILE_SCOPE("linear_fwd");
  if (precision_ != DType::BF16) {
    if (lora_merged(lora, x.rows, W.cols)) {
      linear_fwd_merged(*this, W, bias, *lora, x, y, xa);
      return;
    }
    matmul_xwt(*this, W, x, y, "linear_fwd");
    const OpGemm mm{*this, false};
    linear_fwd_tail(mm, W, bias, lora, x, mm.operand(x, Scratch::Count, ""), y, xa);
    return;
  }
  op_checks::linear(W, x, y.as_const(), "linear_fwd");
  // x rounded to bf16 once: the base GEMM and the LoRA down-projection both take it.
  LpMat x_own;
  if (fusable(lora) && x.rows > 0 && W.rows > 0) {
    op_checks::lora(*lora);
    const int64_t extra = fused_width(W.cols, lora->r, lp_bytes(*this)) - W.cols;
    const LpMat& xl = input_lp(x, Scratch::In, "bf16 linear input", x_own, extra);
    linear_fwd_fused(*this, W, bias, *lora, x, xl, y, xa);
    return;
  }
  const LpMat& xl = input_lp(x, Scratch::In, "bf16 linear input", x_own);
  matmul_xwt_lp(*this, W, xl, y);
  const OpGemm mm{*this, true};
  linear_fwd_tail(mm, W, bias, lora, x, mm.borrow(xl), y, xa);
}

void CpuBackend::linear_fwd_to_16(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x,
                                  MatF y, float* xa, DType t, uint16_t* y16) {
  QLFT_PROFILE_SCOPE("linear_fwd_to_16");
  if (precision_ != DType::BF16 || t != DType::BF16 || !bf16_onednn() || bias || !fusable(lora) ||
      x.rows == 0 || W.rows == 0) {
    Backend::linear_fwd_to_16(W, bias, lora, x, y, xa, t, y16);
    return;
  }
  op_checks::linear(W, x, y.as_const(), "linear_fwd_to_16");
  op_checks::lora(*lora);
  LpMat x_own;
  const int64_t extra = fused_width(W.cols, lora->r, lp_bytes(*this)) - W.cols;
  const LpMat& xl = input_lp(x, Scratch::In, "bf16 linear input", x_own, extra);
  linear_fwd_fused(*this, W, nullptr, *lora, x, xl, y, xa, y16);
}

int64_t CpuBackend::grad_16_stride(const QWeight& W, const LoraRef* lora) const {
  const bool fused =
      precision_ == DType::BF16 && W.rows > 0 && fusable(lora) && panel_rows_lp(*this, W) >= W.rows;
  return fused ? fused_width(W.rows, lora->r, lp_bytes(*this)) : W.rows;
}

bool CpuBackend::next_dx_16(DType t, uint16_t* dx16, const QWeight& W, const LoraRef* lora) {
  dx16_ = nullptr;
  if (!takes_input_16(t) || !bf16_onednn() || W.rows == 0 || !fusable(lora) ||
      panel_rows_lp(*this, W) < W.rows)
    return false;
  dx16_ = dx16;
  return true;
}

bool CpuBackend::defer_zero(float* dx, int64_t n) {
  if (precision_ != DType::BF16 || !dx) return false;
  take_pending_zero(MatF());  // (a deferral nobody took: zeroed)
  dx_pending_ = dx;
  dx_pending_n_ = n;
  return true;
}

bool CpuBackend::take_pending_zero(MatF dx) {
  QLFT_PROFILE_SCOPE("take_pending_zero");
  if (!dx_pending_) return false;
  float* p = dx_pending_;
  const int64_t n = dx_pending_n_;
  dx_pending_ = nullptr;
  if (dx.data == p && dx.stride == dx.cols && dx.rows * dx.cols == n) return true;
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int nt = n >= 2 * kChunk ? qlft::num_threads() : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i += kChunk) std::fill(p + i, p + std::min(n, i + kChunk), 0.f);
  return false;
}

void CpuBackend::linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa,
                            CMatF dy, MatF dx, float* dA, float* dB) {
  QLFT_PROFILE_SCOPE("linear_bwd");
  // next_dy_16's copy of dy: this call's alone (taken first, so no throw below leaves it).
  const View2<uint16_t> dy16 = std::exchange(dy16_, View2<uint16_t>());
  uint16_t* const dx16 = std::exchange(dx16_, nullptr);  // next_dx_16's, likewise
  const int64_t M = dy.rows, N = W.rows, K = W.cols;
  op_checks::linear_bwd(W, x, dy, dx.as_const());
  const bool want_dx = dx.data != nullptr;
  // dx as if zeroed (defer_zero): the first GEMM into it runs with beta 0.
  const bool fresh = take_pending_zero(dx);
  QLFT_CHECK_ARG(!dx16 || (fresh && precision_ == DType::BF16 && want_dx && N > 0 &&
                           fusable(lora) && panel_rows_lp(*this, W) >= N),
                 "linear_bwd: next_dx_16 needs the fused dx GEMM and dx handed to defer_zero");
  QLFT_CHECK_ARG(!dy16.data || (dy16.rows == M && dy16.cols == N && dy16.stride >= N),
                 "linear_bwd: next_dy_16's dy is [%lld, %lld], dy [%lld, %lld]",
                 (long long)dy16.rows, (long long)dy16.cols, (long long)M, (long long)N);
  if (M == 0) return;
  const bool has_lora = lora && lora->r > 0;

  if (precision_ == DType::BF16) {
    // dy rounded to bf16 once: the base dx GEMM and the LoRA GEMMs take it. With next_dy_16
    // it is that copy: borrowed as it is where it has the columns asked for (the spare ones
    // written in place), else copied (widened for sgemm).
    auto dy_lp = [&](int64_t extra) -> LpMat {
      if (!dy16.data) return to_lp(*this, dy, Scratch::Out, "bf16 linear output grad", extra);
      if (bf16_onednn() && dy16.stride >= N + extra) {
        LpMat m;
        m.rows = M;
        m.cols = N;
        m.ld = dy16.stride;
        m.bf16 = true;
        m.view = dy16.data;
        return m;
      }
      return lp_from_16(dy16.data, M, N, Scratch::Out, "bf16 linear output grad", extra,
                        dy16.stride);
    };
    const OpGemm mm{*this, true};
    const int64_t Np = has_lora ? fused_width(N, lora->r, lp_bytes(*this)) : N;
    if (want_dx && N > 0 && fusable(lora) && panel_rows_lp(*this, W) >= N) {
      // [dy | g | 0] [W ; scale A ; 0] in one GEMM (one panel): the LoRA gradients first,
      // which leave g for the spare columns.
      LpMat dyl = dy_lp(Np - N);
      const int r = lora->r;
      Buffer g = scratch_buffer(size_t(M * r) * 4, "lora dy B");
      lora_bwd(mm, W, *lora, x, xa, mm.borrow(dyl), MatF(), dA, dB, g.as<float>());
      put_lp(mm, const_cast<void*>(dyl.data()), dyl.ld, N, g.as<float>(), M, r, 1.f);
      if (dyl.view) {  // next_dy_16's copy: its spare columns past g zeroed here
        uint16_t* d = static_cast<uint16_t*>(const_cast<void*>(dyl.view));
        for (int64_t i = 0; i < M; ++i)
          std::fill(d + i * dyl.ld + N + r, d + i * dyl.ld + Np, uint16_t(0));
      }
      ScratchLease panel = scratch(Scratch::Panel, size_t(Np * K) * lp_bytes(*this),
                                   "bf16 linear_bwd weight panel with LoRA A");
      dequant_panel_lp(*this, W, 0, N, panel.data());
      char* extra_rows = static_cast<char*>(panel.data()) + size_t(N * K) * lp_bytes(*this);
      put_lp(mm, extra_rows, K, 0, lora->A, r, K, lora->scale);
      const std::vector<float> zero(size_t((Np - N - r) * K), 0.f);
      mm.convert(zero.data(), extra_rows + size_t(r * K) * lp_bytes(*this), zero.size());
      if (dx16)  // next_dx_16: rounded by the GEMM, dx unwritten
        gemm_lp_out16(*this, false, false, M, K, Np, 1.f, dyl.data(), dyl.ld, panel.data(), K, dx16,
                      K);
      else
        gemm_lp(*this, false, false, M, K, Np, 1.f, dyl.data(), dyl.ld, panel.data(), K,
                fresh ? 0.f : 1.f, dx.data, dx.stride);
      return;
    }
    LpMat dyl = dy_lp(0);
    if (want_dx && N > 0) {
      const int64_t P = panel_rows_lp(*this, W);
      ScratchLease panel =
          scratch(Scratch::Panel, size_t(P * K) * lp_bytes(*this), "bf16 linear_bwd weight panel");
      for (int64_t p0 = 0; p0 < N; p0 += P) {
        int64_t n = std::min(P, N - p0);
        dequant_panel_lp(*this, W, p0, n, panel.data());
        gemm_lp(*this, false, false, M, K, n, 1.f, lp_at(*this, dyl.data(), p0), dyl.ld,
                panel.data(), K, fresh && p0 == 0 ? 0.f : 1.f, dx.data, dx.stride);
      }
    } else if (fresh) {
      std::fill_n(dx.data, M * K, 0.f);  // (N == 0: no GEMM writes it)
    }
    if (!has_lora) return;
    lora_bwd(mm, W, *lora, x, xa, mm.borrow(dyl), dx, dA, dB);
    return;
  }

  if (fresh) std::fill_n(dx.data, M * K, 0.f);  // (defer_zero takes bf16 only)
  // dx += dy W, one panel of W rows (a slice of dy columns) at a time; merged: dy (W + s B A).
  const bool merged = want_dx && lora_merged(lora, M, N);
  if (merged) op_checks::lora(*lora);
  if (want_dx && N > 0) {
    const int64_t P = panel_rows(*this, W);
    ScratchLease panel = scratch(Scratch::Panel, size_t(P * K) * 4, "linear_bwd weight panel");
    float* pw = panel.as<float>();
    for (int64_t p0 = 0; p0 < N; p0 += P) {
      int64_t n = std::min(P, N - p0);
      dequant_panel(*this, W, p0, n, pw, merged ? lora : nullptr);
      sgemm(*this, false, false, M, K, n, 1.f, dy.data + p0, dy.stride, pw, K, 1.f, dx.data,
            dx.stride);
    }
  }
  if (!has_lora) return;
  const OpGemm mm{*this, false};
  lora_bwd(mm, W, *lora, x, xa, mm.operand(dy, Scratch::Count, ""), merged ? MatF() : dx, dA, dB);
}

void CpuBackend::head_logits(const QWeight& head, CMatF h, MatF logits) {
  QLFT_PROFILE_SCOPE("head_logits");
  matmul_xwt(*this, head, h, logits, "head_logits");
}

}  // namespace qlft::cpu
