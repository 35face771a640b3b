// torch.optim.AdamW on a device backend: the parameters are the runner's device copy of every
// LoRA A and B (one flat array in ParamRef order), the gradients its device gradients, and m / v
// live in the backend's memory. A step moves nothing between host and device; checkpoints copy
// the state through the host (save_state / load_state, the same entries as the host AdamW).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "optim/grad_clip.h"
#include "optim/optimizer.h"

namespace qlft {

// w and g: n floats in the backend's memory, the params' values back to back in their order.
// w16 (may be null): w's bf16 copy (the runner's lora_device_weights16), written by the same
// kernels as w (Backend::adamw_torch_to_16).
std::unique_ptr<Optimizer> make_device_adamw(const OptimSettings& s, std::vector<ParamRef> params,
                                             Backend& be, float* w, const float* g, int64_t n,
                                             uint16_t* w16 = nullptr);

// 8-bit AdamW on the same arrays (train/device_adamw8bit.cpp): s.kind adamw8bit keeps the
// state in the backend's device memory, paged_adamw8bit in its managed_state_store(). The same
// state and checkpoint entries as the host AdamW8bit (optim/adamw8bit.h).
std::unique_ptr<Optimizer> make_device_adamw8bit(const OptimSettings& s,
                                                 std::vector<ParamRef> params, Backend& be,
                                                 float* w, const float* g, int64_t n);

// The host step's gradient checks on n gradients in the backend's memory: LossScaler::
// unscale_and_check (true when any value is inf or NaN; all multiplied by 1 / scale) and
// clip_grad_norm (the same rule; the norm summed in the device's order).
bool device_unscale_and_check(Backend& be, float* g, int64_t n, float scale);
ClipResult device_clip_grad_norm(Backend& be, float* g, int64_t n, double max_norm);

}  // namespace qlft
