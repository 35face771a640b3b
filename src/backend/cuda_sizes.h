// The CUDA backend's block sizes, in plain C++: the backend (cuda/src) allocates with them and the
// memory planner's model of its device memory (backend/cuda_workspace.h) predicts with them, so
// the two cannot drift, and a plan for backend=cuda needs no CUDA build.
#pragma once

#include <cstdint>

namespace qlft {

// One dequantized weight tile (a panel of weight rows) of a base GEMM.
constexpr int64_t kCudaPanelBytes = int64_t(64) << 20;
// The fused cross-entropy's fp32 logits chunk (rows x vocabulary panel).
constexpr int64_t kCudaCeLogitsBytes = int64_t(256) << 20;
// cuBLASLt's workspace, allocated once per backend.
constexpr uint64_t kCudaLtWorkspaceBytes = uint64_t(32) << 20;
// Weight panels hold at least this many rows, whatever the width.
constexpr int64_t kCudaPanelMinRows = 64;

// Bytes the caching device allocator holds for a request of `bytes`: sizes under 1 MiB round up
// to 512 bytes, larger ones to 2 MiB (so freed blocks fit later requests of nearby sizes).
constexpr uint64_t cuda_alloc_round(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  const uint64_t r = bytes < (uint64_t(1) << 20) ? 512 : (uint64_t(2) << 20);
  return (bytes + r - 1) / r * r;
}

}  // namespace qlft
