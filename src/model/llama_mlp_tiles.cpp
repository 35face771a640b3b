// LlamaRunner's MLP tiled along the sequence (set_mlp_tile_rows, train.mlp_tile_rows): the FFN
// is row-independent, so gate / up -> SwiGLU -> down can run over row tiles, and then no
// [rows x intermediate] tensor is whole: the scratch set's gate, up and activation and the
// backward's dh, dgate and dup hold one tile. At a long context these are the largest
// per-layer tensors (3 x intermediate floats a row against dim-wide ones elsewhere).
//
// Engaged only when every layer is checkpointed (mlp_tile_for): the tiles' activations are not
// kept, so backward recomputes them tile by tile. A checkpointed layer's backward recompute
// skips its MLP (recompute_ below: nothing reads that pass's output), and mlp_bwd_tiles makes
// each tile's gate / up / activation and the LoRA inputs xa of gate, up and down before the
// tile's backward: the same GEMMs as the untiled recompute, and the same values, rounded where
// the untiled path rounds them (LlamaRunner::round_stored) under 16-bit storage. The LoRA
// dropout mask of a tile's rows is the whole batch's (LoraRef::dropout_row0), and dA / dB add
// up over the tiles.
#include <algorithm>

#include "backend/dropout.h"
#include "core/error.h"
#include "model/llama.h"
#include "model/llama_internal.h"

namespace qlft {

using namespace runner_detail;

namespace {
constexpr Proj kMlpProjs[3] = {Proj::Gate, Proj::Up, Proj::Down};
}  // namespace

void LlamaRunner::mlp_tile_fwd(int l, LayerActs& a, int64_t r0, int64_t n, float* out) {
  const ModelConfig& c = model_.cfg;
  const LayerWeights& L = model_.layers[l];
  const int64_t D = c.dim, F = c.ffn_dim;
  const CMatF x(a.xn2.as<float>() + r0 * D, n, D);
  // xa of rows [r0, r0 + n) of projection p (nullptr: not adapted).
  auto lora = [&](Proj p, LoraRef* ref) -> float* {
    bool has;
    *ref = lora_ref(l, p, &has);
    ref->dropout_row0 = r0;
    return has ? a.xa[static_cast<int>(p)].as<float>() + r0 * ref->r : nullptr;
  };
  Buffer* outs[2] = {&a.gate, &a.up};
  {
    SharedInput shared(be_, x);
    for (int j = 0; j < 2; ++j) {
      LoraRef ref;
      float* xa = lora(kMlpProjs[j], &ref);
      be_.linear_fwd(L.proj[static_cast<int>(kMlpProjs[j])], nullptr, xa ? &ref : nullptr, x,
                     mat(*outs[j], n, F), xa);
      // As layer_fwd: 16-bit storage keeps gate and up in 16 bits, and the activation takes
      // those values.
      if (act_dtype_ != DType::F32) be_.round_16(act_dtype_, outs[j]->as<float>(), n * F);
    }
  }
  if (c.gemma)
    be_.geglu_fwd(cmat(a.gate, n, F), cmat(a.up, n, F), mat(a.hact, n, F));
  else
    be_.swiglu_fwd(cmat(a.gate, n, F), cmat(a.up, n, F), mat(a.hact, n, F));
  SharedInput shared(be_, cmat(a.hact, n, F));
  LoraRef ref;
  float* xa = lora(Proj::Down, &ref);
  be_.linear_fwd(L.proj[static_cast<int>(Proj::Down)], nullptr, xa ? &ref : nullptr,
                 cmat(a.hact, n, F), MatF(out, n, D), xa);
}

void LlamaRunner::mlp_fwd_tiles(int l, LayerActs& a, float* x_out) {
  const int64_t D = model_.cfg.dim;
  for (int64_t r0 = 0; r0 < rows_; r0 += tile_)
    mlp_tile_fwd(l, a, r0, std::min(tile_, rows_ - r0), x_out + r0 * D);
}

void LlamaRunner::mlp_bwd_tiles(int l, LayerActs& a, CMatF d_down, Buffer& dxn,
                                const TileLinBwd& lin_bwd) {
  const ModelConfig& c = model_.cfg;
  const int64_t R = rows_, D = c.dim, F = c.ffn_dim;
  Grads& g = *grads_;
  // The recomputed down projection's output: not needed, but its GEMM writes xa.
  Buffer out = make(be_, MemCategory::Workspace, std::min(tile_, R) * D, "mlp tile out");
  const bool r16 = act_dtype_ != DType::F32;
  zero(dxn);  // the tiles' gate and up add their rows into it (d_down is not in it: no post-norm)
  for (int64_t r0 = 0; r0 < R; r0 += tile_) {
    const int64_t n = std::min(tile_, R - r0);
    mlp_tile_fwd(l, a, r0, n, out.as<float>());
    const CMatF x(a.xn2.as<float>() + r0 * D, n, D);
    if (r16) {  // what round_stored does to the whole layer's tensors, for this tile's rows
      be_.round_16(act_dtype_, a.hact.as<float>(), n * F);
      be_.round_16(act_dtype_, a.xn2.as<float>() + r0 * D, n * D);
      for (Proj p : kMlpProjs) {
        Buffer& xa = a.xa[static_cast<int>(p)];
        const int64_t r = xa.empty() ? 0 : static_cast<int64_t>(xa.size() / 4) / R;
        if (r) be_.round_16(act_dtype_, xa.as<float>() + r0 * r, n * r);
      }
    }
    if (!be_.defer_zero(g.dh.as<float>(), n * F)) zero(g.dh);
    {
      SharedInput shared(be_, cmat(a.hact, n, F));
      lin_bwd(Proj::Down, cmat(a.hact, n, F), CMatF(d_down.data + r0 * D, n, D), mat(g.dh, n, F),
              r0);
    }
    if (c.gemma)
      be_.geglu_bwd(cmat(a.gate, n, F), cmat(a.up, n, F), cmat(g.dh, n, F), mat(g.dgate, n, F),
                    mat(g.dup, n, F));
    else
      be_.swiglu_bwd(cmat(a.gate, n, F), cmat(a.up, n, F), cmat(g.dh, n, F), mat(g.dgate, n, F),
                     mat(g.dup, n, F));
    const MatF dx(dxn.as<float>() + r0 * D, n, D);
    SharedInput shared(be_, x);
    lin_bwd(Proj::Gate, x, cmat(g.dgate, n, F), dx, r0);
    lin_bwd(Proj::Up, x, cmat(g.dup, n, F), dx, r0);
  }
}

}  // namespace qlft
