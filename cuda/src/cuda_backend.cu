// CudaBackend: the Backend interface on one CUDA device.
//
// The interface passes host arrays (the model code keeps activations in host buffers), so each
// call stages its inputs into device buffers from the caching allocator, runs the kernels and
// cuBLASLt GEMMs on the backend's stream, and copies the results back. Frozen base weights are
// uploaded once and stay resident (cached by QWeight address, shape and storage pointer).
// Keeping activations on the device needs device-resident tensors in the interface (a later
// step); the kernels below already work on device pointers only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "backend/cuda_entry.h"
#include "backend/rope_math.h"
#include "check.h"
#include "core/log.h"
#include "gemm.h"
#include "kernels.h"
#include "quant/ggml_types.h"

namespace qlft {

namespace cu {
bool kernels_loadable(std::string* why);  // k_probe.cu
}

namespace {

using cu::GemmOperand;
using cu::TileType;

constexpr int64_t kPanelBytes = int64_t(64) << 20;  // dequantized weight tile
constexpr int64_t kCeLogitsBytes = int64_t(256) << 20;

// A QWeight has no identity of its own: a weight destroyed and another built at the same address
// with its bytes at the same heap address (and the same shape) would find the old device copy.
// The fingerprint (kind, size and 64 evenly spaced 8-byte samples of the bytes) catches that in
// O(1); found by the CUDA emulator's run of test_cuda_ops (issue 17). A weight identity in
// QWeight would make it exact.
uint64_t weight_fingerprint(const QWeight& W) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(uint64_t(W.kind));
  mix(W.ggml_type);
  const size_t n = W.data.size();
  const uint8_t* b = static_cast<const uint8_t*>(W.data.data());
  mix(n);
  if (n >= 8)
    for (size_t i = 0; i < 64; ++i) {
      uint64_t v;
      std::memcpy(&v, b + (n - 8) * i / 63, 8);
      mix(v);
    }
  else
    for (size_t i = 0; i < n; ++i) mix(b[i]);
  return h;
}

struct ResidentWeight {
  const void* host_data = nullptr;
  uint64_t fingerprint = 0;
  int64_t rows = 0, cols = 0;
  cu::DevWeight w;
  DeviceMemory data, scales;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(MemoryTracker* tracker, const CudaBackendOptions& o) : Backend(tracker), opt_(o) {
    QLFT_CUDA_CHECK(cudaSetDevice(o.device));
    QLFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    tile_ = o.gemm_precision == "bf16"   ? TileType::BF16
            : o.gemm_precision == "fp16" ? TileType::F16
                                         : TileType::F32;
    gemm_ = std::make_unique<cu::LtGemm>(tracker, stream_);
  }
  ~CudaBackend() override {
    weights_.clear();
    gemm_.reset();
    if (stream_) QLFT_CUDA_WARN(cudaStreamDestroy(stream_));
  }
  const char* name() const override { return "cuda"; }

  // ---- linear ---------------------------------------------------------------------------------

  void linear_fwd(const QWeight& W, const float* bias, const LoraRef* lora, CMatF x, MatF y,
                  float* xa) override {
    const int64_t M = x.rows, K = W.cols, N = W.rows;
    QLFT_CHECK_ARG(x.cols == K && y.rows == M && y.cols == N,
                   "linear_fwd: x [%lld, %lld], weight [%lld, %lld], y [%lld, %lld]",
                   (long long)x.rows, (long long)x.cols, (long long)N, (long long)K,
                   (long long)y.rows, (long long)y.cols);
    if (M == 0) return;
    DeviceMemory X = upload(x, K, MemCategory::Activations, "linear input");
    DeviceMemory Y = dev(M * N * 4, MemCategory::Activations, "linear output");
    matmul_xwt(W, X.as<float>(), M, Y.as<float>());
    if (bias) {
      DeviceMemory Bd = upload_vec(bias, N, "linear bias");
      cu::add_bias(Y.as<float>(), M, N, N, Bd.as<float>(), stream_);
    }
    if (lora && lora->r > 0) {
      check_lora(*lora);
      const int r = lora->r;
      DeviceMemory Ad = upload_vec(lora->A, int64_t(r) * K, "lora A");
      DeviceMemory Bd = upload_vec(lora->B, N * r, "lora B");
      DeviceMemory XA = dev(M * r * 4, MemCategory::Activations, "lora xa");
      lora_down(*lora, X.as<float>(), M, K, Ad.as<float>(), XA.as<float>());
      // y += scale * xa B^T
      gemm_->run(M, N, r, lora->scale, f32(XA.data(), r, false), f32(Bd.data(), r, true), 1.f,
                 Y.as<float>(), N);
      if (xa) copy_down(xa, XA.data(), M * r * 4);
    }
    download(Y, N, y);
  }

  void linear_bwd(const QWeight& W, const LoraRef* lora, CMatF x, const float* xa, CMatF dy,
                  MatF dx, float* dA, float* dB) override {
    const int64_t M = dy.rows, N = W.rows, K = W.cols;
    QLFT_CHECK_ARG(dy.cols == N && x.cols == K && x.rows == M,
                   "linear_bwd: shape mismatch: x [%lld, %lld], weight [%lld, %lld], dy [%lld, "
                   "%lld]",
                   (long long)x.rows, (long long)x.cols, (long long)N, (long long)K,
                   (long long)dy.rows, (long long)dy.cols);
    const bool want_dx = dx.data != nullptr;
    if (want_dx)
      QLFT_CHECK_ARG(dx.rows == M && dx.cols == K,
                     "linear_bwd: dx is [%lld, %lld], want [%lld, %lld]", (long long)dx.rows,
                     (long long)dx.cols, (long long)M, (long long)K);
    if (M == 0) return;
    const bool has_lora = lora && lora->r > 0;
    if (has_lora) check_lora(*lora);
    DeviceMemory dY = upload(dy, N, MemCategory::Activations, "linear_bwd dy");
    DeviceMemory DX;
    if (want_dx) {
      DX = upload(dx.as_const(), K, MemCategory::Activations, "linear_bwd dx");
      // dx += dy W, panel by panel of W rows (columns of dy).
      DeviceMemory dYh;
      const void* dyp = dY.data();
      if (tile_ != TileType::F32) {
        dYh = dev(M * N * 2, MemCategory::Workspace, "linear_bwd dy (16-bit)");
        cu::convert_tile(dY.as<float>(), M, N, N, dYh.data(), tile_, stream_);
        dyp = dYh.data();
      }
      const int64_t P = panel_rows(K);
      DeviceMemory T = dev(P * K * int64_t(cu::tile_elem_bytes(tile_)), MemCategory::Workspace,
                           "linear_bwd weight panel");
      const cu::DevWeight& dw = resident(W);
      const size_t eb = cu::tile_elem_bytes(tile_);
      for (int64_t p0 = 0; p0 < N; p0 += P) {
        const int64_t n = std::min(P, N - p0);
        cu::dequant_rows(dw, nullptr, p0, n, T.data(), tile_, stream_);
        gemm_->run(M, K, n, 1.f, {static_cast<const char*>(dyp) + p0 * eb, tile_, N, false},
                   {T.data(), tile_, K, false}, 1.f, DX.as<float>(), K);
      }
    }
    if (has_lora) {
      const LoraRef& l = *lora;
      const int r = l.r;
      DeviceMemory Ad = upload_vec(l.A, int64_t(r) * K, "lora A");
      DeviceMemory Bd = upload_vec(l.B, N * r, "lora B");
      // g = dy B: [M, r]
      DeviceMemory G = dev(M * r * 4, MemCategory::Workspace, "lora dy B");
      gemm_->run(M, r, N, 1.f, f32(dY.data(), N, false), f32(Bd.data(), r, false), 0.f,
                 G.as<float>(), r);
      DeviceMemory X;
      const bool need_x = dA || (dB && !xa);
      if (need_x) X = upload(x, K, MemCategory::Activations, "linear_bwd x");
      if (dB) {
        DeviceMemory XA = dev(M * r * 4, MemCategory::Workspace, "lora xa");
        if (xa) {
          copy_up(XA.data(), xa, M * r * 4);
        } else {
          lora_down(l, X.as<float>(), M, K, Ad.as<float>(), XA.as<float>());
        }
        DeviceMemory dBd = upload_vec(dB, N * r, "lora dB");
        // dB += scale * dy^T xa
        gemm_->run(N, r, M, l.scale, f32(dY.data(), N, true), f32(XA.data(), r, false), 1.f,
                   dBd.as<float>(), r);
        copy_down(dB, dBd.data(), N * r * 4);
      }
      if (dA) {
        DeviceMemory XD;
        const float* xin = X.as<float>();
        if (l.dropout_p > 0.f) {
          XD = dev(M * K * 4, MemCategory::Workspace, "lora dropout input");
          cu::dropout_apply(X.as<float>(), M, K, K, 0, l.dropout_p, l.dropout_seed, XD.as<float>(),
                            stream_);
          xin = XD.as<float>();
        }
        DeviceMemory dAd = upload_vec(dA, int64_t(r) * K, "lora dA");
        // dA += scale * g^T drop(x)
        gemm_->run(r, K, M, l.scale, f32(G.data(), r, true), f32(xin, K, false), 1.f,
                   dAd.as<float>(), K);
        copy_down(dA, dAd.data(), int64_t(r) * K * 4);
      }
      if (want_dx) {
        if (l.dropout_p == 0.f) {
          gemm_->run(M, K, r, l.scale, f32(G.data(), r, false), f32(Ad.data(), K, false), 1.f,
                     DX.as<float>(), K);
        } else {
          DeviceMemory Tm = dev(M * K * 4, MemCategory::Workspace, "lora dx");
          gemm_->run(M, K, r, 1.f, f32(G.data(), r, false), f32(Ad.data(), K, false), 0.f,
                     Tm.as<float>(), K);
          cu::dropout_masked_add(DX.as<float>(), K, Tm.as<float>(), M, K, 0, l.dropout_p,
                                 l.dropout_seed, l.scale / (1.f - l.dropout_p), stream_);
        }
      }
    }
    if (want_dx) download(DX, K, dx);
    sync();
  }

  // ---- pointwise ----------------------------------------------------------------------------

  void rmsnorm_fwd(CMatF x, const float* w, float eps, MatF y, float* rstd) override {
    check_same(x, y.as_const(), "rmsnorm_fwd");
    const int64_t M = x.rows, C = x.cols;
    if (M == 0) return;
    DeviceMemory X = upload(x, C, MemCategory::Activations, "rmsnorm x");
    DeviceMemory Wd = upload_vec(w, C, "rmsnorm weight");
    DeviceMemory Y = dev(M * C * 4, MemCategory::Activations, "rmsnorm y");
    DeviceMemory R = dev(M * 4, MemCategory::Activations, "rmsnorm rstd");
    cu::rmsnorm_fwd(X.as<float>(), Wd.as<float>(), eps, Y.as<float>(), R.as<float>(), M, C,
                    stream_);
    download(Y, C, y);
    if (rstd) copy_down(rstd, R.data(), M * 4);
  }

  void rmsnorm_bwd(CMatF x, const float* w, const float* rstd, CMatF dy, MatF dx) override {
    check_same(x, dy, "rmsnorm_bwd");
    check_same(x, dx.as_const(), "rmsnorm_bwd");
    QLFT_CHECK_ARG(rstd != nullptr, "rmsnorm_bwd: the forward pass's rstd is required");
    const int64_t M = x.rows, C = x.cols;
    if (M == 0) return;
    DeviceMemory X = upload(x, C, MemCategory::Activations, "rmsnorm x");
    DeviceMemory dY = upload(dy, C, MemCategory::Activations, "rmsnorm dy");
    DeviceMemory DX = upload(dx.as_const(), C, MemCategory::Activations, "rmsnorm dx");
    DeviceMemory Wd = upload_vec(w, C, "rmsnorm weight");
    DeviceMemory R = upload_vec(rstd, M, "rmsnorm rstd");
    cu::rmsnorm_bwd(X.as<float>(), Wd.as<float>(), R.as<float>(), dY.as<float>(), DX.as<float>(), M,
                    C, stream_);
    download(DX, C, dx);
  }

  void rope(MatF x, const int32_t* pos, int n_heads, int head_dim, float theta, bool adjacent,
            bool inverse) override {
    QLFT_CHECK_ARG(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be even, got %d",
                   head_dim);
    QLFT_CHECK_ARG(n_heads > 0 && int64_t(n_heads) * head_dim <= x.cols,
                   "rope: %d heads of %d do not fit rows of %lld", n_heads, head_dim,
                   (long long)x.cols);
    if (x.rows == 0) return;
    const int half = head_dim / 2;
    std::vector<float> inv(half);
    for (int i = 0; i < half; ++i) inv[i] = rope_inv_freq(theta, i, head_dim);
    const int64_t W = int64_t(n_heads) * head_dim;
    DeviceMemory X = upload(x.as_const(), W, MemCategory::Activations, "rope x");
    DeviceMemory P = upload_raw(pos, x.rows * 4, "rope positions");
    DeviceMemory F = upload_vec(inv.data(), half, "rope frequencies");
    cu::rope(X.as<float>(), W, P.as<int32_t>(), F.as<float>(), x.rows, n_heads, head_dim, adjacent,
             inverse, stream_);
    download(X, W, x);
  }

  void swiglu_fwd(CMatF gate, CMatF up, MatF out) override {
    check_same(gate, up, "swiglu_fwd");
    check_same(gate, out.as_const(), "swiglu_fwd");
    const int64_t M = gate.rows, C = gate.cols;
    if (M == 0) return;
    DeviceMemory G = upload(gate, C, MemCategory::Activations, "swiglu gate");
    DeviceMemory U = upload(up, C, MemCategory::Activations, "swiglu up");
    DeviceMemory O = dev(M * C * 4, MemCategory::Activations, "swiglu out");
    cu::swiglu_fwd(G.as<float>(), U.as<float>(), O.as<float>(), M * C, stream_);
    download(O, C, out);
  }

  void swiglu_bwd(CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup) override {
    check_same(gate, up, "swiglu_bwd");
    check_same(gate, dout, "swiglu_bwd");
    check_same(gate, dgate.as_const(), "swiglu_bwd");
    check_same(gate, dup.as_const(), "swiglu_bwd");
    const int64_t M = gate.rows, C = gate.cols;
    if (M == 0) return;
    DeviceMemory G = upload(gate, C, MemCategory::Activations, "swiglu gate");
    DeviceMemory U = upload(up, C, MemCategory::Activations, "swiglu up");
    DeviceMemory D = upload(dout, C, MemCategory::Activations, "swiglu dout");
    DeviceMemory DG = dev(M * C * 4, MemCategory::Activations, "swiglu dgate");
    DeviceMemory DU = dev(M * C * 4, MemCategory::Activations, "swiglu dup");
    cu::swiglu_bwd(G.as<float>(), U.as<float>(), D.as<float>(), DG.as<float>(), DU.as<float>(),
                   M * C, stream_);
    download(DG, C, dgate);
    download(DU, C, dup);
  }

  // ---- attention ------------------------------------------------------------------------------

  void attention_fwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, MatF out, float* lse) override {
    check_attn(s, q, k, v, "attention_fwd");
    QLFT_CHECK_ARG(out.rows == q.rows && out.cols >= int64_t(s.n_heads) * s.head_dim,
                   "attention_fwd: out shape does not match q");
    const int64_t rows = q.rows, Wq = int64_t(s.n_heads) * s.head_dim,
                  Wk = int64_t(s.n_kv_heads) * s.head_dim;
    AttnStage st = stage_attn(s, q, k, v);
    DeviceMemory O = dev(rows * Wq * 4, MemCategory::Activations, "attention out");
    DeviceMemory L = dev(int64_t(s.n_heads) * rows * 4, MemCategory::Activations, "attention lse");
    cu::AttnArgs a = args(s, Wq, Wk, st);
    cu::attention_fwd(a, st.Q.as<float>(), st.K.as<float>(), st.V.as<float>(), O.as<float>(),
                      L.as<float>(), stream_);
    download(O, Wq, out);
    if (lse) copy_down(lse, L.data(), int64_t(s.n_heads) * rows * 4);
  }

  void attention_bwd(const AttnShape& s, CMatF q, CMatF k, CMatF v, CMatF out, const float* lse,
                     CMatF dout, MatF dq, MatF dk, MatF dv) override {
    check_attn(s, q, k, v, "attention_bwd");
    QLFT_CHECK_ARG(out.rows == q.rows && dout.rows == q.rows && dq.rows == q.rows &&
                       dk.rows == k.rows && dv.rows == v.rows,
                   "attention_bwd: gradient shapes do not match q/k/v");
    QLFT_CHECK_ARG(lse != nullptr, "attention_bwd: the forward pass's lse is required");
    const int64_t rows = q.rows, Wq = int64_t(s.n_heads) * s.head_dim,
                  Wk = int64_t(s.n_kv_heads) * s.head_dim;
    AttnStage st = stage_attn(s, q, k, v);
    DeviceMemory O = upload(out, Wq, MemCategory::Activations, "attention out");
    DeviceMemory dO = upload(dout, Wq, MemCategory::Activations, "attention dout");
    DeviceMemory L = upload_vec(lse, int64_t(s.n_heads) * rows, "attention lse");
    DeviceMemory dQ = upload(dq.as_const(), Wq, MemCategory::Activations, "attention dq");
    DeviceMemory dK = upload(dk.as_const(), Wk, MemCategory::Activations, "attention dk");
    DeviceMemory dV = upload(dv.as_const(), Wk, MemCategory::Activations, "attention dv");
    DeviceMemory delta =
        dev(int64_t(s.n_heads) * rows * 4, MemCategory::Workspace, "attention delta");
    cu::AttnArgs a = args(s, Wq, Wk, st);
    cu::attention_bwd(a, st.Q.as<float>(), st.K.as<float>(), st.V.as<float>(), O.as<float>(),
                      L.as<float>(), dO.as<float>(), dQ.as<float>(), dK.as<float>(), dV.as<float>(),
                      delta.as<float>(), stream_);
    download(dQ, Wq, dq);
    download(dK, Wk, dk);
    download(dV, Wk, dv);
  }

  // ---- embedding and head ---------------------------------------------------------------------

  void embedding_fwd(const QWeight& emb, const int32_t* tokens, MatF out) override {
    QLFT_CHECK_ARG(out.cols == emb.cols, "embedding_fwd: output has %lld columns, embedding %lld",
                   (long long)out.cols, (long long)emb.cols);
    for (int64_t i = 0; i < out.rows; ++i)
      if (tokens[i] < 0 || tokens[i] >= emb.rows)
        throw_error(QLFT_ERR_INVALID_ARGUMENT,
                    "token id %d at position %lld is outside the vocabulary of %lld tokens",
                    tokens[i], (long long)i, (long long)emb.rows);
    if (out.rows == 0) return;
    DeviceMemory T = upload_raw(tokens, out.rows * 4, "embedding tokens");
    DeviceMemory O = dev(out.rows * out.cols * 4, MemCategory::Activations, "embedding out");
    cu::dequant_rows(resident(emb), T.as<int32_t>(), 0, out.rows, O.data(), TileType::F32, stream_);
    download(O, out.cols, out);
  }

  void head_logits(const QWeight& head, CMatF h, MatF logits) override {
    QLFT_CHECK_ARG(h.cols == head.cols && logits.rows == h.rows && logits.cols == head.rows,
                   "head_logits: shape mismatch");
    if (h.rows == 0) return;
    DeviceMemory H = upload(h, h.cols, MemCategory::Activations, "head input");
    DeviceMemory L = dev(h.rows * head.rows * 4, MemCategory::Activations, "head logits");
    matmul_xwt(head, H.as<float>(), h.rows, L.as<float>());
    download(L, head.rows, logits);
  }

  double linear_cross_entropy(const QWeight& head, CMatF h, const int32_t* targets,
                              int32_t ignore_index, float grad_scale, MatF dh,
                              int64_t* count) override {
    const int64_t M = h.rows, V = head.rows, H = head.cols;
    QLFT_CHECK_ARG(h.cols == H, "linear_cross_entropy: hidden has %lld columns, head %lld",
                   (long long)h.cols, (long long)H);
    const bool want_dh = dh.data != nullptr;
    if (want_dh)
      QLFT_CHECK_ARG(dh.rows == M && dh.cols == H, "linear_cross_entropy: dh shape mismatch");
    std::vector<int64_t> valid;
    std::vector<int32_t> vt;
    for (int64_t i = 0; i < M; ++i) {
      if (targets[i] == ignore_index) continue;
      if (targets[i] < 0 || targets[i] >= V)
        throw_error(QLFT_ERR_INVALID_ARGUMENT,
                    "target id %d at position %lld is outside the vocabulary of %lld tokens",
                    targets[i], (long long)i, (long long)V);
      valid.push_back(i);
      vt.push_back(targets[i]);
    }
    if (count) *count = int64_t(valid.size());
    if (valid.empty() || V == 0) return 0.0;
    const int64_t nv = int64_t(valid.size());
    const int64_t P = panel_rows(H);
    const int64_t Rc = std::clamp<int64_t>(kCeLogitsBytes / (std::min(P, V) * 4), 1, nv);
    const size_t eb = cu::tile_elem_bytes(tile_);
    const cu::DevWeight& dw = resident(head);

    DeviceMemory Tw =
        dev(std::min(P, V) * H * int64_t(eb), MemCategory::Workspace, "ce head panel");
    DeviceMemory L = dev(Rc * std::min(P, V) * 4, MemCategory::Workspace, "ce logits chunk");
    DeviceMemory Lh;
    if (tile_ != TileType::F32)
      Lh = dev(Rc * std::min(P, V) * 2, MemCategory::Workspace, "ce logits chunk (16-bit)");
    DeviceMemory HC = dev(Rc * H * 4, MemCategory::Workspace, "ce hidden rows");
    DeviceMemory HCh;
    if (tile_ != TileType::F32) HCh = dev(Rc * H * 2, MemCategory::Workspace, "ce hidden (16-bit)");
    DeviceMemory DHC;
    if (want_dh) DHC = dev(Rc * H * 4, MemCategory::Workspace, "ce hidden grads");
    DeviceMemory Tg = dev(Rc * 4, MemCategory::Workspace, "ce targets");
    DeviceMemory Mx = dev(Rc * 4, MemCategory::Workspace, "ce row max");
    DeviceMemory Sm = dev(Rc * 8, MemCategory::Workspace, "ce row sum");
    DeviceMemory TL = dev(Rc * 4, MemCategory::Workspace, "ce target logit");
    DeviceMemory LS = dev(Rc * 4, MemCategory::Workspace, "ce row lse");
    DeviceMemory LT = dev(Rc * 8, MemCategory::Workspace, "ce loss terms");
    std::vector<float> hrows(size_t(Rc * H)), grows(want_dh ? size_t(Rc * H) : 0);
    std::vector<double> terms(static_cast<size_t>(Rc));

    double loss = 0;
    for (int64_t c0 = 0; c0 < nv; c0 += Rc) {
      const int64_t rc = std::min(Rc, nv - c0);
      for (int64_t i = 0; i < rc; ++i)
        std::memcpy(&hrows[size_t(i * H)], h.row(valid[size_t(c0 + i)]), size_t(H) * 4);
      copy_up(HC.data(), hrows.data(), rc * H * 4);
      copy_up(Tg.data(), vt.data() + c0, rc * 4);
      const void* hin = HC.data();
      if (tile_ != TileType::F32) {
        cu::convert_tile(HC.as<float>(), rc, H, H, HCh.data(), tile_, stream_);
        hin = HCh.data();
      }
      for (int64_t p0 = 0; p0 < V; p0 += P) {  // pass 1: online log-sum-exp
        const int64_t n = std::min(P, V - p0);
        cu::dequant_rows(dw, nullptr, p0, n, Tw.data(), tile_, stream_);
        gemm_->run(rc, n, H, 1.f, {hin, tile_, H, false}, {Tw.data(), tile_, H, true}, 0.f,
                   L.as<float>(), n);
        cu::ce_merge_panel(L.as<float>(), rc, n, p0, Tg.as<int32_t>(), Mx.as<float>(),
                           Sm.as<double>(), TL.as<float>(), stream_);
      }
      cu::ce_finish(Mx.as<float>(), Sm.as<double>(), TL.as<float>(), rc, LS.as<float>(),
                    LT.as<double>(), stream_);
      copy_down(terms.data(), LT.data(), rc * 8);
      for (int64_t i = 0; i < rc; ++i) loss += terms[size_t(i)];  // row order, as the CPU
      if (!want_dh) continue;
      for (int64_t p0 = 0; p0 < V; p0 += P) {  // pass 2: dh = (softmax - onehot) * s * panel
        const int64_t n = std::min(P, V - p0);
        cu::dequant_rows(dw, nullptr, p0, n, Tw.data(), tile_, stream_);
        gemm_->run(rc, n, H, 1.f, {hin, tile_, H, false}, {Tw.data(), tile_, H, true}, 0.f,
                   L.as<float>(), n);
        cu::ce_grad_panel(L.as<float>(), rc, n, p0, Tg.as<int32_t>(), LS.as<float>(), grad_scale,
                          stream_);
        const void* lin = L.data();
        if (tile_ != TileType::F32) {
          cu::convert_tile(L.as<float>(), rc, n, n, Lh.data(), tile_, stream_);
          lin = Lh.data();
        }
        gemm_->run(rc, H, n, 1.f, {lin, tile_, n, false}, {Tw.data(), tile_, H, false},
                   p0 == 0 ? 0.f : 1.f, DHC.as<float>(), H);
      }
      copy_down(grows.data(), DHC.data(), rc * H * 4);
      for (int64_t i = 0; i < rc; ++i) {
        float* d = dh.row(valid[size_t(c0 + i)]);
        const float* g = &grows[size_t(i * H)];
        for (int64_t c = 0; c < H; ++c) d[c] += g[c];
      }
    }
    return loss;
  }

 private:
  struct AttnStage {
    DeviceMemory Q, K, V, doc, first;
  };

  // ---- staging --------------------------------------------------------------------------------

  DeviceMemory dev(int64_t bytes, MemCategory c, const char* what) {
    return DeviceMemory(tracker_, c, size_t(std::max<int64_t>(bytes, 1)), what);
  }
  // The first `cols` columns of m into a compact [rows, cols] device array.
  DeviceMemory upload(CMatF m, int64_t cols, MemCategory c, const char* what) {
    DeviceMemory d = dev(m.rows * cols * 4, c, what);
    if (m.rows > 0 && cols > 0)
      QLFT_CUDA_CHECK(cudaMemcpy2DAsync(d.data(), size_t(cols) * 4, m.data, size_t(m.stride) * 4,
                                        size_t(cols) * 4, size_t(m.rows), cudaMemcpyHostToDevice,
                                        stream_));
    return d;
  }
  DeviceMemory upload_vec(const float* p, int64_t n, const char* what) {
    return upload_raw(p, n * 4, what);
  }
  DeviceMemory upload_raw(const void* p, int64_t bytes, const char* what) {
    DeviceMemory d = dev(bytes, MemCategory::Workspace, what);
    copy_up(d.data(), p, bytes);
    return d;
  }
  void copy_up(void* d, const void* h, int64_t bytes) {
    if (bytes > 0)
      QLFT_CUDA_CHECK(cudaMemcpyAsync(d, h, size_t(bytes), cudaMemcpyHostToDevice, stream_));
  }
  // Synchronous: the host reads the result right after.
  void copy_down(void* h, const void* d, int64_t bytes) {
    if (bytes > 0)
      QLFT_CUDA_CHECK(cudaMemcpyAsync(h, d, size_t(bytes), cudaMemcpyDeviceToHost, stream_));
    sync();
  }
  // Compact [rows, cols] device array into the first `cols` columns of m.
  void download(const DeviceMemory& d, int64_t cols, MatF m) {
    if (m.rows > 0 && cols > 0)
      QLFT_CUDA_CHECK(cudaMemcpy2DAsync(m.data, size_t(m.stride) * 4, d.data(), size_t(cols) * 4,
                                        size_t(cols) * 4, size_t(m.rows), cudaMemcpyDeviceToHost,
                                        stream_));
    sync();
  }
  void sync() { QLFT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  static GemmOperand f32(const void* p, int64_t ld, bool trans) {
    return {p, TileType::F32, ld, trans};
  }

  // ---- weights --------------------------------------------------------------------------------

  const cu::DevWeight& resident(const QWeight& W) {
    auto it = weights_.find(&W);
    if (it != weights_.end() && it->second.host_data == W.data.data() &&
        it->second.rows == W.rows && it->second.cols == W.cols &&
        it->second.fingerprint == weight_fingerprint(W))
      return it->second.w;
    ResidentWeight rw;
    rw.host_data = W.data.data();
    rw.fingerprint = weight_fingerprint(W);
    rw.rows = W.rows;
    rw.cols = W.cols;
    cu::DevWeight& w = rw.w;
    w.kind = W.kind;
    w.ggml_type = W.ggml_type;
    w.rows = W.rows;
    w.cols = W.cols;
    w.blocksize = W.blocksize;
    if (W.kind == QuantKind::GGML) {
      const GgmlTypeTraits* t = ggml_type_traits(W.ggml_type);
      QLFT_CHECK_ARG(t && t->dequantizable, "cuda backend: unknown GGUF type %u", W.ggml_type);
      if (t->block == 1) {  // plain GGUF F32/F16/BF16 tensors kept as GGML: treat as such
        const GgmlType g = static_cast<GgmlType>(W.ggml_type);
        QLFT_CHECK_ARG(g == GgmlType::F32 || g == GgmlType::F16 || g == GgmlType::BF16,
                       "cuda backend: GGUF type %s is not supported on the device", t->name);
        w.kind = g == GgmlType::F32   ? QuantKind::F32
                 : g == GgmlType::F16 ? QuantKind::F16
                                      : QuantKind::BF16;
      }
    }
    rw.data = DeviceMemory(tracker_, MemCategory::Weights, std::max<size_t>(W.data.size(), 1),
                           "device weight");
    copy_up(rw.data.data(), W.data.data(), int64_t(W.data.size()));
    if (W.kind == QuantKind::NF4) {
      const int64_t nb = (W.numel() + W.blocksize - 1) / W.blocksize;
      std::vector<float> am(size_t(std::max<int64_t>(nb, 1)));
      for (int64_t b = 0; b < nb; ++b) am[size_t(b)] = W.nf4_block_absmax(b);
      rw.scales = DeviceMemory(tracker_, MemCategory::Weights, am.size() * 4, "device nf4 absmax");
      copy_up(rw.scales.data(), am.data(), nb * 4);
    } else if (W.kind == QuantKind::INT8) {
      rw.scales = DeviceMemory(tracker_, MemCategory::Weights, std::max<size_t>(W.scb.size(), 1),
                               "device int8 scales");
      copy_up(rw.scales.data(), W.scb.data(), int64_t(W.scb.size()));
    }
    sync();  // the host vectors above go out of scope
    w.data = rw.data.data();
    w.scales = rw.scales.as<float>();
    auto& slot = weights_[&W];
    slot = std::move(rw);
    return slot.w;
  }

  int64_t panel_rows(int64_t cols) const {
    const int64_t eb = int64_t(cu::tile_elem_bytes(tile_));
    return std::max<int64_t>(64, kPanelBytes / std::max<int64_t>(1, cols * eb));
  }

  // Y [M, N] = X W^T (X fp32 compact [M, K] on the device), panel by panel of W rows.
  void matmul_xwt(const QWeight& W, const float* X, int64_t M, float* Y) {
    const int64_t N = W.rows, K = W.cols;
    const cu::DevWeight& dw = resident(W);
    const void* xin = X;
    DeviceMemory Xh;
    if (tile_ != TileType::F32) {
      Xh = dev(M * K * 2, MemCategory::Workspace, "linear input (16-bit)");
      cu::convert_tile(X, M, K, K, Xh.data(), tile_, stream_);
      xin = Xh.data();
    }
    const int64_t P = std::min(panel_rows(K), std::max<int64_t>(N, 1));
    DeviceMemory T =
        dev(P * K * int64_t(cu::tile_elem_bytes(tile_)), MemCategory::Workspace, "weight panel");
    for (int64_t p0 = 0; p0 < N; p0 += P) {
      const int64_t n = std::min(P, N - p0);
      cu::dequant_rows(dw, nullptr, p0, n, T.data(), tile_, stream_);
      gemm_->run(M, n, K, 1.f, {xin, tile_, K, false}, {T.data(), tile_, K, true}, 0.f, Y + p0, N);
    }
    if (K == 0 && N > 0) QLFT_CUDA_CHECK(cudaMemsetAsync(Y, 0, size_t(M * N) * 4, stream_));
  }

  // xa = drop(x) A^T on the device.
  void lora_down(const LoraRef& l, const float* X, int64_t M, int64_t K, const float* A,
                 float* XA) {
    const float* xin = X;
    DeviceMemory XD;
    if (l.dropout_p > 0.f) {
      XD = dev(M * K * 4, MemCategory::Workspace, "lora dropout input");
      cu::dropout_apply(X, M, K, K, 0, l.dropout_p, l.dropout_seed, XD.as<float>(), stream_);
      xin = XD.as<float>();
    }
    gemm_->run(M, l.r, K, 1.f, f32(xin, K, false), f32(A, K, true), 0.f, XA, l.r);
    sync();  // XD is released (to the cache) on return; keep the stream order explicit
  }

  static void check_lora(const LoraRef& l) {
    QLFT_CHECK_ARG(l.r >= 0 && (l.r == 0 || (l.A && l.B)),
                   "linear: LoRA adapter with r = %d but no A/B", l.r);
    QLFT_CHECK_ARG(l.dropout_p >= 0.f && l.dropout_p < 1.f,
                   "linear: LoRA dropout must be in [0, 1), got %g", double(l.dropout_p));
  }
  static void check_same(CMatF a, CMatF b, const char* op) {
    QLFT_CHECK_ARG(a.rows == b.rows && a.cols == b.cols,
                   "%s: shapes [%lld, %lld] and [%lld, %lld] differ", op, (long long)a.rows,
                   (long long)a.cols, (long long)b.rows, (long long)b.cols);
  }
  static void check_attn(const AttnShape& s, CMatF q, CMatF k, CMatF v, const char* op) {
    QLFT_CHECK_ARG(s.batch > 0 && s.seq > 0 && s.n_heads > 0 && s.n_kv_heads > 0 &&
                       s.head_dim > 0 && s.n_heads % s.n_kv_heads == 0,
                   "%s: bad shape (batch %d, seq %d, heads %d, kv heads %d, head_dim %d)", op,
                   s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim);
    const int64_t rows = int64_t(s.batch) * s.seq;
    QLFT_CHECK_ARG(q.rows == rows && k.rows == rows && v.rows == rows &&
                       q.cols >= int64_t(s.n_heads) * s.head_dim &&
                       k.cols >= int64_t(s.n_kv_heads) * s.head_dim &&
                       v.cols >= int64_t(s.n_kv_heads) * s.head_dim,
                   "%s: q/k/v shapes do not match batch %d x seq %d with %d/%d heads of %d", op,
                   s.batch, s.seq, s.n_heads, s.n_kv_heads, s.head_dim);
    if (s.head_dim > cu::kAttnMaxHeadDim)
      throw_error(QLFT_ERR_UNSUPPORTED, "%s: head_dim %d is above the CUDA kernels' %d", op,
                  s.head_dim, cu::kAttnMaxHeadDim);
  }

  AttnStage stage_attn(const AttnShape& s, CMatF q, CMatF k, CMatF v) {
    const int64_t rows = q.rows;
    AttnStage st;
    st.Q = upload(q, int64_t(s.n_heads) * s.head_dim, MemCategory::Activations, "attention q");
    st.K = upload(k, int64_t(s.n_kv_heads) * s.head_dim, MemCategory::Activations, "attention k");
    st.V = upload(v, int64_t(s.n_kv_heads) * s.head_dim, MemCategory::Activations, "attention v");
    if (s.doc_ids) {
      // first[row]: the first position of the same document in this batch element (bounds the
      // key range of a query tile, as on the CPU).
      std::vector<int32_t> first(static_cast<size_t>(rows));
      for (int b = 0; b < s.batch; ++b) {
        std::unordered_map<int32_t, int32_t> seen;
        for (int t = 0; t < s.seq; ++t) {
          const int64_t row = int64_t(b) * s.seq + t;
          first[size_t(row)] = seen.emplace(s.doc_ids[row], t).first->second;
        }
      }
      st.doc = upload_raw(s.doc_ids, rows * 4, "attention doc ids");
      st.first = upload_raw(first.data(), rows * 4, "attention doc starts");
      sync();  // `first` is a local
    }
    return st;
  }

  static cu::AttnArgs args(const AttnShape& s, int64_t Wq, int64_t Wk, const AttnStage& st) {
    cu::AttnArgs a;
    a.batch = s.batch;
    a.seq = s.seq;
    a.n_heads = s.n_heads;
    a.n_kv_heads = s.n_kv_heads;
    a.head_dim = s.head_dim;
    a.ldq = Wq;
    a.ldo = Wq;
    a.ldk = Wk;
    a.ldv = Wk;
    a.doc = st.doc.as<int32_t>();
    a.first = st.first.as<int32_t>();
    return a;
  }

  CudaBackendOptions opt_;
  cudaStream_t stream_ = nullptr;
  TileType tile_ = TileType::F32;
  std::unique_ptr<cu::LtGemm> gemm_;
  std::unordered_map<const QWeight*, ResidentWeight> weights_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(MemoryTracker* tracker, const CudaBackendOptions& opt) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0)
    throw_error(QLFT_ERR_BACKEND, "backend=cuda: no usable CUDA device (%s)", why.c_str());
  QLFT_CHECK_ARG(opt.device >= 0 && opt.device < n, "backend=cuda: device %d of %d", opt.device, n);
  QLFT_CUDA_CHECK(cudaSetDevice(opt.device));
  cuda_check_precision(opt.device, opt.gemm_precision);
  if (!cu::kernels_loadable(&why))
    throw_error(QLFT_ERR_UNSUPPORTED, "backend=cuda: %s: %s",
                cuda_device_description(opt.device).c_str(), why.c_str());
  QLFT_LOG_I("cuda backend on %s, GEMM precision %s", cuda_device_description(opt.device).c_str(),
             opt.gemm_precision.c_str());
  return std::make_unique<CudaBackend>(tracker, opt);
}

}  // namespace qlft
