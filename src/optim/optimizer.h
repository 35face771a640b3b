// Tensor-list optimizers over fp32 parameters and their fp32 gradients (the trainer hands over
// the LoRA A/B tensors). One interface for AdamW (fp32 state, torch.optim.AdamW semantics),
// AdamW8bit (bitsandbytes blockwise 8-bit state) and paged_adamw8bit (the same state in a
// paged store).
#pragma once

#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/run_spec.h"
#include "core/memory.h"
#include "optim/state_dict.h"

namespace qlft {

// optim.* (config/run_spec.h): the optimizer kind and its hyper-parameters.
using OptimSettings = OptimSpec;

// One parameter tensor: numel fp32 values and their gradient, both owned by the caller and
// valid for the optimizer's lifetime. name keys its state in checkpoints.
struct ParamRef {
  std::string name;
  float* data = nullptr;
  const float* grad = nullptr;
  size_t numel = 0;
  // This tensor's learning rate is the step's lr times lr_scale (its weight decay uses that lr,
  // as a torch param group's lr does): LoRA+ gives every lora_B optim.loraplus_lr_ratio.
  double lr_scale = 1.0;
};

struct OptimStepStats {
  int64_t skipped_elements = 0;  // 8-bit AdamW: elements whose gradient was not finite
};

class Optimizer : public CheckpointState {
 public:
  virtual ~Optimizer() = default;
  // One update of every parameter with learning rate lr (the schedule's value for this step;
  // weight decay uses it too, as in PyTorch), times each parameter's lr_scale.
  virtual OptimStepStats step(double lr) = 0;
  // Completed steps (the bias-correction t of the next step is steps() + 1).
  int64_t steps() const { return step_; }
  const char* name() const { return name_of(settings_.kind); }  // "adamw", ...
  const OptimSettings& settings() const { return settings_; }
  const std::vector<ParamRef>& params() const { return params_; }
  // Bytes of optimizer state (counted as optimizer memory in the tracker).
  virtual uint64_t state_bytes() const = 0;

  // CheckpointState: "<prefix>type", "<prefix>step" and per parameter "<prefix><param>.<field>"
  // entries; a dtype or shape that does not fit these parameters is refused.
  void save_state(StateDict& out, const std::string& prefix = "optim.") const override = 0;
  void load_state(const StateDict& in, const std::string& prefix = "optim.") override = 0;

 protected:
  Optimizer(OptimSettings s, std::vector<ParamRef> params);
  OptimSettings settings_;
  std::vector<ParamRef> params_;
  int64_t step_ = 0;
};

class StateStore;
// Makes an optimizer's state store; paged: paged_adamw8bit asks for a paged one. The caller
// decides where state lives (host memory, a paged file, offload.optimizer=nvme's streamed file:
// parallel/nvme_state_store.h), so optim/ names no store beyond its own (core/state_store.h).
using StateStoreFactory = std::function<std::unique_ptr<StateStore>(MemoryTracker*, bool paged)>;
// Host memory, or for paged a paged store of files in dir ("" = the system temp dir).
StateStoreFactory host_or_paged_state_stores(std::string dir = "");

// Checks the settings and parameters (positive sizes, non-null pointers, unique names) and
// builds the optimizer of kind s.kind; its state is allocated here, zeroed, in a store from
// `stores`.
std::unique_ptr<Optimizer> make_optimizer(
    const OptimSettings& s, std::vector<ParamRef> params, MemoryTracker* tracker,
    const StateStoreFactory& stores = host_or_paged_state_stores());

}  // namespace qlft
