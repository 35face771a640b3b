// LlamaRunner's internals shared by its parts: llama.cpp (buffers, activations, footprint),
// llama_lora.cpp (the adapter's device copy), llama_forward.cpp, llama_backward.cpp. Only
// those files include it.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

#include "core/threads.h"
#include "model/llama.h"

namespace qlft {
namespace runner_detail {

// Runner tensors live in the backend's memory (device memory on a GPU). Uninitialized: each is
// written whole before it is read (an op's output, or zeroed right before an accumulation);
// the test suite poisons such memory with NaN (QLFT_POISON_UNINIT), so a read before the write
// fails the oracle tests. Zeroing them cost ~5% of a CPU step and a launch per tensor on a GPU.
inline Buffer make(const Backend& be, MemCategory c, int64_t floats, const char* what) {
  return be.alloc(c, static_cast<size_t>(floats) * sizeof(float), what, BufferInit::Uninit);
}
inline MatF mat(Buffer& b, int64_t rows, int64_t cols) {
  return MatF(b.as<float>(), rows, cols);
}
inline CMatF cmat(const Buffer& b, int64_t rows, int64_t cols) {
  return CMatF(b.as<float>(), rows, cols);
}
inline void zero(Buffer& b) {
  b.zero();
}

// Bytes the tracker counts for a buffer of n elements of `bytes` each (Buffer rounds to 64).
inline uint64_t counted(int64_t n, int64_t bytes = sizeof(float)) {
  return (static_cast<uint64_t>(n) * static_cast<uint64_t>(bytes) + 63) / 64 * 64;
}

// Which of layer_act_counts' buffers stay fp32 with 16-bit storage: the norm statistics, the
// softmax log-sum-exp and the residual x_mid (torch autocast keeps these fp32 as well), and the
// q / k norms' inputs and statistics (qwen3), the post-block norms' inputs and statistics
// (gemma).
// In order: xn1, rstd1, q, k, v, att, lse, x_mid, xn2, rstd2, gate, up, hact, qpre, kpre, rstdq,
// rstdk, opre, rstd3, fpre, rstd4.
constexpr int kLayerActs = 21;
constexpr bool kActFp32[kLayerActs] = {false, true,  false, false, false, false, true,
                                       true,  false, true,  false, false, false, true,
                                       true,  true,  true,  true,  true,  true,  true};

// Element counts of LayerActs' buffers in declaration order (xn1 .. rstdk; 0: not made for this
// model); each xa is rows * r. tile: the MLP's row tile (LlamaRunner::mlp_tile), whose gate, up
// and activation hold that many rows; 0: all R.
inline std::array<int64_t, kLayerActs> layer_act_counts(const ModelShapes& c, int64_t R,
                                                        int64_t tile = 0) {
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), qkn = c.qk_norm() ? R : 0;
  const int64_t pn = c.post_norm() ? R : 0, F = tile > 0 ? tile : R;
  return {R * c.dim,
          R,
          R * qd,
          R * kvd,
          R * kvd,
          R * qd,
          R * c.n_heads,
          R * c.dim,
          R * c.dim,
          R,
          F * c.ffn_dim,
          F * c.ffn_dim,
          F * c.ffn_dim,
          qkn * qd,
          qkn * kvd,
          qkn * c.n_heads,
          qkn * c.n_kv_heads,
          pn * c.dim,
          pn,
          pn * c.dim,
          pn};
}

// Element counts of the backward temporaries: G, dxn, datt, dq, dk, dv, dh, dgate, dup (the
// last three of one MLP row tile when tile > 0).
inline std::array<int64_t, 9> grad_counts(const ModelShapes& c, int64_t R, int64_t tile = 0) {
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), F = tile > 0 ? tile : R;
  return {R * c.dim, R * c.dim,     R * qd,        R * qd,       R * kvd,
          R * kvd,   F * c.ffn_dim, F * c.ffn_dim, F * c.ffn_dim};
}

// Which backward temporaries (grad_counts' order) have buffers of their own; the others are
// placed in fp32 tensors that are dead while backward runs, so they cost nothing:
//  - G (d residual) in the final norm output (read only by the head's cross-entropy, in forward);
//  - dxn (d norm out) in d(final norm), dead once the final norm's backward has run; a
//    checkpointed layer's recompute also writes its (unread) output there;
//  - datt (R x q_dim) in the last residual entry (dead after the final norm's backward: it is
//    never offloaded), where q_dim <= dim;
//  - per layer, dq (R x q_dim) in the layer's xn2 (R x dim; dead once gate / up's backward has
//    read it), dk and dv (R x kv_dim each) one after the other in its x_mid (R x dim; dead once
//    the FFN norm's backward has read it), where they fit.
// dh, dgate and dup (the MLP's) always have their own. The runner (LlamaRunner::backward,
// layer_bwd) and its footprint both ask here.
inline std::array<bool, 9> grads_owned(const ModelShapes& c) {
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  return {false, false, qd > c.dim, qd > c.dim, kvd > c.dim, 2 * kvd > c.dim, true, true, true};
}

// Per (step, layer, projection) seed so every adapter draws its own dropout mask.
inline uint64_t proj_seed(uint64_t step_seed, int layer, Proj p) {
  return mix64(step_seed ^ mix64((static_cast<uint64_t>(layer) << 8) | static_cast<uint64_t>(p)));
}

// Lends a packed layer's fp32 tensors to the fp32 scratch set while a layer runs there (the
// Buffers change owners, nothing is copied or allocated), and gives them back.
class LendFulls {
 public:
  LendFulls(std::array<Buffer*, 12> a, std::array<Buffer*, 12> b) : a_(a), b_(b) { swap(); }
  ~LendFulls() { swap(); }
  LendFulls(const LendFulls&) = delete;
  LendFulls& operator=(const LendFulls&) = delete;

 private:
  void swap() {
    for (size_t i = 0; i < a_.size(); ++i) std::swap(*a_[i], *b_[i]);
  }
  std::array<Buffer*, 12> a_, b_;
};

}  // namespace runner_detail

// Everything one layer's backward reads. xa[p] holds drop(x) A^T of projection p.
// half: the tensors of halves() hold 16-bit values (a packed stored layer), the rest fp32.
// With per-head q / k norms (qwen3) q and k hold the normalized projections; qpre / kpre the
// projections themselves and rstdq / rstdk their statistics (empty otherwise).
struct LlamaRunner::LayerActs {
  Buffer xn1, rstd1, q, k, v, att, lse, x_mid, xn2, rstd2, gate, up, hact;
  Buffer qpre, kpre, rstdq, rstdk;
  // Post-block norms (gemma): the o projection's output before its norm (its norm into x_mid)
  // and the down projection's before its norm, with their statistics (empty otherwise).
  Buffer opre, rstd3, fpre, rstd4;
  Buffer xa[kProjCount];
  bool half = false;

  // The tensors 16-bit storage keeps in 16 bits (xa entries may be empty), and the fp32 ones.
  std::array<Buffer*, 9 + kProjCount> halves() {
    std::array<Buffer*, 9 + kProjCount> h = {&xn1, &q, &k, &v, &att, &xn2, &gate, &up, &hact};
    for (int p = 0; p < kProjCount; ++p) h[9 + p] = &xa[p];
    return h;
  }
  std::array<Buffer*, 12> fulls() {
    return {&rstd1, &lse,   &x_mid, &rstd2, &qpre, &kpre,
            &rstdq, &rstdk, &opre,  &rstd3, &fpre, &rstd4};
  }
};

// Backward temporaries: the tensors layer_bwd uses, each a view of its own buffer (own, in
// grad_counts' order; workspace) or of a dead tensor (grads_owned).
struct LlamaRunner::Grads {
  Buffer G, dxn, datt, dq, dk, dv, dh, dgate, dup;
  Buffer own[9];
};

}  // namespace qlft
