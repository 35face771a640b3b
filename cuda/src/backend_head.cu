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
  // (At 16-bit tiles the table is kept in 16 bits: its rows are widened as they are gathered.)
  cu::dequant_rows(resident16(emb), T.as<int32_t>(), 0, out_.rows, O.data(), TileType::F32,
                   stream_);
  finish(O, out_.cols, out_);
}

void CudaBackend::head_logits(const QWeight& head, CMatF h, MatF logits) {
  op_checks::linear(head, h, logits.as_const(), "head_logits");
  if (h.rows == 0) return;
  resident16(head);  // (matmul_xwt's resident() then finds the 16-bit copy)
  // The runner's 16-bit h (begin_shared_input_16) as it is; else h, converted by matmul_xwt at
  // 16-bit tiles (which rounds as autocast would) or rounded by autocast for an fp32 GEMM.
  const uint16_t* h16 = shared_x16(h);
  if (h16 && !mine(h16, h.rows * h.cols * 2)) h16 = nullptr;  // (the runner's is device memory)
  Dev H;
  if (!h16) {
    H = in(h, h.cols, MemCategory::Activations, "head input");
    if (tile_ == TileType::F32) H = autocast(std::move(H), h.rows * h.cols);
  }
  Dev L = out(logits, head.rows, MemCategory::Activations, "head logits");
  matmul_xwt(head, H.as<float>(), h.rows, L.as<float>(), h16);
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
// At 16-bit tiles the GEMMs read 16-bit operands that their producers wrote: the head as it is
// kept (resident16: panels are row ranges of it, nothing dequantized), h from the runner's
// 16-bit copy (begin_shared_input_16; else each row chunk converted), the logits' gradient as
// k_ce_grad writes it.
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
  const bool low = tile_ != TileType::F32;
  const cu::DevWeight& dw = resident16(head);
  // The head's rows in the tile type as they lie on the device: panels are read in place.
  const bool head_tiled = (tile_ == TileType::BF16 && dw.kind == QuantKind::BF16) ||
                          (tile_ == TileType::F16 && dw.kind == QuantKind::F16);
  const uint16_t* h16 = low ? shared_x16(h) : nullptr;
  if (h16 && !mine(h16, M * H * 2)) h16 = nullptr;  // (the runner's is device memory)

  // h on the device: the runner's 16-bit copy, or h's fp32 values (converted a chunk at a time at
  // 16-bit tiles, which rounds as autocast would; rounded by autocast for an fp32 GEMM).
  Dev Hd;
  if (!h16) {
    Hd = in(h, H, MemCategory::Activations, "ce hidden");
    if (!low) Hd = autocast(std::move(Hd), M * H);
  }
  Dev Tg = in_raw(targets, M * 4, "ce targets");
  Dev DH;
  if (want_dh) DH = inout(dh, H, MemCategory::Activations, "ce hidden grads");
  DeviceMemory Tw;
  if (!head_tiled)
    Tw = dev(std::min(P, V) * H * int64_t(eb), MemCategory::Workspace, "ce head panel");
  DeviceMemory L = dev(Rc * std::min(P, V) * 4, MemCategory::Workspace, "ce logits chunk");
  DeviceMemory Lh;
  if (low && want_dh)
    Lh = dev(Rc * std::min(P, V) * 2, MemCategory::Workspace, "ce logits grad (16-bit)");
  DeviceMemory HCh;
  if (low && !h16) HCh = dev(Rc * H * 2, MemCategory::Workspace, "ce hidden (16-bit)");
  DeviceMemory DHC;
  if (want_dh) DHC = dev(Rc * H * 4, MemCategory::Workspace, "ce hidden grads chunk");
  DeviceMemory Mx = dev(Rc * 4, MemCategory::Workspace, "ce row max");
  DeviceMemory Sm = dev(Rc * 8, MemCategory::Workspace, "ce row sum");
  DeviceMemory TL = dev(Rc * 4, MemCategory::Workspace, "ce target logit");
  DeviceMemory LS = dev(Rc * 4, MemCategory::Workspace, "ce row lse");
  DeviceMemory LT = dev(Rc * 8, MemCategory::Workspace, "ce loss terms");
  DeviceMemory Acc = dev(16, MemCategory::Workspace, "ce loss sum and count");
  QLFT_CUDA_CHECK(cudaMemsetAsync(Acc.data(), 0, 16, stream_));

  // Rows p0 .. p0 + n of the head in the tile type.
  auto panel = [&](int64_t p0, int64_t n) -> const void* {
    if (head_tiled) return static_cast<const uint16_t*>(dw.data) + p0 * H;
    cu::dequant_rows(dw, nullptr, p0, n, Tw.data(), tile_, stream_);
    return Tw.data();
  };
  for (int64_t c0 = 0; c0 < M; c0 += Rc) {
    const int64_t rc = std::min(Rc, M - c0);
    const int32_t* tc = Tg.as<int32_t>() + c0;
    const void* hin = nullptr;
    if (h16) {
      hin = h16 + c0 * H;
    } else if (low) {
      cu::convert_tile(Hd.as<float>() + c0 * H, rc, H, H, HCh.data(), tile_, stream_);
      hin = HCh.data();
    } else {
      hin = Hd.as<float>() + c0 * H;
    }
    for (int64_t p0 = 0; p0 < V; p0 += P) {  // pass 1: online log-sum-exp
      const int64_t n = std::min(P, V - p0);
      const void* w = panel(p0, n);
      gemm_->run(rc, n, H, 1.f, {hin, tile_, H, false}, {w, tile_, H, true}, 0.f, L.as<float>(), n);
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
      const void* w = panel(p0, n);
      gemm_->run(rc, n, H, 1.f, {hin, tile_, H, false}, {w, tile_, H, true}, 0.f, L.as<float>(), n);
      // At 16-bit tiles the gradient is written rounded into Lh, the next GEMM's operand.
      cu::ce_grad_panel(L.as<float>(), rc, n, p0, tc, ignore_index, LS.as<float>(), grad_scale,
                        stream_, cap, low ? Lh.data() : nullptr, tile_);
      const void* lin = low ? Lh.data() : L.data();
      gemm_->run(rc, H, n, 1.f, {lin, tile_, n, false}, {w, tile_, H, false}, p0 == 0 ? 0.f : 1.f,
                 DHC.as<float>(), H);
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
