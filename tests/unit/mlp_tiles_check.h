// Shared by test_mlp_tiles (CPU backend) and test_cuda_mlp_tiles (CUDA backend, emulated in CI):
// one training step of the tiny Llama fixture with every layer checkpointed, its MLP whole and
// in row tiles (LlamaRunner::set_mlp_tile_rows, model/llama_mlp_tiles.cpp). The untiled step is
// the independent path: the same loss and LoRA gradients must come out of the tiles.
#pragma once

#include <random>
#include <vector>

#include "test_model_util.h"

namespace mlp_tiles_check {

using namespace qlft;

struct StepResult {
  double loss = 0;
  std::vector<float> grads;            // every dA and dB, adapter order
  int64_t tile = 0;                    // the tile the runner engaged
  uint64_t act_peak = 0, ws_peak = 0;  // the tracker's activation / workspace peaks of the step
  // Workspace still allocated after backward: the backward temporaries the runner keeps (the
  // MLP's dh, dgate, dup among them) until it is released.
  uint64_t ws_held = 0;
};

// One forward + backward of 2 x 16 tokens (one target ignored) with LoRA r 4 on all seven
// projections (B nonzero, so every A has a gradient), dropout p, activations stored as acts.
inline StepResult step(const Model& m, Backend& be, MemoryTracker* tr, int64_t tile, DType acts,
                       float p) {
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  lc.dropout = p;
  lc.init_seed = 7;
  LoraAdapter lora(tr, m.shapes, lc);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 0.2f);
  for (int l = 0; l < m.cfg.n_layers; ++l)
    for (int q = 0; q < kProjCount; ++q) {
      LoraSlot& s = lora.slot(l, static_cast<Proj>(q));
      for (size_t i = 0; i < s.B.size() / 4; ++i) s.B.as<float>()[i] = nd(rng);
    }
  std::vector<int32_t> tok(32), tgt(32);
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>(rng() % uint32_t(m.cfg.vocab));
    tgt[i] = static_cast<int32_t>(rng() % uint32_t(m.cfg.vocab));
  }
  tgt[3] = kIgnoreIndex;
  TokenBatch b;
  b.batch = 2;
  b.seq = 16;
  b.tokens = tok.data();
  b.targets = tgt.data();
  StepResult r;
  {
    LlamaRunner run(m, be, &lora);
    run.set_checkpoint_all(true);
    run.set_activation_dtype(acts);
    run.set_mlp_tile_rows(tile);
    lora.zero_grad();
    tr->reset_peaks();
    r.loss = run.forward(b, 0.f, 99).loss_sum;
    run.backward();
    r.tile = run.mlp_tile();
    const MemorySnapshot s = tr->snapshot();
    const bool dev = be.device_memory();
    r.act_peak = (dev ? s.device_peak : s.peak)[int(MemCategory::Activations)];
    r.ws_peak = (dev ? s.device_peak : s.peak)[int(MemCategory::Workspace)];
    r.ws_held = s.allocated[int(MemCategory::Workspace)];
  }
  for (auto& prm : lora.params()) r.grads.insert(r.grads.end(), prm.g, prm.g + prm.n);
  return r;
}

}  // namespace mlp_tiles_check
