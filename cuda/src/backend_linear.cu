// CudaBackend's linear layers: base GEMM on dequantized panels plus the LoRA path, forward and
// backward.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include <algorithm>

#include "backend/op_checks.h"
#include "cuda_backend.h"

namespace qlft::cu {

void CudaBackend::linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x,
                             MatF y, float* xa) {
  const int64_t M = x.rows, K = W.cols, N = W.rows;
  op_checks::linear(W, x, y.as_const(), "linear_fwd");
  if (M == 0) return;
  // The runner's bf16 x where it handed one over (takes_input_16): the GEMMs read it as it is.
  const uint16_t* x16 = shared_x16(x);
  // Else x converted once to the tile type where nothing needs its fp32 values (the GEMMs'
  // operand; rounding first would give the same bf16 values).
  const bool lora_on = lora && lora->r > 0;
  Dev X, X16;
  if (!x16 && tile_ != TileType::F32 &&
      (!lora_on || (round_lora_bf16() && lora->dropout_p == 0.f))) {
    Dev Xf = in(x, K, MemCategory::Activations, "linear input");
    X16 = scratch(M * K * 2, "linear input (16-bit)");
    cu::convert_tile(Xf.as<float>(), M, K, K, X16.data(), tile_, stream_);
    x16 = X16.as<uint16_t>();
  }
  if (!x16) X = autocast(in(x, K, MemCategory::Activations, "linear input"), M * K);
  Dev Y = out(y, N, MemCategory::Activations, "linear output");
  matmul_xwt(W, X.as<float>(), M, Y.as<float>(), x16);
  if (bias) {
    Dev Bd = in_raw(bias, N * 4, "linear bias");
    cu::add_bias(Y.as<float>(), M, N, N, Bd.as<float>(), stream_);
  }
  // The runner's bf16 xa for this call (next_xa_16), taken by it.
  uint16_t* xa16 = h16_.xa16;
  h16_.xa16 = nullptr;
  if (lora && lora->r > 0) {
    op_checks::lora(*lora);
    const int r = lora->r;
    QLFT_CHECK_ARG(!x16 || lora->dropout_p == 0.f,
                   "linear_fwd: LoRA dropout reads the fp32 input, not its 16-bit copy");
    QLFT_CHECK_ARG(!xa16 || x16,
                   "linear_fwd: a 16-bit xa (next_xa_16) needs the 16-bit input (takes_input_16)");
    if (x16) {
      lora_fwd16(*lora, x16, M, N, K, Y.data(), TileType::F32, 1.f, xa, xa16);
    } else {
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
  }
  finish(Y, N, y);
}

// y16 = round(x W^T + round(scale * xa B^T)): the LoRA GEMM writes its term in bf16, then each
// weight panel's GEMM adds x W^T into its columns reading it (beta 1, C = D in bf16; cuBLASLt's C
// and D share one type, so an fp32 sum finished by the last GEMM could not be written in bf16).
// One rounding of the sum besides the LoRA term's own (PEFT under autocast rounds both terms
// and their sum), and no conversion kernel after the GEMMs.
void CudaBackend::linear_fwd_to_16(const QWeight& W, const float* bias, const LoraRef* lora,
                                   CMatF x, MatF y, float* xa, DType t, uint16_t* y16) {
  const int64_t M = x.rows, K = W.cols, N = W.rows;
  const bool lora_on = lora && lora->r > 0;
  if (!takes_input_16(t) || bias || (lora_on && lora->dropout_p != 0.f) || M == 0)
    return Backend::linear_fwd_to_16(W, bias, lora, x, y, xa, t, y16);
  op_checks::linear(W, x, y.as_const(), "linear_fwd_to_16");
  if (lora_on) op_checks::lora(*lora);
  const uint16_t* x16 = shared_x16(x);
  Dev X16;  // x converted once where the runner handed no 16-bit copy over
  if (!x16) {
    X16 = scratch(M * K * 2, "linear input (16-bit)");
    cu::convert_tile(in(x, K, MemCategory::Activations, "linear input").as<float>(), M, K, K,
                     X16.data(), tile_, stream_);
    x16 = X16.as<uint16_t>();
  }
  uint16_t* xa16 = h16_.xa16;  // the runner's bf16 xa (next_xa_16), taken by this call
  h16_.xa16 = nullptr;
  Dev Y16 = out_raw(y16, M * N * 2, MemCategory::Activations, "linear output (16-bit)");
  if (lora_on) lora_fwd16(*lora, x16, M, N, K, Y16.data(), tile_, 0.f, xa, xa16);
  const cu::DevWeight& dw = resident(W);
  const int64_t P = std::min(panel_rows(K), std::max<int64_t>(N, 1));
  DeviceMemory T = dev(P * K * 2, MemCategory::Workspace, "weight panel");
  const float beta = lora_on ? 1.f : 0.f;
  for (int64_t p0 = 0; p0 < N; p0 += P) {
    const int64_t n = std::min(P, N - p0);
    if (K > 0) cu::dequant_rows(dw, nullptr, p0, n, T.data(), tile_, stream_);
    gemm_->run(M, n, K, 1.f, {x16, tile_, K, false}, {T.data(), tile_, K, true}, beta,
               Y16.as<uint16_t>() + p0, tile_, N);
  }
  finish_raw(Y16, y16, M * N * 2);
}

bool CudaBackend::next_dx_16(DType t, uint16_t* dx16, const QWeight& W, const LoraRef* lora) {
  h16_.dx16 = nullptr;
  h16_.dx_w = nullptr;
  // Within one panel the base dx GEMM is the whole contraction, so it can finish the sum in
  // bf16; over several, each would round a partial sum (they keep fp32 and convert).
  const bool one_panel = W.rows <= panel_rows(W.cols);
  const bool lora_ok = !lora || lora->r == 0 || (round_lora_bf16() && lora->dropout_p == 0.f);
  if (!takes_input_16(t) || !dx16 || !one_panel || !lora_ok) return false;
  h16_.dx16 = dx16;
  h16_.dx_w = &W;
  return true;
}

void CudaBackend::linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa,
                             CMatF dy, MatF dx, float* dA, float* dB) {
  const int64_t M = dy.rows, N = W.rows, K = W.cols;
  op_checks::linear_bwd(W, x, dy, dx.as_const());
  const bool want_dx = dx.data != nullptr;
  if (M == 0) return;
  const bool has_lora = lora && lora->r > 0;
  if (has_lora) op_checks::lora(*lora);
  // The runner's bf16 dy and x where it handed them over (takes_input_16): read as they are,
  // and the LoRA GEMMs run on bf16 operands too (no dropout on that path: direct16()).
  const View2<uint16_t> d16 = h16_.dy16;
  h16_.dy16 = View2<uint16_t>();
  QLFT_CHECK_ARG(!d16.data || (d16.rows == M && d16.cols == N && d16.stride >= N),
                 "linear_bwd: the 16-bit dy is [%lld, %lld], dy [%lld, %lld]",
                 static_cast<long long>(d16.rows), static_cast<long long>(d16.cols),
                 static_cast<long long>(M), static_cast<long long>(N));
  const uint16_t* x16 = shared_x16(x);
  const bool lora16 = has_lora && round_lora_bf16() && lora->dropout_p == 0.f;
  const uint16_t* xa16 = h16_.xa16;  // the runner's bf16 xa (next_xa_16), taken by this call
  h16_.xa16 = nullptr;
  // dx in bf16 (next_dx_16, taken by this call): dx itself is neither read nor written.
  uint16_t* dx16 = h16_.dx16;
  const QWeight* dx_w = h16_.dx_w;
  h16_.dx16 = nullptr;
  h16_.dx_w = nullptr;
  QLFT_CHECK_ARG(!dx16 || (dx_w == &W && want_dx && (!has_lora || lora16)),
                 "linear_bwd: the 16-bit dx (next_dx_16) was asked for another call");
  QLFT_CHECK_ARG(!xa16 || lora16,
                 "linear_bwd: a 16-bit xa (next_xa_16) needs the bf16 LoRA path (no dropout)");
  // dy's fp32 (rounded) values only for fp32 GEMMs: the fp32 mode's, or the fp32 LoRA path's.
  Dev dY;
  if (!d16.data && (tile_ == TileType::F32 || (has_lora && !lora16)))
    dY = autocast(in(dy, N, MemCategory::Activations, "linear_bwd dy"), M * N);
  // dy in the tile type (the base dx GEMM's and the bf16 LoRA GEMMs' operand), row stride ldy:
  // converted once from dy (rounding first would give the same 16-bit values).
  DeviceMemory dYh;
  const void* dyp = d16.data ? static_cast<const void*>(d16.data) : dY.data();
  const int64_t ldy = d16.data ? d16.stride : N;
  if (!d16.data && tile_ != TileType::F32 && (want_dx || lora16)) {
    const Dev src = dY.data() ? view(dY.p) : in(dy, N, MemCategory::Activations, "linear_bwd dy");
    dYh = dev(M * N * 2, MemCategory::Workspace, "linear_bwd dy (16-bit)");
    cu::convert_tile(src.as<float>(), M, N, N, dYh.data(), tile_, stream_);
    dyp = dYh.data();
  }
  if (dx16) {  // dx16 = round(dy W + round(scale * g A)): the LoRA term first, then W's one panel
    Dev DX16 = out_raw(dx16, M * K * 2, MemCategory::Activations, "linear_bwd dx (16-bit)");
    if (lora16)
      lora_bwd16(*lora, x, x16, xa, xa16, dyp, ldy, M, N, K, DX16.data(), tile_, 0.f, dA, dB);
    DeviceMemory T =
        dev(std::max<int64_t>(N, 1) * K * 2, MemCategory::Workspace, "linear_bwd weight panel");
    if (N > 0) cu::dequant_rows(resident(W), nullptr, 0, N, T.data(), tile_, stream_);
    gemm_->run(M, K, N, 1.f, {dyp, tile_, ldy, false}, {T.data(), tile_, K, false},
               lora16 ? 1.f : 0.f, DX16.data(), tile_, K);
    finish_raw(DX16, dx16, M * K * 2);
    return;
  }
  Dev DX;
  if (want_dx) {
    DX = inout(dx, K, MemCategory::Activations, "linear_bwd dx");
    // dx += dy W, panel by panel of W rows (columns of dy).
    // A panel of at most kPanelBytes, and no larger than the weight itself.
    const int64_t P = std::min(panel_rows(K), std::max<int64_t>(N, 1));
    DeviceMemory T = dev(P * K * int64_t(cu::tile_elem_bytes(tile_)), MemCategory::Workspace,
                         "linear_bwd weight panel");
    const cu::DevWeight& dw = resident(W);
    const size_t eb = cu::tile_elem_bytes(tile_);
    for (int64_t p0 = 0; p0 < N; p0 += P) {
      const int64_t n = std::min(P, N - p0);
      cu::dequant_rows(dw, nullptr, p0, n, T.data(), tile_, stream_);
      gemm_->run(M, K, n, 1.f, {static_cast<const char*>(dyp) + p0 * eb, tile_, ldy, false},
                 {T.data(), tile_, K, false}, 1.f, DX.as<float>(), K);
    }
  }
  if (lora16) {
    lora_bwd16(*lora, x, x16, xa, xa16, dyp, ldy, M, N, K, want_dx ? DX.data() : nullptr,
               TileType::F32, 1.f, dA, dB);
  } else if (has_lora) {
    const LoraRef& l = *lora;
    const int r = l.r;
    Dev Ad = lora_operand(in_raw(l.A, int64_t(r) * K * 4, "lora A"), int64_t(r) * K);
    Dev Bd = lora_operand(in_raw(l.B, N * r * 4, "lora B"), N * r);
    // g = dy B: [M, r] (rounded under bf16: it only enters the dA and dx GEMMs)
    DeviceMemory G = dev(M * r * 4, MemCategory::Workspace, "lora dy B");
    gemm_->run(M, r, N, 1.f, f32(dY.data(), N, false), f32(Bd.data(), r, false), 0.f, G.as<float>(),
               r);
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
        cu::dropout_apply(X.as<float>(), M, K, K, l.dropout_row0, l.dropout_p, l.dropout_seed,
                          XD.as<float>(), stream_);
        xin = XD.as<float>();
      }
      Dev dAd = inout_raw(dA, int64_t(r) * K * 4, "lora dA");
      // dA += scale * g^T drop(x)
      gemm_->run(r, K, M, l.scale, f32(G.data(), r, true), f32(xin, K, false), 1.f, dAd.as<float>(),
                 K);
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
        cu::dropout_masked_add(DX.as<float>(), K, Tm.as<float>(), M, K, l.dropout_row0, l.dropout_p,
                               l.dropout_seed, l.scale / (1.f - l.dropout_p), stream_);
      }
    }
  }
  if (want_dx) finish(DX, K, dx);
}

void CudaBackend::lora_bwd16(const LoraRef& l, CMatF x, const uint16_t* x16, const float* xa,
                             const uint16_t* xa16, const void* dyb, int64_t ldy, int64_t M,
                             int64_t N, int64_t K, void* DX, TileType dxt, float dx_beta, float* dA,
                             float* dB) {
  const int r = l.r;
  Dev A16 = lora_factor16(l.A16, l.A, int64_t(r) * K, "lora A (16-bit)");
  Dev B16 = lora_factor16(l.B16, l.B, N * r, "lora B (16-bit)");
  // g = dy B: [M, r], fp32 sums of bf16 products, written in bf16 by its GEMM (the value the
  // dA / dx GEMMs read).
  Dev G16 = scratch(M * r * 2, "lora dy B (16-bit)");
  gemm_->run(M, r, N, 1.f, {dyb, tile_, ldy, false}, {B16.data(), tile_, r, false}, 0.f, G16.data(),
             tile_, r);
  Dev X16;  // x in the tile type, where the runner handed none over
  const void* xb = x16;
  if (!x16 && (dA || (dB && !xa && !xa16))) {
    X16 = scratch(M * K * 2, "linear_bwd x (16-bit)");
    Dev X = in(x, K, MemCategory::Activations, "linear_bwd x");
    cu::convert_tile(X.as<float>(), M, K, K, X16.data(), tile_, stream_);
    xb = X16.data();
  }
  if (dB) {
    Dev XA16;  // xa in bf16: the runner's, else converted from its fp32 xa, else made again
    if (xa16) {
      QLFT_CHECK_ARG(mine(xa16, M * r * 2), "linear_bwd: the 16-bit xa is not device memory");
      XA16 = view(xa16);
    } else if (xa) {
      XA16 = to_tile(in_raw(xa, M * r * 4, "lora xa"), M * r, "lora xa (16-bit)");
    } else {
      XA16 = scratch(M * r * 2, "lora xa (16-bit)");
      gemm_->run(M, r, K, 1.f, {xb, tile_, K, false}, {A16.data(), tile_, K, true}, 0.f,
                 XA16.data(), tile_, r);
    }
    Dev dBd = inout_raw(dB, N * r * 4, "lora dB");
    // dB += scale * dy^T xa
    gemm_->run(N, r, M, l.scale, {dyb, tile_, ldy, true}, {XA16.data(), tile_, r, false}, 1.f,
               dBd.as<float>(), r);
    finish_raw(dBd, dB, N * r * 4);
  }
  if (dA) {
    Dev dAd = inout_raw(dA, int64_t(r) * K * 4, "lora dA");
    // dA += scale * g^T x
    gemm_->run(r, K, M, l.scale, {G16.data(), tile_, r, true}, {xb, tile_, K, false}, 1.f,
               dAd.as<float>(), K);
    finish_raw(dAd, dA, int64_t(r) * K * 4);
  }
  // dx = dx_beta * dx + scale * g A
  if (DX)
    gemm_->run(M, K, r, l.scale, {G16.data(), tile_, r, false}, {A16.data(), tile_, K, false},
               dx_beta, DX, dxt, K);
}

void CudaBackend::lora_fwd16(const LoraRef& l, const uint16_t* x16, int64_t M, int64_t N, int64_t K,
                             void* Y, TileType yt, float beta, float* xa, uint16_t* xa16) {
  const int r = l.r;
  Dev A16 = lora_factor16(l.A16, l.A, int64_t(r) * K, "lora A (16-bit)");
  Dev B16 = lora_factor16(l.B16, l.B, N * r, "lora B (16-bit)");
  // xa = x A^T: fp32 sums of bf16 products, written in bf16 by the GEMM (the runner's stored
  // xa16, else scratch), which is the value the up-projection below and dB's GEMM read.
  Dev XA16;
  if (xa16) {
    QLFT_CHECK_ARG(mine(xa16, M * r * 2), "linear_fwd: the 16-bit xa is not device memory");
    XA16 = view(xa16);
  } else {
    XA16 = scratch(M * r * 2, "lora xa (16-bit)");
  }
  if (xa && !xa16) {  // the caller keeps the fp32 xa: written by the GEMM, then its bf16 copy
    Dev XA = out_raw(xa, M * r * 4, MemCategory::Activations, "lora xa");
    gemm_->run(M, r, K, 1.f, {x16, tile_, K, false}, {A16.data(), tile_, K, true}, 0.f,
               XA.as<float>(), r);
    cu::convert_tile(XA.as<float>(), M, r, r, XA16.data(), tile_, stream_);
    finish_raw(XA, xa, M * r * 4);
  } else {
    gemm_->run(M, r, K, 1.f, {x16, tile_, K, false}, {A16.data(), tile_, K, true}, 0.f, XA16.data(),
               tile_, r);
  }
  // y = beta * y + scale * xa B^T
  gemm_->run(M, N, r, l.scale, {XA16.data(), tile_, r, false}, {B16.data(), tile_, r, true}, beta,
             Y, yt, N);
}

Dev CudaBackend::lora_factor16(const uint16_t* p16, const float* p, int64_t n, const char* what) {
  if (p16 && mine(p16, n * 2)) return view(p16);  // kept beside the factor (LoraRef::A16 / B16)
  return to_tile(in_raw(p, n * 4, what), n, what);
}

Dev CudaBackend::to_tile(const Dev& d, int64_t n, const char* what) {
  Dev t = scratch(n * int64_t(cu::tile_elem_bytes(tile_)), what);
  cu::convert_tile(d.as<float>(), 1, n, n, t.data(), tile_, stream_);
  return t;
}

// xa = drop(x) A^T on the device.
void CudaBackend::lora_down(const LoraRef& l, const float* X, int64_t M, int64_t K, const float* A,
                            float* XA) {
  const float* xin = X;
  DeviceMemory XD;
  if (l.dropout_p > 0.f) {
    XD = dev(M * K * 4, MemCategory::Workspace, "lora dropout input");
    cu::dropout_apply(X, M, K, K, l.dropout_row0, l.dropout_p, l.dropout_seed, XD.as<float>(),
                      stream_);
    xin = XD.as<float>();
  }
  // XD goes back to the cache on return: work queued later on this stream runs after it.
  gemm_->run(M, l.r, K, 1.f, f32(xin, K, false), f32(A, K, true), 0.f, XA, l.r);
}

}  // namespace qlft::cu
