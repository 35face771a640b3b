// 8-bit AdamW after bitsandbytes (bnb.optim.AdamW8bit / PagedAdamW8bit, its CPU arithmetic):
// tensors of at least 4096 elements keep m and v as blockwise (256) dynamic 8-bit codes with
// one fp32 absmax per block, m on the signed dynamic map and v on the unsigned one; each step
// dequantizes a block, updates it, and requantizes it with the block's new absmax. Smaller
// tensors keep fp32 state and use bnb's 32-bit update. An element whose gradient is not finite
// keeps its parameter and restarts its state at zero (bnb's 8-bit kernel).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/optimizer.h"

namespace qlft {

constexpr int64_t kAdam8bitBlock = 256;         // bnb blocksize for optimizer state
constexpr int64_t kAdam8bitMinElements = 4096;  // bnb min_8bit_size

// store: where the state lives (a paged one for paged_adamw8bit; make_optimizer's factory).
std::unique_ptr<Optimizer> make_adamw8bit(const OptimSettings& s, std::vector<ParamRef> params,
                                          std::unique_ptr<StateStore> store);

}  // namespace qlft
