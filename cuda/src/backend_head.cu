// CudaBackend's embedding lookup, head logits and the fused linear + cross-entropy over row
// chunks and vocabulary panels.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/op_checks.h"
#include "cuda_backend.h"

namespace qlft::cu {

void CudaBackend::embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out_) {
  op_checks::embedding(emb, out_.as_const());
  if (out_.rows == 0) return;
  // Ids in this backend's memory were checked where they were made (the runner's batch).
  if (!mine(tokens, out_.rows * 4)) op_checks::token_ids(tokens, out_.rows, emb.rows);
  Dev T = in_raw(tokens, out_.rows * 4, "embedding tokens");
  Dev O = out(out_, out_.cols, MemCategory::Activations, "embedding out");
  cu::dequant_rows(resident(emb), T.as<int32_t>(), 0, out_.rows, O.data(), TileType::F32, stream_);
  finish(O, out_.cols, out_);
}

void CudaBackend::head_logits(const QWeight& head, CMatF h, MatF logits) {
  op_checks::linear(head, h, logits.as_const(), "head_logits");
  if (h.rows == 0) return;
  Dev H = autocast(in(h, h.cols, MemCategory::Activations, "head input"), h.rows * h.cols);
  Dev L = out(logits, head.rows, MemCategory::Activations, "head logits");
  matmul_xwt(head, H.as<float>(), h.rows, L.as<float>());
  finish(L, head.rows, logits);
}

double CudaBackend::linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                                         int32_t ignore_index, float grad_scale, MatF dh,
                                         int64_t* count) {
  return cross_entropy_panels(head, h, targets, ignore_index, grad_scale, 0.f, dh, count);
}

double CudaBackend::linear_cross_entropy_capped(const QWeight& head, CMatF h,
                                                const int32_t* targets, int32_t ignore_index,
                                                float grad_scale, float cap, MatF dh,
                                                int64_t* count) {
  QLFT_CHECK_ARG(cap > 0 && std::isfinite(cap), "cross-entropy: cap %g must be finite and > 0",
                 static_cast<double>(cap));
  return cross_entropy_panels(head, h, targets, ignore_index, grad_scale, cap, dh, count);
}

// Every row is computed; rows whose target is ignore_index contribute 0 to the loss and the
// gradient (the kernels mask them), so targets in device memory never come to the host. The
// loss is summed on the device in row order (the CPU's order): one 16-byte download. cap > 0:
// the logits are soft-capped where the kernels read them (both passes recompute the panel, so
// the cap's derivative needs no stored tanh).
double CudaBackend::cross_entropy_panels(const QWeight& head, CMatF h, const int32_t* targets,
                                         int32_t ignore_index, float grad_scale, float cap, MatF dh,
                                         int64_t* count) {
  const int64_t M = h.rows, V = head.rows, H = head.cols;
  op_checks::cross_entropy(head, h, dh.as_const());
  const bool want_dh = dh.data != nullptr;
  if (!mine(targets, M * 4)) op_checks::targets(targets, M, V, ignore_index);
  if (count) *count = 0;
  if (M == 0 || V == 0) return 0.0;
  const int64_t P = panel_rows(H);
  const int64_t Rc = std::clamp<int64_t>(kCeLogitsBytes / (std::min(P, V) * 4), 1, M);
  const size_t eb = cu::tile_elem_bytes(tile_);
  const cu::DevWeight& dw = resident(head);

  Dev Hd = autocast(in(h, H, MemCategory::Activations, "ce hidden"), M * H);
  Dev Tg = in_raw(targets, M * 4, "ce targets");
  Dev DH;
  if (want_dh) DH = inout(dh, H, MemCategory::Activations, "ce hidden grads");
  DeviceMemory Tw = dev(std::min(P, V) * H * int64_t(eb), MemCategory::Workspace, "ce head panel");
  DeviceMemory L = dev(Rc * std::min(P, V) * 4, MemCategory::Workspace, "ce logits chunk");
  DeviceMemory Lh;
  if (tile_ != TileType::F32)
    Lh = dev(Rc * std::min(P, V) * 2, MemCategory::Workspace, "ce logits chunk (16-bit)");
  DeviceMemory HCh;
  if (tile_ != TileType::F32) HCh = dev(Rc * H * 2, MemCategory::Workspace, "ce hidden (16-bit)");
  DeviceMemory DHC;
  if (want_dh) DHC = dev(Rc * H * 4, MemCategory::Workspace, "ce hidden grads chunk");
  DeviceMemory Mx = dev(Rc * 4, MemCategory::Workspace, "ce row max");
  DeviceMemory Sm = dev(Rc * 8, MemCategory::Workspace, "ce row sum");
  DeviceMemory TL = dev(Rc * 4, MemCategory::Workspace, "ce target logit");
  DeviceMemory LS = dev(Rc * 4, MemCategory::Workspace, "ce row lse");
  DeviceMemory LT = dev(Rc * 8, MemCategory::Workspace, "ce loss terms");
  DeviceMemory Acc = dev(16, MemCategory::Workspace, "ce loss sum and count");
  QLFT_CUDA_CHECK(cudaMemsetAsync(Acc.data(), 0, 16, stream_));

  for (int64_t c0 = 0; c0 < M; c0 += Rc) {
    const int64_t rc = std::min(Rc, M - c0);
    const float* hc = Hd.as<float>() + c0 * H;
    const int32_t* tc = Tg.as<int32_t>() + c0;
    const void* hin = hc;
    if (tile_ != TileType::F32) {
      cu::convert_tile(hc, rc, H, H, HCh.data(), tile_, stream_);
      hin = HCh.data();
    }
    for (int64_t p0 = 0; p0 < V; p0 += P) {  // pass 1: online log-sum-exp
      const int64_t n = std::min(P, V - p0);
      cu::dequant_rows(dw, nullptr, p0, n, Tw.data(), tile_, stream_);
      gemm_->run(rc, n, H, 1.f, {hin, tile_, H, false}, {Tw.data(), tile_, H, true}, 0.f,
                 L.as<float>(), n);
      cu::ce_merge_panel(L.as<float>(), rc, n, p0, tc, Mx.as<float>(), Sm.as<double>(),
                         TL.as<float>(), stream_, cap);
    }
    cu::ce_finish(Mx.as<float>(), Sm.as<double>(), TL.as<float>(), tc, ignore_index, rc,
                  LS.as<float>(), LT.as<double>(), stream_);
    cu::ce_sum(LT.as<double>(), tc, rc, ignore_index, Acc.as<double>(),
               reinterpret_cast<unsigned long long*>(Acc.as<double>() + 1), stream_);
    if (!want_dh) continue;
    for (int64_t p0 = 0; p0 < V; p0 += P) {  // pass 2: dh = (softmax - onehot) * s * panel
      const int64_t n = std::min(P, V - p0);
      cu::dequant_rows(dw, nullptr, p0, n, Tw.data(), tile_, stream_);
      gemm_->run(rc, n, H, 1.f, {hin, tile_, H, false}, {Tw.data(), tile_, H, true}, 0.f,
                 L.as<float>(), n);
      cu::ce_grad_panel(L.as<float>(), rc, n, p0, tc, ignore_index, LS.as<float>(), grad_scale,
                        stream_, cap);
      const void* lin = L.data();
      if (tile_ != TileType::F32) {
        cu::convert_tile(L.as<float>(), rc, n, n, Lh.data(), tile_, stream_);
        lin = Lh.data();
      }
      gemm_->run(rc, H, n, 1.f, {lin, tile_, n, false}, {Tw.data(), tile_, H, false},
                 p0 == 0 ? 0.f : 1.f, DHC.as<float>(), H);
    }
    cu::accumulate(DH.as<float>() + c0 * H, DHC.as<float>(), rc * H, stream_);
  }
  if (want_dh) finish(DH, H, dh);
  double acc[2];
  copy_down(acc, Acc.data(), 16);
  unsigned long long n_counted;
  std::memcpy(&n_counted, &acc[1], 8);
  if (count) *count = int64_t(n_counted);
  return acc[0];
}

}  // namespace qlft::cu
