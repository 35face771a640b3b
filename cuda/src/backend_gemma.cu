// CudaBackend's Gemma ops (Backend's "Gemma's ops"): GeGLU and the final logits' soft-cap
// (k_gemma.cu). The attention's soft-cap and scale are AttnArgs fields (backend_attention.cu),
// the capped cross-entropy is the panels' walk with a cap (backend_head.cu), the capped decode
// attention is backend_decode.cu's.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include <cmath>

#include "backend/op_checks.h"
#include "cuda_backend.h"

namespace qlft::cu {

void CudaBackend::geglu_fwd(CMatF gate, CMatF up, MatF out_) {
  op_checks::same_shape(gate, up, "geglu_fwd", "gate", "up");
  op_checks::same_shape(gate, out_.as_const(), "geglu_fwd", "gate", "out");
  const int64_t M = gate.rows, C = gate.cols;
  if (M == 0) return;
  Dev G = in(gate, C, MemCategory::Activations, "geglu gate");
  Dev U = in(up, C, MemCategory::Activations, "geglu up");
  Dev O = out(out_, C, MemCategory::Activations, "geglu out");
  cu::geglu_fwd(G.as<float>(), U.as<float>(), O.as<float>(), M * C, stream_);
  finish(O, C, out_);
}

void CudaBackend::geglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) {
  op_checks::same_shape(gate, up, "geglu_bwd", "gate", "up");
  op_checks::same_shape(gate, dout, "geglu_bwd", "gate", "dout");
  op_checks::same_shape(gate, dgate.as_const(), "geglu_bwd", "gate", "dgate");
  op_checks::same_shape(gate, dup.as_const(), "geglu_bwd", "gate", "dup");
  const int64_t M = gate.rows, C = gate.cols;
  if (M == 0) return;
  Dev G = in(gate, C, MemCategory::Activations, "geglu gate");
  Dev U = in(up, C, MemCategory::Activations, "geglu up");
  Dev D = in(dout, C, MemCategory::Activations, "geglu dout");
  Dev DG = out(dgate, C, MemCategory::Activations, "geglu dgate");
  Dev DU = out(dup, C, MemCategory::Activations, "geglu dup");
  cu::geglu_bwd(G.as<float>(), U.as<float>(), D.as<float>(), DG.as<float>(), DU.as<float>(), M * C,
                stream_);
  finish(DG, C, dgate);
  finish(DU, C, dup);
}

void CudaBackend::softcap(MatF x, float cap) {
  QLFT_CHECK_ARG(cap > 0 && std::isfinite(cap), "softcap: cap %g must be finite and > 0",
                 static_cast<double>(cap));
  if (x.rows == 0 || x.cols == 0) return;
  Dev X = inout(x, x.cols, MemCategory::Activations, "softcap logits");
  cu::softcap(X.as<float>(), x.rows * x.cols, cap, stream_);
  finish(X, x.cols, x);
}

}  // namespace qlft::cu
