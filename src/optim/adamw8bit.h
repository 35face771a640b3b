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

#include "backend/adamw_math.h"
#include "optim/optimizer.h"

namespace qlft {

constexpr int64_t kAdam8bitBlock = 256;         // bnb blocksize for optimizer state
constexpr int64_t kAdam8bitMinElements = 4096;  // bnb min_8bit_size

// The per-step scalars of step t (1-based) at learning rate lr, as bitsandbytes' CPU backend
// computes them (in double, used as float operands); throws QLFT_ERR_INVALID_ARGUMENT for a
// negative or non-finite lr. (The host and device 8-bit AdamW share it.)
AdamBnbCoeffs adam_bnb_coeffs(const OptimSettings& s, double lr, int64_t t);

// The step count of an 8-bit AdamW checkpoint (prefix "type" and "step"), after checking that
// it is one: throws QLFT_ERR_FORMAT naming the entry and `optimizer` (the loading one's name).
// (The host and device 8-bit AdamW read the same checkpoints.)
int64_t adamw8bit_checkpoint_step(const StateDict& in, const std::string& prefix,
                                  const char* optimizer);

// A tensor of n elements keeps 8-bit blockwise state (else fp32 m and v), in this many blocks.
inline bool adam8bit_quantized(int64_t n) {
  return n >= kAdam8bitMinElements;
}
inline int64_t adam8bit_blocks(int64_t n) {
  return (n + kAdam8bitBlock - 1) / kAdam8bitBlock;
}

// store: where the state lives (a paged one for paged_adamw8bit; make_optimizer's factory).
std::unique_ptr<Optimizer> make_adamw8bit(const OptimSettings& s, std::vector<ParamRef> params,
                                          std::unique_ptr<StateStore> store);

}  // namespace qlft
