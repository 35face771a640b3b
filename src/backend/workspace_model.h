// What a backend's kernels hold as scratch (the `workspace` category), as the memory planner
// (train/planner.h) asks it: the planner knows which tensors a training step keeps, each backend
// knows what its own operations allocate beside them. Each method returns the most scratch bytes
// one operation holds at once, in the bytes its allocator counts (round()).
//
// The CPU model is backend/cpu/cpu_workspace.cpp (its panels, attention tiles and cross-entropy
// chunks, from CpuTuning's defaults and the thread count); the CUDA model is
// backend/cuda_workspace.cpp, plain C++ on the block sizes the CUDA backend allocates with
// (backend/cuda_sizes.h), so a plan for backend=cuda needs no GPU or CUDA build.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/run_spec.h"
#include "arch/model_shapes.h"

namespace qlft {

// Bytes the tracker counts for a host Buffer of n bytes (rounded up to 64), and of n floats.
inline uint64_t buffer_bytes(uint64_t n) {
  return (n + 63) / 64 * 64;
}
inline uint64_t float_buffer_bytes(int64_t floats) {
  return buffer_bytes(static_cast<uint64_t>(floats) * 4);
}

struct WorkspaceModelSettings {
  Precision precision = Precision::FP32;  // train.precision
  int threads = 1;                        // kernel threads (the CPU's per-thread tiles)
  int lora_r = 0;
  float lora_scale = 0.f;  // LoraConfig::scale()
  bool dropout = false;    // lora.dropout > 0
};

class WorkspaceModel {
 public:
  virtual ~WorkspaceModel() = default;
  // Whether this backend's tensors are device memory (counted apart from the host's).
  virtual bool device() const = 0;
  // How the allocator rounds a Buffer of n bytes (n already rounded to 64 as Buffer does): a
  // plain function, as LlamaRunner::footprint takes it; nullptr: not beyond 64 (host memory).
  using RoundFn = uint64_t (*)(uint64_t);
  virtual RoundFn round_fn() const { return nullptr; }
  uint64_t round(uint64_t n) const {
    const RoundFn f = round_fn();
    return f ? f(n) : n;
  }
  // Held for the backend's lifetime (the cuBLASLt workspace).
  virtual uint64_t fixed() const { return 0; }
  // linear_fwd / linear_bwd (dx wanted) of a weight [N, K] on M rows; lora: the projection has
  // an adapter (its xa kept by the runner); shared: its input is shared with other projections
  // (Backend::begin_shared_input: q/k/v, gate/up), whose converted copy a backend may hold.
  virtual uint64_t linear_fwd(int64_t N, int64_t K, int64_t M, bool lora, bool shared) const = 0;
  virtual uint64_t linear_bwd(int64_t N, int64_t K, int64_t M, bool lora, bool shared) const = 0;
  // rope over T positions (0 .. T-1), attention of B sequences of T tokens.
  virtual uint64_t rope(const ModelShapes& c, int64_t T) const = 0;
  virtual uint64_t attention_fwd(const ModelShapes& c, int64_t B, int64_t T) const = 0;
  virtual uint64_t attention_bwd(const ModelShapes& c, int64_t B, int64_t T) const = 0;
  // attention_bwd of a stored layer (Backend::attention_bwd_16 where the runner's direct16()
  // backward calls it); a checkpointed layer's is attention_bwd.
  virtual uint64_t attention_bwd_stored(const ModelShapes& c, int64_t B, int64_t T) const {
    return attention_bwd(c, B, T);
  }
  // The fused head + cross-entropy with dh over R rows, every target trained.
  virtual uint64_t cross_entropy(const ModelShapes& c, int64_t R) const = 0;
};

// make_workspace_model(BackendKind, settings): backend/backend_select.h, beside make_backend.

}  // namespace qlft
