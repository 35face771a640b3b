// Preference objectives (train.objective = dpo | ipo | orpo | simpo | kto), computed as TRL 1.16
// computes them, over sequences whose answer tokens are the loss targets.
//
// Every objective is a function of a few numbers per sequence: the summed log-probability of
// its answer tokens under the policy (adapter on), their count, and for DPO / IPO / KTO the same
// sum under the reference (the same frozen base with the adapter switched off: no second
// model). So one step is: the reference pass (inference forwards with the adapter off), the
// policy's training forward measuring each row's sum (LlamaRunner's SeqObjective), the loss
// and its derivative d loss / d (row's sum) here, which become each row's gradient scale on
// its tokens' cross-entropy in the same forward's fused head, then the usual backward.
//
// Batch layout (PrefBatch::rows): paired objectives put the P pairs' chosen sequences in rows
// [0, P) and their rejected ones in [P, 2P) (TRL's concatenated order); KTO's rows are its
// examples, each desirable or not, with TRL's KL rows (row j's prompt with row j-1's answer)
// in kl_rows.
#pragma once

#include <cstdint>
#include <vector>

#include "config/run_spec.h"
#include "data/batches.h"
#include "data/preference.h"

namespace qlft {

class LlamaRunner;

// TRL's logged values (its names: rewards/chosen, ..., logps/rejected, nll_loss, kl). NaN
// where the objective logs none (KTO: accuracies; margins without both kinds).
struct PrefMetrics {
  double loss = 0;
  double rewards_chosen = 0, rewards_rejected = 0, rewards_margins = 0, rewards_accuracies = 0;
  double logps_chosen = 0, logps_rejected = 0;
  double nll_loss = 0;  // ORPO, SimPO with cpo_alpha
  double kl = 0;        // KTO
  int64_t rows = 0;     // sequences (2 per pair)
};

// One sequence's answer tokens under a model: the summed log-probability and the count.
struct SeqLogp {
  double sum = 0;
  int64_t n = 0;
};

struct PrefInput {
  std::vector<SeqLogp> policy;     // per row
  std::vector<double> ref;         // per row: the reference's sum (DPO, IPO, KTO)
  std::vector<SeqLogp> prompt_ce;  // ORPO, per row: cross-entropy sum and count of the prompt
                                   // tokens (its NLL term trains the whole chosen sequence)
  std::vector<uint8_t> desirable;  // KTO, per row
  double kl = 0;                   // KTO: the batch's KL estimate, clamped at 0 (no gradient)
};

// d loss / d policy[i].sum, and d loss / d (row i's prompt cross-entropy sum) for ORPO.
struct PrefGrad {
  std::vector<double> d_logp, d_prompt_ce;
};

// The loss (a mean over the batch's pairs or examples, as TRL's) and its metrics; grad
// (optional) receives the derivatives.
PrefMetrics preference_loss(const PrefSpec& s, const PrefInput& in, PrefGrad* grad);

bool is_paired(Objective o);
bool needs_reference(Objective o);

// One micro-batch for a preference objective.
struct PrefBatch {
  data::Batch rows;                     // see the layout above; targets: answer tokens only
  std::vector<int32_t> prompt_targets;  // ORPO: the prompt tokens' next-token targets (else -100)
  std::vector<uint8_t> desirable;       // KTO, per row
  data::Batch kl_rows;                  // KTO
  // The rows' reference log-probabilities when precomputed (train/preference_ref_cache.h);
  // empty: the reference pass runs.
  std::vector<double> ref;
};

// Examples as one micro-batch: paired objectives take pairs (rows: every chosen, then every
// rejected), KTO examples (and their KL rows). Rows are prompt + answer, right-padded with pad_id
// to the longest row; the answer tokens are the targets.
PrefBatch make_pref_batch(const std::vector<const data::PrefExample*>& ex, Objective o,
                          int32_t pad_id);

// The micro-batch's reference pass, training forward and backward on `runner`: LoRA gradients
// accumulate grad_scale x d loss / d weights. Returns the loss and metrics.
PrefMetrics preference_forward_backward(LlamaRunner& runner, const PrefSpec& s, const PrefBatch& b,
                                        float grad_scale, uint64_t dropout_seed);

// A preference training set (train.objective != sft, data.path's records): tokenized, those
// longer than data.seq_len dropped (counted), in data.path's order; the trainer draws a seeded
// order per epoch (Trainer::step).
struct PrefSet {
  std::vector<data::PrefExample> examples;
  uint64_t records = 0, dropped = 0;
  static PrefSet load(const DataSpec& d, Objective o, const data::TextEncoder& enc);
};

// The sequences' answer log-probabilities under the policy and, with reference, the reference,
// without training (held-out accuracy: the policy's reward margin > 0).
void preference_logps(LlamaRunner& runner, const data::Batch& rows, bool reference,
                      std::vector<SeqLogp>* policy, std::vector<double>* ref);

}  // namespace qlft
