// The memory planner: predicts, before anything is allocated, what a training run will hold per
// memory category (weights, adapter, gradients, optimizer, activations, workspace) and its total
// peak, in bytes as the MemoryTracker counts them.
//
// How each category is predicted:
//  - weights: every buffer the loader makes (from a loaded model, or from the file's tensor
//    shapes and types with the quant.* settings), exact;
//  - adapter, gradients, optimizer: the LoRA A/B shapes and the optimizer's state layout, exact;
//  - activations: LlamaRunner::footprint(), the same element counts the runner allocates with,
//    exact (stored layers, the shared checkpoint scratch, the residual stream);
//  - workspace: the largest set of scratch buffers alive at once in the CPU backend's kernels
//    (weight panels, attention tiles, cross-entropy chunks, autocast copies, sizes from
//    CpuTuning and the thread count) plus the backward temporaries. The cross-entropy chunk
//    assumes every target is trained (the worst case), so real data may use less.
// The training peak is reached in backward with every activation alive, so it is the sum of the
// persistent categories, the activations and the workspace peak. Loading holds the weights and
// an f32 staging copy of one tensor being quantized (workspace); that is the load peak.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/memory.h"
#include "model/lora.h"
#include "model/model.h"

namespace qlft {

class Config;

// Weight storage of a model as loaded.
struct WeightFootprint {
  uint64_t bytes = 0;         // every weight buffer, rounded as the tracker counts it
  uint64_t load_staging = 0;  // the most workspace held at once while loading
};

// Of a loaded model (exact for bytes; staging assumes the linears were quantized at load when
// they are NF4/INT8, which over-states it for pre-quantized bitsandbytes files).
WeightFootprint weight_footprint(const Model& m);
// From a model file without loading its weights: a .gguf file (header only) or an HF model
// (config.json + safetensors headers). Fills *cfg with the model's shape.
WeightFootprint weight_footprint_of_file(const std::string& path, const LoadOptions& opt,
                                         ModelConfig* cfg);

struct PlanSettings {
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (the low ones add autocast copies)
  int checkpoint_every = 0;        // train.grad_checkpointing
  int seq_len = 512;
  int micro_batch = 4;
  int accumulation = 1;  // micro-batches per step (more than one keeps backward temporaries)
  std::string optimizer = "adamw";  // adamw | adamw8bit | paged_adamw8bit
  LoraConfig lora;
  int threads = 0;  // kernel threads; 0: what OpenMP would use now
  cpu::CpuTuning tune;

  // train.precision, train.grad_checkpointing, data.seq_len, train.micro_batch (auto gives 1),
  // optim.name, lora.* (or lora.init_from's adapter_config.json), threads.
  static PlanSettings from_config(const Config& c);
};

struct MemoryPlan {
  std::array<uint64_t, kMemCategoryCount> peak{};   // per category, over loading and training
  std::array<uint64_t, kMemCategoryCount> train{};  // per category at the training peak
  uint64_t train_peak = 0;                          // total during a training step
  uint64_t load_peak = 0;                           // total while loading the weights
  uint64_t total_peak = 0;                          // max(train_peak, load_peak)
};

MemoryPlan plan_memory(const ModelConfig& mc, const WeightFootprint& w, const PlanSettings& s);

// The largest micro-batch in [1, upper] whose predicted training peak is at most budget; 0 when
// not even 1 fits. The peak grows with the micro-batch, so this is a binary search.
int plan_max_micro_batch(const ModelConfig& mc, const WeightFootprint& w, PlanSettings s,
                         uint64_t budget, int upper);

}  // namespace qlft
