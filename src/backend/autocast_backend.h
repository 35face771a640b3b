// Autocast for train.precision = bf16 | fp16: wraps a backend and rounds the inputs of every
// matmul (linear layers and attention: x, dy, q, k, v, dout) to the low-precision type, as
// torch.autocast does, while norms, softmax statistics, cross-entropy, LoRA master weights and
// all accumulation stay fp32. With fp16, values past 65504 become inf, which the loss scaler
// detects. Base weights are used as stored (the kernels dequantize to fp32).
//
// bf16 over the CPU backend (native = true): the CPU backend computes its linear layers, LoRA,
// head and attention in bf16 itself (CpuBackend::set_precision: bf16 operands, fp32
// accumulation, on oneDNN when the CPU has AVX512-BF16, else on sgemm of the rounded values) and
// this wrapper passes their inputs through untouched (no second rounding, no copy). Base weights
// are then rounded to bf16 as well, as torch.autocast and bitsandbytes' bf16 compute dtype do;
// so are the LoRA weights and intermediates, attention's probabilities and score gradients, and
// the cross-entropy's dlogits where they enter a GEMM.
// native = false (or fp16, or another inner backend): the emulation everywhere, the reference
// the native path is tested against. Storing the kept activations in 16 bits is the runner's
// (LlamaRunner::set_activation_dtype), not this wrapper's.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/dtype.h"

namespace qlft {

// dtype: DType::BF16 or DType::F16.
std::unique_ptr<Backend> make_autocast_backend(std::unique_ptr<Backend> inner, DType dtype,
                                               bool native = true);

}  // namespace qlft
