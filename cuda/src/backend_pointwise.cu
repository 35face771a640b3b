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
