// CudaBackend's pointwise operations: RMSNorm, RoPE (with its device frequency tables), SwiGLU.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include "backend/op_checks.h"
#include "cuda_backend.h"

namespace qlft::cu {

void CudaBackend::rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) {
  op_checks::same_shape(x, y.as_const(), "rmsnorm_fwd", "x", "y");
  const int64_t M = x.rows, C = x.cols;
  if (M == 0) return;
  Dev X = in(x, C, MemCategory::Activations, "rmsnorm x");
  Dev Wd = in_raw(w, C * 4, "rmsnorm weight");
  Dev Y = out(y, C, MemCategory::Activations, "rmsnorm y");
  Dev R = rstd ? out_raw(rstd, M * 4, MemCategory::Activations, "rmsnorm rstd")
               : scratch(M * 4, "rmsnorm rstd");
  cu::rmsnorm_fwd(X.as<float>(), Wd.as<float>(), eps, Y.as<float>(), R.as<float>(), M, C, stream_);
  finish(Y, C, y);
  if (rstd) finish_raw(R, rstd, M * 4);
}

void CudaBackend::rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) {
  op_checks::same_shape(x, dy, "rmsnorm_bwd", "x", "dy");
  op_checks::same_shape(x, dx.as_const(), "rmsnorm_bwd", "x", "dx");
  op_checks::rstd_given(rstd);
  const int64_t M = x.rows, C = x.cols;
  if (M == 0) return;
  Dev X = in(x, C, MemCategory::Activations, "rmsnorm x");
  Dev dY = in(dy, C, MemCategory::Activations, "rmsnorm dy");
  Dev DX = inout(dx, C, MemCategory::Activations, "rmsnorm dx");
  Dev Wd = in_raw(w, C * 4, "rmsnorm weight");
  Dev R = in_raw(rstd, M * 4, "rmsnorm rstd");
  cu::rmsnorm_bwd(X.as<float>(), Wd.as<float>(), R.as<float>(), dY.as<float>(), DX.as<float>(), M,
                  C, stream_);
  finish(DX, C, dx);
}

void CudaBackend::rmsnorm_bwd_16(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx,
                                 DType t, uint16_t* dx16) {
  const int64_t M = x.rows, C = x.cols;
  if (!takes_input_16(t) || dx.stride != C || M == 0)
    return Backend::rmsnorm_bwd_16(x, w, rstd, dy, dx, t, dx16);
  op_checks::same_shape(x, dy, "rmsnorm_bwd_16", "x", "dy");
  op_checks::same_shape(x, dx.as_const(), "rmsnorm_bwd_16", "x", "dx");
  op_checks::rstd_given(rstd);
  Dev X = in(x, C, MemCategory::Activations, "rmsnorm x");
  Dev dY = in(dy, C, MemCategory::Activations, "rmsnorm dy");
  Dev DX = inout(dx, C, MemCategory::Activations, "rmsnorm dx");
  Dev DX16 = out_raw(dx16, M * C * 2, MemCategory::Activations, "rmsnorm dx (16-bit)");
  Dev Wd = in_raw(w, C * 4, "rmsnorm weight");
  Dev R = in_raw(rstd, M * 4, "rmsnorm rstd");
  cu::rmsnorm_bwd16(X.as<float>(), Wd.as<float>(), R.as<float>(), dY.as<float>(), DX.as<float>(),
                    DX16.as<uint16_t>(), M, C, stream_);
  finish(DX, C, dx);
  finish_raw(DX16, dx16, M * C * 2);
}

void CudaBackend::rope(MatF x, const int32_t* pos, int n_heads, int head_dim,
                       const RopeFreqs& freqs, bool adjacent, bool inverse) {
  op_checks::rope(x.cols, n_heads, head_dim, freqs);
  if (x.rows == 0) return;
  const int64_t W = int64_t(n_heads) * head_dim;
  Dev X = inout(x, W, MemCategory::Activations, "rope x");
  Dev P = in_raw(pos, x.rows * 4, "rope positions");
  cu::rope(X.as<float>(), W, P.as<int32_t>(), inv_freq(freqs), freqs.scale, x.rows, n_heads,
           head_dim, adjacent, inverse, stream_);
  finish(X, W, x);
}

void CudaBackend::swiglu_fwd(CMatF gate, CMatF up, MatF out_) {
  op_checks::same_shape(gate, up, "swiglu_fwd", "gate", "up");
  op_checks::same_shape(gate, out_.as_const(), "swiglu_fwd", "gate", "out");
  const int64_t M = gate.rows, C = gate.cols;
  if (M == 0) return;
  Dev G = in(gate, C, MemCategory::Activations, "swiglu gate");
  Dev U = in(up, C, MemCategory::Activations, "swiglu up");
  Dev O = out(out_, C, MemCategory::Activations, "swiglu out");
  cu::swiglu_fwd(G.as<float>(), U.as<float>(), O.as<float>(), M * C, stream_);
  finish(O, C, out_);
}

void CudaBackend::swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) {
  op_checks::same_shape(gate, up, "swiglu_bwd", "gate", "up");
  op_checks::same_shape(gate, dout, "swiglu_bwd", "gate", "dout");
  op_checks::same_shape(gate, dgate.as_const(), "swiglu_bwd", "gate", "dgate");
  op_checks::same_shape(gate, dup.as_const(), "swiglu_bwd", "gate", "dup");
  const int64_t M = gate.rows, C = gate.cols;
  if (M == 0) return;
  Dev G = in(gate, C, MemCategory::Activations, "swiglu gate");
  Dev U = in(up, C, MemCategory::Activations, "swiglu up");
  Dev D = in(dout, C, MemCategory::Activations, "swiglu dout");
  Dev DG = out(dgate, C, MemCategory::Activations, "swiglu dgate");
  Dev DU = out(dup, C, MemCategory::Activations, "swiglu dup");
  cu::swiglu_bwd(G.as<float>(), U.as<float>(), D.as<float>(), DG.as<float>(), DU.as<float>(), M * C,
                 stream_);
  finish(DG, C, dgate);
  finish(DU, C, dup);
}

void CudaBackend::rmsnorm_fwd_16(CMatF x, const float* w, float eps, MatF y, float* rstd, DType t,
                                 uint16_t* y16) {
  const int64_t M = x.rows, C = x.cols;
  if (!takes_input_16(t) || (y.data && y.stride != C) || M == 0)
    return Backend::rmsnorm_fwd_16(x, w, eps, y, rstd, t, y16);
  Dev X = in(x, C, MemCategory::Activations, "rmsnorm x");
  Dev Wd = in_raw(w, C * 4, "rmsnorm weight");
  Dev Y = y.data ? out(y, C, MemCategory::Activations, "rmsnorm y") : Dev{};
  Dev Y16 = out_raw(y16, M * C * 2, MemCategory::Activations, "rmsnorm y (16-bit)");
  Dev R = rstd ? out_raw(rstd, M * 4, MemCategory::Activations, "rmsnorm rstd")
               : scratch(M * 4, "rmsnorm rstd");
  cu::rmsnorm_fwd16(X.as<float>(), nullptr, Wd.as<float>(), eps, Y.as<float>(), Y16.as<uint16_t>(),
                    R.as<float>(), M, C, stream_);
  if (y.data) finish(Y, C, y);
  finish_raw(Y16, y16, M * C * 2);
  if (rstd) finish_raw(R, rstd, M * 4);
}

void CudaBackend::add_rmsnorm_fwd_16(MatF x, const float* r, const float* w, float eps, float* rstd,
                                     DType t, uint16_t* y16) {
  const int64_t M = x.rows, C = x.cols;
  if (!takes_input_16(t) || x.stride != C || M == 0)
    return Backend::add_rmsnorm_fwd_16(x, r, w, eps, rstd, t, y16);
  Dev X = inout(x, C, MemCategory::Activations, "residual");
  Dev Rd = in_raw(r, M * C * 4, "residual addend");
  Dev Wd = in_raw(w, C * 4, "rmsnorm weight");
  Dev Y16 = out_raw(y16, M * C * 2, MemCategory::Activations, "rmsnorm y (16-bit)");
  Dev R = rstd ? out_raw(rstd, M * 4, MemCategory::Activations, "rmsnorm rstd")
               : scratch(M * 4, "rmsnorm rstd");
  cu::rmsnorm_fwd16(X.as<float>(), Rd.as<float>(), Wd.as<float>(), eps, nullptr, Y16.as<uint16_t>(),
                    R.as<float>(), M, C, stream_);
  finish(X, C, x);
  finish_raw(Y16, y16, M * C * 2);
  if (rstd) finish_raw(R, rstd, M * 4);
}

void CudaBackend::rope_to_16(MatF x, const int32_t* pos, int n_heads, int head_dim,
                             const RopeFreqs& freqs, bool adjacent, DType t, uint16_t* x16) {
  op_checks::rope(x.cols, n_heads, head_dim, freqs);
  if (!takes_input_16(t) || x.rows == 0)
    return Backend::rope_to_16(x, pos, n_heads, head_dim, freqs, adjacent, t, x16);
  const int64_t W = int64_t(n_heads) * head_dim;
  Dev X = in(x.as_const(), W, MemCategory::Activations, "rope x");
  Dev X16 = out_raw(x16, x.rows * W * 2, MemCategory::Activations, "rope x (16-bit)");
  Dev P = in_raw(pos, x.rows * 4, "rope positions");
  cu::rope16(X.as<float>(), W, X16.as<uint16_t>(), W, P.as<int32_t>(), inv_freq(freqs), freqs.scale,
             x.rows, n_heads, head_dim, adjacent, false, stream_);
  finish_raw(X16, x16, x.rows * W * 2);
}

void CudaBackend::swiglu_fwd_from_16(DType t, const uint16_t* g16, const uint16_t* u16,
                                     uint16_t* o16, int64_t rows, int64_t cols) {
  if (!takes_input_16(t) || rows * cols == 0)
    return Backend::swiglu_fwd_from_16(t, g16, u16, o16, rows, cols);
  const int64_t n = rows * cols;
  Dev G = in_raw(g16, n * 2, "swiglu gate (16-bit)");
  Dev U = in_raw(u16, n * 2, "swiglu up (16-bit)");
  Dev O = out_raw(o16, n * 2, MemCategory::Activations, "swiglu out (16-bit)");
  cu::swiglu_fwd16(G.as<uint16_t>(), U.as<uint16_t>(), O.as<uint16_t>(), n, stream_);
  finish_raw(O, o16, n * 2);
}

void CudaBackend::swiglu_bwd_to_16(DType t, const uint16_t* g16, const uint16_t* u16, CMatF dout,
                                   View2<uint16_t> dg16, View2<uint16_t> du16) {
  const int64_t M = dout.rows, C = dout.cols;
  if (!takes_input_16(t) || M == 0 || dg16.stride != du16.stride || dg16.rows != M ||
      du16.rows != M || dg16.cols != C || du16.cols != C)
    return Backend::swiglu_bwd_to_16(t, g16, u16, dout, dg16, du16);
  const int64_t ld = dg16.stride, bytes = ((M - 1) * ld + C) * 2;
  Dev G = in_raw(g16, M * C * 2, "swiglu gate (16-bit)");
  Dev U = in_raw(u16, M * C * 2, "swiglu up (16-bit)");
  Dev D = in(dout, C, MemCategory::Activations, "swiglu dout");
  Dev DG = out_raw(dg16.data, bytes, MemCategory::Activations, "swiglu dgate (16-bit)");
  Dev DU = out_raw(du16.data, bytes, MemCategory::Activations, "swiglu dup (16-bit)");
  cu::swiglu_bwd16(G.as<uint16_t>(), U.as<uint16_t>(), D.as<float>(), C, DG.as<uint16_t>(),
                   DU.as<uint16_t>(), ld, M, C, stream_);
  finish_raw(DG, dg16.data, bytes);
  finish_raw(DU, du16.data, bytes);
}

// The table's inverse frequencies on the device, uploaded once per distinct table. Dynamic NTK
// makes a new table per sequence length (each generated token): past kRopeDeviceTables the
// cache is emptied after a sync (no queued kernel still reads a freed table).
const float* CudaBackend::inv_freq(const RopeFreqs& f) {
  auto it = inv_freq_.find(f.inv_freq);
  if (it != inv_freq_.end()) return it->second.as<float>();
  if (inv_freq_.size() >= size_t(kRopeDeviceTables)) {
    sync();
    inv_freq_.clear();
  }
  const size_t half = f.inv_freq.size();
  DeviceMemory d(tracker_, MemCategory::Weights, half * 4, "rope frequencies");
  copy_up(d.data(), f.inv_freq.data(), int64_t(half) * 4);
  sync();  // the caller's table may not outlive the call
  return inv_freq_.emplace(f.inv_freq, std::move(d)).first->second.as<float>();
}

}  // namespace qlft::cu
