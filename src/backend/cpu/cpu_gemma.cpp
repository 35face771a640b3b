// Gemma's pointwise ops on the CPU backend: GeGLU with transformers' gelu_pytorch_tanh, and
// tanh soft-capping of the final logits (forward for head_logits, through the two-walk
// cross-entropy for the loss). Attention's soft-cap lives in the attention tiles
// (cpu_attention.cpp). Plain loops: the MLP's GEMMs and the head's dominate them.
#include <algorithm>
#include <cmath>

#include "backend/activation_math.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_glu.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threads.h"

namespace qlft::cpu {

void CpuBackend::geglu_fwd(CMatF gate, CMatF up, MatF out) {
  QLFT_PROFILE_SCOPE("geglu_fwd");
  glu_fwd_rows("geglu_fwd", gate, up, out, [](const float* g, const float* u, float* o, int64_t C) {
    for (int64_t j = 0; j < C; ++j) o[j] = gelu_tanh(g[j]) * u[j];
  });
}

void CpuBackend::geglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) {
  QLFT_PROFILE_SCOPE("geglu_bwd");
  glu_bwd_rows("geglu_bwd", gate, up, dout, dgate, dup,
               [](const float* g, const float* u, const float* d, float* dg, float* du, int64_t C) {
                 for (int64_t j = 0; j < C; ++j) {
                   float a, da;
                   gelu_tanh_and_grad(g[j], a, da);
                   dg[j] = d[j] * u[j] * da;
                   du[j] = d[j] * a;
                 }
               });
}

void CpuBackend::softcap(MatF x, float cap) {
  QLFT_PROFILE_SCOPE("softcap");
  QLFT_CHECK_ARG(cap > 0 && std::isfinite(cap), "softcap: cap %g must be finite and > 0",
                 static_cast<double>(cap));
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < x.rows; ++i) {
    float* r = x.row(i);
    for (int64_t j = 0; j < x.cols; ++j) r[j] = cap * std::tanh(r[j] / cap);
  }
}

double CpuBackend::linear_cross_entropy_capped(const QWeight& head, CMatF h, const int32_t* targets,
                                               int32_t ignore_index, float grad_scale, float cap,
                                               MatF dh, int64_t* count) {
  QLFT_PROFILE_SCOPE("linear_cross_entropy_capped");
  QLFT_CHECK_ARG(cap > 0 && std::isfinite(cap), "cross-entropy: cap %g must be finite and > 0",
                 static_cast<double>(cap));
  // The one walk adds the target's -1 to dh in closed form, which the cap's derivative breaks:
  // the two walks (stats, then each panel's dlogits) with each logit capped in place.
  struct Reset {
    float& v;
    ~Reset() { v = 0.f; }
  } reset{ce_softcap_};
  ce_softcap_ = cap;
  return cross_entropy_loss(head, h, targets, ignore_index, grad_scale, dh, count, false);
}

}  // namespace qlft::cpu
