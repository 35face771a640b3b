// AdamW with fp32 state, PyTorch semantics (torch.optim.AdamW, single-tensor path): decoupled
// weight decay p *= 1 - lr*wd, bias-corrected moments, eps outside the square root. Like
// PyTorch it does not screen gradients: the trainer checks the global norm (or the fp16 loss
// scaler does) before stepping.
#pragma once

#include <memory>
#include <vector>

#include "backend/adamw_math.h"
#include "optim/optimizer.h"

namespace qlft {

// The per-step scalars of step t (1-based) at learning rate lr, as torch computes them; throws
// QLFT_ERR_INVALID_ARGUMENT for a negative or non-finite lr. (The host and device AdamW share it.)
AdamWTorchCoeffs adamw_torch_coeffs(const OptimSettings& s, double lr, int64_t t);

// The checkpoint entries every AdamW writes first ("<prefix>type" = "adamw", "<prefix>step"), and
// their check on load: returns the step, throws QLFT_ERR_FORMAT naming what is wrong.
void save_adamw_header(StateDict& out, const std::string& prefix, int64_t step);
int64_t load_adamw_header(const StateDict& in, const std::string& prefix);

// store: where m and v live (make_optimizer's StateStoreFactory).
std::unique_ptr<Optimizer> make_adamw(const OptimSettings& s, std::vector<ParamRef> params,
                                      std::unique_ptr<StateStore> store);

}  // namespace qlft
