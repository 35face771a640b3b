// The one place src/ chooses a backend.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace qlft {

// The `backend` key -> a backend: "cpu" (or empty), or "cuda" through the CUDA plugin
// (backend/cuda_plugin.h; QLFT_ERR_UNSUPPORTED naming the file and the missing library when it
// cannot be loaded). precision: train.precision ("fp32", "bf16", "fp16"); tf32: cuda.tf32.
std::unique_ptr<Backend> make_backend(const std::string& name, MemoryTracker* tracker,
                                      const std::string& precision = "fp32", bool tf32 = false);

}  // namespace qlft
