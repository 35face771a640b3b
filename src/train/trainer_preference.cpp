// Trainer::step_pref: an optimizer step of a preference objective. It runs step_on (clipping,
// scaler, optimizer, schedule, rollback on failure) over the micro-batches' rows, whose
// passes step_on hands to preference_forward_backward while pref_batches_ is set.
#include <sys/stat.h>

#include <cmath>

#include "core/error.h"
#include "data/packing.h"  // seeded_shuffle
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
  r.preference = true;
  r.pref = avg;
  if (out) *out = r;
  if (m) *m = avg;
}

void Trainer::init_pref_ref(const RunSpec& spec) {
  if (!pref_set_ || !spec.pref.precompute_ref || !needs_reference(pref_.objective)) return;
  // The model as stored: its file (size, time), how it was quantized, and where and at what
  // precision it runs; with the examples' tokens, the cache's key.
  std::string model = model_.path;
  struct stat st {};
  if (::stat(model_.path.c_str(), &st) == 0)
    model += "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtime);
  model += std::string("|") + name_of(spec.quant.type) + "|" +
           std::to_string(spec.quant.blocksize) + "|" + (spec.quant.double_quant ? "dq" : "") +
           "|" + name_of(spec.backend.kind) + "|" + name_of(spec.backend.precision);
  pref_ref_key_ = PrefRefCache::key_of(*pref_set_, pref_.objective, model);
  pref_ref_path_ = PrefRefCache::path_of(spec.data.path, pref_ref_key_);
}

bool Trainer::pref_done() const {
  if (ts_.max_steps > 0) return step_ >= ts_.max_steps;
  return pref_pos_ >= pref_set_->examples.size() * uint64_t(pref_epochs_);
}

bool Trainer::step_preference(StepReport* out) {
  QLFT_CHECK_ARG(pref_set_,
                 "train.objective=%s trains on preference records: load the dataset with the "
                 "same train.objective (its rows are next-token data)",
                 name_of(pref_.objective));
  if (pref_done()) return false;
  if (cancel_requested()) throw_error(QLFT_ERR_CANCELLED, "training was cancelled");
  // The example stream: epoch e's seeded permutation of the examples, then epoch e + 1's; with
  // max_steps the epochs repeat. A step takes accumulation micro-batches of micro_batch.
  const uint64_t n = pref_set_->examples.size();
  std::vector<PrefBatch> batches;
  uint64_t pos = pref_pos_;
  std::vector<uint32_t> order;
  uint64_t order_epoch = ~0ull;
  for (int a = 0; a < ts_.accumulation; ++a) {
    std::vector<const data::PrefExample*> ex;
    for (int i = 0; i < ts_.micro_batch; ++i, ++pos) {
      if (ts_.max_steps == 0 && pos >= n * uint64_t(pref_epochs_)) break;
      if (pos / n != order_epoch) {
        order_epoch = pos / n;
        order.resize(n);
        for (uint32_t k = 0; k < n; ++k) order[k] = k;
        data::seeded_shuffle(order, ts_.seed * 1000003ull + order_epoch);
      }
      ex.push_back(&pref_set_->examples[order[pos % n]]);
    }
    if (ex.empty()) continue;
    batches.push_back(make_pref_batch(ex, pref_.objective, 0));
    if (!pref_ref_path_.empty()) {  // pref.precompute_ref: the pass once, before any training
      if (!pref_ref_)
        pref_ref_ = std::make_unique<PrefRefCache>(
            PrefRefCache::make(*runner_, *pref_set_, pref_.objective, ts_.micro_batch,
                               pref_ref_path_, pref_ref_key_, &pref_ref_loaded_));
      pref_ref_->fill(ex, *pref_set_, batches.back());
    }
  }
  step_pref(batches, out);
  pref_pos_ = pos;  // only after the step succeeded
  return true;
}

}  // namespace qlft
