// Autocast for train.precision = bf16 | fp16: wraps a backend and rounds the inputs of every
// matmul (linear layers and attention: x, dy, q, k, v, dout) to the low-precision type, as
// torch.autocast does, while norms, softmax statistics, cross-entropy, LoRA master weights and
// all accumulation stay fp32. With fp16, values past 65504 become inf, which the loss scaler
// detects. Base weights are used as stored (the kernels dequantize to fp32).
//
// This gives the numerics of low precision; the speed (native bf16 GEMMs) and the memory saving
// of storing activations in 16 bits belong to the kernels behind this interface.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/dtype.h"

namespace qlft {

// dtype: DType::BF16 or DType::F16.
std::unique_ptr<Backend> make_autocast_backend(std::unique_ptr<Backend> inner, DType dtype);

}  // namespace qlft
