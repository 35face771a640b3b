// AdamW with fp32 state, PyTorch semantics (torch.optim.AdamW, single-tensor path): decoupled
// weight decay p *= 1 - lr*wd, bias-corrected moments, eps outside the square root. Like
// PyTorch it does not screen gradients: the trainer checks the global norm (or the fp16 loss
// scaler does) before stepping.
#pragma once

#include <memory>
#include <vector>

#include "optim/optimizer.h"

namespace qlft {

std::unique_ptr<Optimizer> make_adamw(const OptimSettings& s, std::vector<ParamRef> params,
                                      MemoryTracker* tracker);

}  // namespace qlft
