// Trainer::step_pref: an optimizer step of a preference objective. It runs step_on (clipping,
// scaler, optimizer, schedule, rollback on failure) over the micro-batches' rows, whose
// passes step_on hands to preference_forward_backward while pref_batches_ is set.
#include <cmath>

#include "core/error.h"
#include "train/trainer.h"

namespace qlft {

void Trainer::step_pref(const std::vector<PrefBatch>& batches, StepReport* out, PrefMetrics* m) {
  QLFT_CHECK_ARG(pref_.objective != Objective::Sft, "step_pref: train.objective is sft");
  QLFT_CHECK_ARG(world() == 1, "preference objectives train on one rank");
  QLFT_CHECK_ARG(!batches.empty(), "step_pref: no micro-batches");
  std::vector<data::Batch> rows;
  for (const PrefBatch& b : batches) rows.push_back(b.rows);
  pref_seen_.clear();
  pref_batches_ = &batches;
  StepReport r;
  try {
    step_on(rows, &r);
  } catch (...) {
    pref_batches_ = nullptr;
    throw;
  }
  pref_batches_ = nullptr;
  // Means over the micro-batches (NaN stays NaN: a metric TRL does not log).
  PrefMetrics avg;
  const double k = static_cast<double>(pref_seen_.size());
  for (const PrefMetrics& p : pref_seen_) {
    avg.loss += p.loss / k;
    avg.rewards_chosen += p.rewards_chosen / k;
    avg.rewards_rejected += p.rewards_rejected / k;
    avg.rewards_margins += p.rewards_margins / k;
    avg.rewards_accuracies += p.rewards_accuracies / k;
    avg.logps_chosen += p.logps_chosen / k;
    avg.logps_rejected += p.logps_rejected / k;
    avg.nll_loss += p.nll_loss / k;
    avg.kl += p.kl / k;
    avg.rows += p.rows;
  }
  r.loss = avg.loss;
  if (out) *out = r;
  if (m) *m = avg;
}

}  // namespace qlft
