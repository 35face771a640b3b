#include "train/planner_offload.h"

#include "model/checkpoint_offload.h"

namespace qlft {

CheckpointOffloadRows plan_checkpoint_offload(const ModelShapes& sh, int64_t rows, int n_ckpt,
                                              DType acts, uint64_t (*round)(uint64_t)) {
  CheckpointOffloadRows r;
  if (n_ckpt <= 0) return r;
  const int64_t elems = rows * sh.dim;
  const OffloadFootprint f = CheckpointOffload::footprint(elems, n_ckpt, acts, round);
  // One fp32 residual entry as LlamaRunner::prepare allocates it.
  uint64_t entry = (uint64_t(elems) * 4 + 63) / 64 * 64;
  if (round) entry = round(entry);
  r.runner_delta = int64_t(f.device) - int64_t(uint64_t(n_ckpt) * entry);
  r.host = f.host;
  return r;
}

}  // namespace qlft
