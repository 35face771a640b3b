// The family fixtures' steps that the CUDA family tests (Gemma, MoE, Phi-3) compare between
// backend=cpu and backend=cuda: the fixture's batch, trainer steps on both backends, and one
// runner step with the fixture's LoRA adapter (tests/reference/gen_family_fixtures.py writes
// families/syn_<family> and its .lora.safetensors: tokens, targets, a LoRA whose B is not zero).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda_entry.h"
#include "config/config_file.h"
#include "config/run_spec.h"
#include "core/dtype.h"
#include "train/trainer.h"
#include "unit/test_model_util.h"

namespace qlft_cuda_test {

// The CUDA backend as make_backend sets it up for train.precision p.
inline std::unique_ptr<qlft::Backend> gpu_backend(qlft::MemoryTracker* tr, qlft::Precision p) {
  qlft::CudaBackendOptions o;
  o.spec.precision = p;
  o.autocast = p == qlft::Precision::BF16;
  return qlft::make_cuda_backend(tr, o);
}

inline std::string family_path(const std::string& family) {
  return qlft_test::fixture_path("families/syn_" + family);
}

// The fixture's tokens and targets as one micro-batch.
inline qlft::data::Batch fixture_batch(const model_test::Fixture& f) {
  qlft::data::Batch b;
  const auto shp = f.shape("tokens");
  b.micro_batch = b.rows = static_cast<int>(shp[0]);
  b.seq_len = static_cast<int>(shp[1]);
  b.tokens = f.i32("tokens");
  b.targets = f.i32("targets");
  for (int32_t t : b.targets) b.trained_tokens += t != -100;
  return b;
}

// steps trainer steps on the family's fixture batch with backend=cpu and backend=cuda at
// precision (LoRA r 4 on targets, constant lr 2e-2, seed 7): the last step's loss and how far
// every LoRA weight moved (final minus initial: the initial A would dominate a comparison of the
// weights themselves), per backend.
struct TrainRun {
  double loss = 0;
  std::vector<float> w;
};
// extra: further settings, the same on both.
inline std::pair<TrainRun, TrainRun> train_both(
    const std::string& family, const char* precision, const char* targets, int steps,
    const std::vector<std::pair<const char*, const char*>>& extra = {}) {
  using namespace qlft;
  MemoryTracker tr;
  auto m = load_model(&tr, family_path(family), model_test::keep());
  const data::Batch b =
      fixture_batch(model_test::Fixture(family_path(family) + ".lora.safetensors"));
  TrainRun r[2];
  const char* backends[2] = {"cpu", "cuda"};
  for (int i = 0; i < 2; ++i) {
    Config c;
    c.set("backend", backends[i]);
    c.set("train.precision", precision);
    c.set("lora.r", "4");
    c.set("lora.alpha", "8");
    c.set("lora.target_modules", targets);
    c.set("optim.lr", "2e-2");
    c.set("sched.name", "constant");
    c.set("seed", "7");
    c.set("data.seq_len", std::to_string(b.seq_len));
    c.set("train.micro_batch", std::to_string(b.micro_batch));
    for (const auto& [k, v] : extra) c.set(k, v);
    Trainer t(*m, &tr, nullptr, parse_run_spec(c));
    std::vector<float> w0;
    for (const LoraAdapter::Param& p : t.lora().params()) w0.insert(w0.end(), p.w, p.w + p.n);
    StepReport rep;
    for (int s = 0; s < steps; ++s) t.step_on({b}, &rep);
    r[i].loss = rep.loss;
    for (const LoraAdapter::Param& p : t.lora().params())
      r[i].w.insert(r[i].w.end(), p.w, p.w + p.n);
    for (size_t j = 0; j < w0.size() && j < r[i].w.size(); ++j) r[i].w[j] -= w0[j];
  }
  return {r[0], r[1]};
}

// The fixture's fp32 token embedding rounded to bf16 in place: the CUDA backend keeps a plain
// fp32 embedding in bf16 on the device at train.precision bf16 (as a bf16 checkpoint stores it),
// while the CPU's autocast reads it in fp32; a model whose embedding is bf16-representable (every
// bf16 checkpoint's is) gives both backends the same table.
inline void round_embedding_to_bf16(qlft::Model& m) {
  if (m.tok_embd.kind != qlft::QuantKind::F32) return;
  float* e = m.tok_embd.data.as<float>();
  qlft::round_through_n(qlft::DType::BF16, e, e,
                        static_cast<size_t>(m.tok_embd.rows * m.tok_embd.cols));
}

// One step of run on the fixture's tokens and targets ([batch, seq]): their logits into
// *logits ([rows, vocab]; none without logits), then forward, whose mean loss it returns, then
// backward.
inline double fixture_step(qlft::LlamaRunner& run, const model_test::Fixture& f,
                           std::vector<float>* logits = nullptr, int vocab = 0) {
  using namespace qlft;
  std::vector<int32_t> tok = f.i32("tokens"), tgt = f.i32("targets");
  const auto shp = f.shape("tokens");
  TokenBatch b;
  b.batch = static_cast<int>(shp[0]);
  b.seq = static_cast<int>(shp[1]);
  b.tokens = tok.data();
  b.targets = tgt.data();
  if (logits) {
    logits->resize(size_t(b.rows()) * vocab);
    run.logits(b, MatF(logits->data(), b.rows(), vocab));
  }
  const double loss = run.forward(b).mean();
  run.backward();
  return loss;
}

// One step of the runner on be with activations of act (every layer checkpointed or none), the
// family's fixture LoRA adapter (its embedding bf16-rounded first with bf16_embedding): the loss
// and every LoRA gradient.
struct RunnerStep {
  double loss = 0;
  std::vector<float> grads;
};
inline RunnerStep runner_step(const std::string& family, qlft::Backend& be, qlft::MemoryTracker* tr,
                              qlft::DType act, bool checkpoint = false,
                              bool bf16_embedding = false) {
  using namespace qlft;
  auto m = load_model(tr, family_path(family), model_test::keep());
  if (bf16_embedding) round_embedding_to_bf16(*m);
  model_test::Fixture f(family_path(family) + ".lora.safetensors");
  LoraAdapter lora(tr, m->shapes, model_test::lora_config_of(f));
  model_test::load_lora(f, lora);
  LlamaRunner run(*m, be, &lora);
  run.set_activation_dtype(act);
  run.set_checkpoint_all(checkpoint);
  RunnerStep s;
  s.loss = fixture_step(run, f);
  for (const LoraAdapter::Param& p : lora.params()) s.grads.insert(s.grads.end(), p.g, p.g + p.n);
  return s;
}

}  // namespace qlft_cuda_test
