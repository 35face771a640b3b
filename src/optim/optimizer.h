// Tensor-list optimizers over fp32 parameters and their fp32 gradients (the trainer hands over
// the LoRA A/B tensors). One interface for AdamW (fp32 state, torch.optim.AdamW semantics),
// AdamW8bit (bitsandbytes blockwise 8-bit state) and paged_adamw8bit (the same state in a
// paged store).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "optim/state_dict.h"

namespace qlft {

class Config;

struct OptimSettings {
  std::string name = "adamw";  // adamw | adamw8bit | paged_adamw8bit
  double lr = 2e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;  // 0 disables clipping (used by the trainer, not the optimizer)
  std::string offload_dir;     // paged state files; "" = system temp dir
  // offload.optimizer=nvme: the state lives in a file under offload_dir and each step streams
  // it through offload_buffers in-flight buffers (src/parallel/nvme_state_store.h).
  bool offload_nvme = false;
  int offload_buffers = 2;

  // Reads optim.*, offload.dir, offload.optimizer and offload.buffers from a validated config.
  static OptimSettings from_config(const Config& cfg);
};

// One parameter tensor: numel fp32 values and their gradient, both owned by the caller and
// valid for the optimizer's lifetime. name keys its state in checkpoints.
struct ParamRef {
  std::string name;
  float* data = nullptr;
  const float* grad = nullptr;
  size_t numel = 0;
};

struct OptimStepStats {
  int64_t skipped_elements = 0;  // 8-bit AdamW: elements whose gradient was not finite
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every parameter with learning rate lr (the schedule's value for this step;
  // weight decay uses it too, as in PyTorch).
  virtual OptimStepStats step(double lr) = 0;
  // Completed steps (the bias-correction t of the next step is steps() + 1).
  int64_t steps() const { return step_; }
  const std::string& name() const { return settings_.name; }
  const OptimSettings& settings() const { return settings_; }
  const std::vector<ParamRef>& params() const { return params_; }
  // Bytes of optimizer state (counted as optimizer memory in the tracker).
  virtual uint64_t state_bytes() const = 0;

  // Adds "<prefix>type", "<prefix>step" and per parameter "<prefix><param>.<field>" entries.
  virtual void save_state(StateDict& out, const std::string& prefix = "optim.") const = 0;
  // Restores what save_state wrote. Everything is validated before anything changes: a
  // missing entry or a dtype/shape that does not fit these parameters throws QLFT_ERR_FORMAT
  // naming it, and the optimizer is left as it was.
  virtual void load_state(const StateDict& in, const std::string& prefix = "optim.") = 0;

 protected:
  Optimizer(OptimSettings s, std::vector<ParamRef> params);
  OptimSettings settings_;
  std::vector<ParamRef> params_;
  int64_t step_ = 0;
};

class StateStore;
// Where an optimizer's state lives: the NVMe store when s.offload_nvme, else a paged store
// (paged_adamw8bit) or host memory.
std::unique_ptr<StateStore> make_optimizer_state_store(const OptimSettings& s,
                                                       MemoryTracker* tracker, bool paged);

// Checks the settings and parameters (positive sizes, non-null pointers, unique names) and
// builds the optimizer named by s.name; its state is allocated here, zeroed.
std::unique_ptr<Optimizer> make_optimizer(const OptimSettings& s, std::vector<ParamRef> params,
                                          MemoryTracker* tracker);

}  // namespace qlft
