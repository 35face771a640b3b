// The planner's searches along one setting (plan_max_micro_batch, plan_max_seq_len; declared in
// train/planner.h): the largest value whose predicted budgeted peak fits a budget; and the
// budget's choice of train.offload_checkpoints=auto (plan_offload_checkpoints).
#include <algorithm>

#include "train/planner.h"

namespace qlft {

namespace {

// The largest value in [1, upper] that *field can take with the budgeted peak at most budget
// (0: not even 1). The peak grows with both the micro-batch and the sequence length, with
// checkpoint offload off and on alike, so also with auto (a fit either way).
int plan_max_of(const ModelConfig& mc, const WeightFootprint& w, PlanSettings s,
                int PlanSettings::*field, uint64_t budget, int upper) {
  int lo = 0, hi = std::max(upper, 0) + 1;  // lo fits (0: nothing known), hi does not
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    s.*field = mid;
    if (plan_memory(mc, w, plan_offload_checkpoints(mc, w, s, budget)).budgeted_peak() <= budget)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace

PlanSettings plan_offload_checkpoints(const ModelConfig& mc, const WeightFootprint& w,
                                      PlanSettings s, uint64_t budget) {
  if (!s.offload_checkpoints_auto) return s;
  s.offload_checkpoints_auto = false;
  s.offload_checkpoints = false;
  if (budget == 0 || s.checkpoint_every <= 0) return s;
  const MemoryPlan off = plan_memory(mc, w, s);
  s.offload_checkpoints = off.device && off.budgeted_peak() > budget;
  return s;
}

int plan_max_micro_batch(const ModelConfig& mc, const WeightFootprint& w, PlanSettings s,
                         uint64_t budget, int upper) {
  return plan_max_of(mc, w, s, &PlanSettings::micro_batch, budget, upper);
}

int plan_max_seq_len(const ModelConfig& mc, const WeightFootprint& w, PlanSettings s,
                     uint64_t budget, int upper) {
  s.micro_batch = 1;
  return plan_max_of(mc, w, s, &PlanSettings::seq_len, budget, upper);
}

}  // namespace qlft
