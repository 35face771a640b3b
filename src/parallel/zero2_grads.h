// ZeRO-2 gradient partitioning for the LoRA tensors on host backends: each rank keeps the
// gradients of the tensors it owns (dist::DataParallel's whole-tensor ownership) and nothing
// else, so the `gradients` category of a rank is its share instead of every dA / dB.
//
// The runner's backward (model/lora_grad_sink.h) computes each projection's dA and dB of the
// current micro-batch into one reduce bucket ([dA | dB], counted as `communication`, like
// ZeRO-3's gathered units), zeroed first. As soon as that projection's backward is done, the
// bucket is reduced to its owner (Communicator::reduce of a + b floats; A and B separately when
// their owners differ), and the owner of A (of B) adds its part into its gradient shard, the
// adapter's dA (dB) of that tensor. The others drop it (the next projection overwrites the
// bucket). With accumulation the shard collects every
// micro-batch's sums; the step's global gradient is then complete on its owner, and the trainer
// clips (squared norms all-reduced) and steps the owned tensors as before.
//
// Every rank must run the same exchanges in the same order. A rank with fewer passes than its
// peers (a short last global batch, a micro-batch with every target masked) joins theirs with
// replay_pass / replay_layer: the same exchanges with an empty bucket, its owned parts still
// adding what the others sent.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/memory.h"
#include "core/communicator.h"
#include "model/lora.h"
#include "model/lora_grad_sink.h"

namespace qlft::dist {

class Zero2Grads final : public LoraGradSink {
 public:
  // owner_a / owner_b: per layer * kProjCount + projection, the rank that owns A / B (unused
  // for untargeted projections). lora must hold dA (dB) exactly where this rank owns A (B)
  // (LoraAdapter::allocate_gradients). comm: host buffers. lora and comm must outlive this.
  Zero2Grads(LoraAdapter& lora, Communicator& comm, std::vector<int> owner_a,
             std::vector<int> owner_b, MemoryTracker* tracker);

  LoraGradTarget begin(int layer, Proj p) override;
  void end(int layer, Proj p) override;

  // One layer's exchanges (kBackwardProjOrder) with nothing computed, and a whole backward's
  // (last layer first).
  void replay_layer(int layer);
  void replay_pass();

  uint64_t bucket_bytes() const { return bucket_.size(); }

 private:
  struct Proj_ {
    int64_t a = 0, b = 0;  // elements of A and B (0: not targeted)
    int owner_a = -1, owner_b = -1;
    float* shard_a = nullptr;  // this rank's dA (when it owns A)
    float* shard_b = nullptr;
  };
  const Proj_& at(int layer, Proj p) const {
    return projs_[static_cast<size_t>(layer) * kProjCount + static_cast<size_t>(p)];
  }

  LoraAdapter& lora_;
  Communicator& comm_;
  int rank_;
  std::vector<Proj_> projs_;
  Buffer bucket_;  // the largest projection's a + b floats, MemCategory::Communication
};

class DataParallel;

// Gives lora (made without gradients) its gradients as this rank of dp holds them and points
// dp's params at them: every dA / dB, or with shard only those of the tensors this rank owns,
// plus the Zero2Grads that the runner's backward must use (LlamaRunner::set_grad_sink; nullptr
// without shard). dp's params must be lora's tensors in the trainer's order (layer, projection,
// A then B). The trainer (Trainer::init_grads) and the planner's tests both make them here.
std::unique_ptr<Zero2Grads> allocate_lora_gradients(LoraAdapter& lora, DataParallel& dp, bool shard,
                                                    MemoryTracker* tracker);

}  // namespace qlft::dist
