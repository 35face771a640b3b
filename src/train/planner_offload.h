// The memory planner's rows for offloaded checkpoints (train.offload_checkpoints,
// model/checkpoint_offload.h), kept apart so the long-context estimate (criterion 1 of issue
// 47: the auto-tuner choosing tiles and offload) can ask for them alone.
#pragma once

#include <cstdint>

#include "arch/model_shapes.h"
#include "core/dtype.h"

namespace qlft {

struct CheckpointOffloadRows {
  // What the runner's memory holds instead of the checkpointed layers' saved inputs: the ring
  // of slots less the n_ckpt inputs the residual stream no longer keeps (negative when offload
  // saves memory).
  int64_t runner_delta = 0;
  uint64_t host = 0;  // the pinned host copies (activations, host memory)
};

// rows: rows of a micro-batch (batch x seq); n_ckpt: checkpointed layers; acts: the activation
// storage type; round: the backend's allocator rounding (nullptr: host memory, 64-byte).
CheckpointOffloadRows plan_checkpoint_offload(const ModelShapes& sh, int64_t rows, int n_ckpt,
                                              DType acts, uint64_t (*round)(uint64_t));

}  // namespace qlft
