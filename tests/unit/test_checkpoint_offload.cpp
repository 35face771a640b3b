// Offloaded checkpoints (LlamaRunner::set_offload_checkpoints, model/checkpoint_offload.h) on
// the CPU backend, whose copies are plain copies (Backend's defaults): the runner logic alone.
//  - fp32: the host copies are exact, so a step gives bit-equal loss and LoRA gradients with and
//    without offload (checkpointing every layer and every second layer), and the activations the
//    tracker counts change by exactly the sizes worked out here from the shape: n_ckpt residual
//    entries fewer, two fp32 slots and n_ckpt - 1 fp32 host copies more (the last stays).
//  - bf16 storage: the forward is unchanged (bit-equal loss), the gradients move by the bf16
//    rounding of the recomputed layers' inputs: close to the unoffloaded ones, not equal (so the
//    16-bit path is what ran), and the host copies are 2 bytes an element.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "backend/autocast_backend.h"
#include "backend/backend.h"
#include "core/memory.h"
#include "core/threads.h"
#include "model/checkpoint_offload.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/model.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

constexpr int kBatch = 2, kSeq = 48, kRank = 4;

struct Rig {
  MemoryTracker tr;
  std::unique_ptr<Model> model;
  std::unique_ptr<LoraAdapter> lora;
  std::vector<int32_t> tok, tgt;
  TokenBatch b;

  explicit Rig(const std::string& path) {
    LoadOptions o;
    o.quant_type = qlft::QuantType::Keep;
    model = load_model(&tr, path, o);
    LoraConfig lc;
    lc.r = kRank;
    lc.alpha = 8;
    lc.init_seed = 5;
    lora = std::make_unique<LoraAdapter>(&tr, model->shapes, lc);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 0.3f);
    for (int l = 0; l < model->cfg.n_layers; ++l)
      for (int p = 0; p < kProjCount; ++p) {
        LoraSlot& s = lora->slot(l, static_cast<Proj>(p));
        for (size_t i = 0; i < s.B.size() / 4; ++i) s.B.as<float>()[i] = nd(rng);
      }
    tok.resize(kBatch * kSeq);
    tgt.resize(kBatch * kSeq);
    for (size_t i = 0; i < tok.size(); ++i) {
      tok[i] = static_cast<int32_t>(rng() % model->cfg.vocab);
      tgt[i] = static_cast<int32_t>(rng() % model->cfg.vocab);
    }
    b.batch = kBatch;
    b.seq = kSeq;
    b.tokens = tok.data();
    b.targets = tgt.data();
  }
};

struct Step {
  double loss = 0;
  std::vector<float> grads;
  uint64_t acts = 0;  // peak activation bytes of the step
};

Step run_step(Rig& s, DType storage, int every, bool offload) {
  std::unique_ptr<Backend> be = make_cpu_backend(&s.tr);
  if (storage != DType::F32) be = make_autocast_backend(std::move(be), storage);
  const uint64_t before = s.tr.snapshot().reserved[QLFT_MEM_ACTIVATIONS];
  s.tr.reset_peaks();
  Step r;
  {
    LlamaRunner run(*s.model, *be, s.lora.get());
    run.set_activation_dtype(storage);
    for (int l = 0; l < s.model->cfg.n_layers; ++l) run.set_checkpoint(l, l % every == 0);
    run.set_offload_checkpoints(offload);
    s.lora->zero_grad();
    r.loss = run.forward(s.b, 0.f, 9).mean();
    run.backward();
  }
  r.acts = s.tr.snapshot().peak[QLFT_MEM_ACTIVATIONS] - before;
  for (const LoraAdapter::Param& p : s.lora->params())
    r.grads.insert(r.grads.end(), p.g, p.g + p.n);
  return r;
}

class CheckpointOffloadCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = qlft_test::shared_file("models/stories260K.gguf");
    if (path_.empty())
      QLFT_SKIP("shared-missing") << "stories260K.gguf not found (set QLFT_SHARED_DIR)";
    set_num_threads(2);
  }
  std::string path_;
};

uint64_t rounded(uint64_t bytes) {
  return (bytes + 63) / 64 * 64;
}

TEST_F(CheckpointOffloadCpu, Fp32IsExactAndMovesTheEntriesToTheHost) {
  Rig s(path_);
  const int n_layers = s.model->cfg.n_layers;
  ASSERT_GE(n_layers, 4);  // more checkpointed layers than slots, so offload saves
  const uint64_t entry = rounded(uint64_t(kBatch) * kSeq * s.model->cfg.dim * 4);
  for (int every : {1, 2}) {
    SCOPED_TRACE(every);
    const Step off = run_step(s, DType::F32, every, false);
    const Step on = run_step(s, DType::F32, every, true);
    EXPECT_EQ(on.loss, off.loss);
    ASSERT_EQ(on.grads.size(), off.grads.size());
    EXPECT_EQ(on.grads, off.grads);
    const int n_ckpt = (n_layers + every - 1) / every;
    // The entries leave the residual stream; two fp32 slots (the copy out reads the slot) and
    // a host copy of each but the last (which stays in its slot) come in.
    const uint64_t expect = off.acts - n_ckpt * entry + 2 * entry + (n_ckpt - 1) * entry;
    EXPECT_EQ(on.acts, expect);
    const OffloadFootprint f =
        CheckpointOffload::footprint(int64_t(kBatch) * kSeq * s.model->cfg.dim, n_ckpt, DType::F32);
    EXPECT_EQ(f.device, 2 * entry);
    EXPECT_EQ(f.host, (n_ckpt - 1) * entry);
  }
}

TEST_F(CheckpointOffloadCpu, Bf16RecomputesFromRoundedInputs) {
  Rig s(path_);
  const int n_layers = s.model->cfg.n_layers;
  const int64_t elems = int64_t(kBatch) * kSeq * s.model->cfg.dim;
  const Step off = run_step(s, DType::BF16, 1, false);
  const Step on = run_step(s, DType::BF16, 1, true);
  EXPECT_EQ(on.loss, off.loss);  // the forward is the same
  ASSERT_EQ(on.grads.size(), off.grads.size());
  const double err =
      qlft_test::max_rel_error(on.grads.data(), off.grads.data(), off.grads.size(), 1e-3);
  std::printf("bf16 gradients with / without offload: max normalized difference %.3g\n", err);
  EXPECT_GT(err, 0.0) << "the recompute saw the fp32 inputs: nothing was rounded";
  EXPECT_LT(err, 0.05);
  // One fp32 slot (each layer's output written over its staged input), one bf16 staging slot
  // and bf16 host copies.
  const uint64_t entry = rounded(uint64_t(elems) * 4), half = rounded(uint64_t(elems) * 2);
  EXPECT_EQ(on.acts, off.acts - n_layers * entry + entry + half + (n_layers - 1) * half);
}

}  // namespace
