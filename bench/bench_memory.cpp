// Activation-memory scaling of a training step, from the MemoryTracker (issue 10, Done-when 3).
//
//   OMP_WAIT_POLICY=passive build-bench/bench/bench_memory [--layers N] [--no-ckpt] [model.gguf
//   ...]
//
// For each model (default: shared/models/stories260K.gguf and, when present,
// /opt/qlft-models/smollm2-135m-instruct-q4_1.gguf), one forward + backward of batch 1 at
// sequence 2048 and 4096 with LoRA r=16 on all seven projections, bf16 autocast (as
// train.precision = bf16), without and with gradient checkpointing; prints the peak bytes in
// `activations` and `workspace` during the step and the 4096 / 2048 ratios. Then the fused
// cross-entropy head's workspace at two vocabulary sizes (synthetic heads, 64 rows, dim 576).
// --layers N keeps only the first N layers of each model (0: all): activations are per layer
// plus the residual stream, so the ratio is the same and a slow machine gets there sooner.
// --no-ckpt skips the runs with gradient checkpointing.
// Threads: QLFT_BENCH_THREADS (default 2). Not a Google Benchmark: nothing is timed repeatedly.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/autocast_backend.h"
#include "backend/backend.h"
#include "core/memory.h"
#include "core/threads.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/model.h"
#include "quant/qweight.h"

using namespace qlft;

namespace {

struct Peaks {
  uint64_t act = 0, ws = 0;
  double seconds = 0;
};

Peaks step(const Model& m, MemoryTracker& tr, int seq, bool ckpt) {
  LoraConfig lc;
  lc.r = 16;
  lc.alpha = 32;
  LoraAdapter lora(&tr, m.shapes, lc);
  std::unique_ptr<Backend> be = make_autocast_backend(make_cpu_backend(&tr), DType::BF16);
  LlamaRunner run(m, *be, &lora);
  run.set_checkpoint_all(ckpt);
  std::vector<int32_t> tok(static_cast<size_t>(seq)), tgt(static_cast<size_t>(seq));
  std::mt19937 rng(1);
  for (int i = 0; i < seq; ++i) tok[size_t(i)] = int32_t(rng() % uint32_t(m.cfg.vocab));
  for (int i = 0; i < seq; ++i) tgt[size_t(i)] = i + 1 < seq ? tok[size_t(i) + 1] : kIgnoreIndex;
  TokenBatch b;
  b.batch = 1;
  b.seq = seq;
  b.tokens = tok.data();
  b.targets = tgt.data();
  const MemorySnapshot before = tr.snapshot();
  tr.reset_peaks();
  auto t0 = std::chrono::steady_clock::now();
  run.forward(b);
  run.backward();
  Peaks p;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MemorySnapshot s = tr.snapshot();
  p.act = s.peak[QLFT_MEM_ACTIVATIONS] - before.reserved[QLFT_MEM_ACTIVATIONS];
  p.ws = s.peak[QLFT_MEM_WORKSPACE] - before.reserved[QLFT_MEM_WORKSPACE];
  return p;
}

void model_scaling(const std::string& path, int layers, bool with_ckpt) {
  MemoryTracker tr;
  LoadOptions lo;
  lo.quant_type = qlft::QuantType::Keep;
  std::unique_ptr<Model> m;
  try {
    m = load_model(&tr, path, lo);
  } catch (const std::exception& e) {
    std::printf("%s: skipped (%s)\n", path.c_str(), e.what());
    return;
  }
  const int all = m->cfg.n_layers;
  if (layers > 0 && layers < all) {
    m->layers.resize(size_t(layers));
    m->cfg.n_layers = layers;
  }
  std::printf("\n%s (%d of %d layers, dim %d, vocab %d), batch 1, LoRA r=16, bf16 autocast\n",
              path.c_str(), m->cfg.n_layers, all, m->cfg.dim, m->cfg.vocab);
  std::printf("%-14s %6s %14s %14s %8s\n", "checkpointing", "seq", "activations", "workspace",
              "seconds");
  for (bool ckpt : {false, true}) {
    if (ckpt && !with_ckpt) continue;
    Peaks p[2];
    const int seqs[2] = {2048, 4096};
    for (int i = 0; i < 2; ++i) {
      p[i] = step(*m, tr, seqs[i], ckpt);
      std::printf("%-14s %6d %14s %14s %8.1f\n", ckpt ? "every layer" : "off", seqs[i],
                  format_bytes(p[i].act).c_str(), format_bytes(p[i].ws).c_str(), p[i].seconds);
    }
    std::printf("%-14s %6s %13.3fx %13.3fx\n", "", "ratio", double(p[1].act) / double(p[0].act),
                double(p[1].ws) / double(p[0].ws));
  }
}

void head_workspace() {
  const int rows = 64, dim = 576;
  std::printf("\nfused linear + cross-entropy, %d rows, dim %d, with dh: workspace peak\n", rows,
              dim);
  std::printf("%-6s %8s %14s %14s\n", "prec", "vocab", "workspace", "full logits");
  for (bool bf16 : {false, true}) {
    for (int vocab : {32000, 151936}) {
      MemoryTracker tr;
      std::vector<float> w(size_t(vocab) * dim);
      std::mt19937 rng(2);
      std::normal_distribution<float> nd(0.f, 0.02f);
      for (float& x : w) x = nd(rng);
      QWeight head = qweight_from_f32(&tr, w.data(), vocab, dim, QuantKind::F32);
      std::unique_ptr<Backend> be = make_cpu_backend(&tr);
      if (bf16) be = make_autocast_backend(std::move(be), DType::BF16);
      std::vector<float> h(size_t(rows) * dim), dh(h.size());
      for (float& x : h) x = nd(rng) * 50;
      std::vector<int32_t> tgt(rows);
      for (int r = 0; r < rows; ++r) tgt[size_t(r)] = int32_t(rng() % uint32_t(vocab));
      tr.reset_peaks();
      const uint64_t base = tr.snapshot().reserved[QLFT_MEM_WORKSPACE];
      int64_t count = 0;
      be->linear_cross_entropy(head, CMatF(h.data(), rows, dim), tgt.data(), kIgnoreIndex,
                               1.f / rows, MatF(dh.data(), rows, dim), &count);
      const uint64_t ws = tr.snapshot().peak[QLFT_MEM_WORKSPACE] - base;
      std::printf("%-6s %8d %14s %14s\n", bf16 ? "bf16" : "fp32", vocab, format_bytes(ws).c_str(),
                  format_bytes(uint64_t(rows) * uint64_t(vocab) * 4).c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* th = std::getenv("QLFT_BENCH_THREADS");
  set_num_threads(th && *th ? std::atoi(th) : 2);
  std::vector<std::string> models;
  int layers = 0;
  bool ckpt = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--layers" && i + 1 < argc)
      layers = std::atoi(argv[++i]);
    else if (a == "--no-ckpt")
      ckpt = false;
    else
      models.push_back(a);
  }
  if (models.empty()) {
    const char* e = std::getenv("QLFT_SHARED_DIR");
    models.push_back(std::string(e && *e ? e : QLFT_SHARED_DIR_DEFAULT) +
                     "/models/stories260K.gguf");
    models.push_back("/opt/qlft-models/smollm2-135m-instruct-q4_1.gguf");
  }
  for (const std::string& m : models) model_scaling(m, layers, ckpt);
  head_workspace();
  return 0;
}
