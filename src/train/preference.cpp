// Preference losses as TRL 1.16 writes them (trl/trainer/dpo_trainer.py _compute_loss,
// trl/experimental/cpo/cpo_trainer.py cpo_loss, trl/experimental/orpo/orpo_trainer.py
// odds_ratio_loss, trl/trainer/kto_trainer.py _compute_loss), each with its derivative with
// respect to every row's summed answer log-probability, and the step that drives the runner.
#include "train/preference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "data/dataset.h"  // resolve_template
#include "model/llama.h"
#include "train/token_batch.h"

namespace qlft {

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

double sigmoid(double x) {
  return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x));
}
// -log sigmoid(x), without overflow.
double softplus_neg(double x) {
  return x >= 0 ? std::log1p(std::exp(-x)) : -x + std::log1p(std::exp(x));
}
// log(1 - exp(x)) for x < 0, branching at -ln 2 as TRL's log1mexp.
double log1mexp(double x) {
  return x < -0.6931471805599453 ? std::log1p(-std::exp(x)) : std::log(-std::expm1(x));
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? kNaN : s / static_cast<double>(v.size());
}

// Rewards, margins, accuracy and log-probability means of P pairs (TRL logs these for every
// paired objective; logp: what it logs as logps/*, rc / rr the rewards).
void pair_metrics(const std::vector<double>& rc, const std::vector<double>& rr,
                  const std::vector<double>& lc, const std::vector<double>& lr, PrefMetrics& m) {
  std::vector<double> margin(rc.size()), acc(rc.size());
  for (size_t i = 0; i < rc.size(); ++i) {
    margin[i] = rc[i] - rr[i];
    acc[i] = rc[i] > rr[i] ? 1 : 0;
  }
  m.rewards_chosen = mean_of(rc);
  m.rewards_rejected = mean_of(rr);
  m.rewards_margins = mean_of(margin);
  m.rewards_accuracies = mean_of(acc);
  m.logps_chosen = mean_of(lc);
  m.logps_rejected = mean_of(lr);
}

// DPO (sigmoid) and IPO: DPOTrainer._compute_loss with f_divergence_type reverse_kl.
void dpo_ipo(const PrefSpec& s, const PrefInput& in, size_t P, PrefMetrics& m, PrefGrad* g) {
  const double b = s.beta;
  std::vector<double> rc(P), rr(P), lc(P), lr(P);
  double loss = 0;
  for (size_t i = 0; i < P; ++i) {
    const SeqLogp &c = in.policy[i], &r = in.policy[P + i];
    const double cr = c.sum - in.ref[i], rj = r.sum - in.ref[P + i];  // log ratios
    double dc, dr;  // d (pair loss) / d c.sum, r.sum
    if (s.objective == Objective::Dpo) {
      const double z = b * (cr - rj);
      loss += softplus_neg(z);
      dc = -b * sigmoid(-z);
      dr = -dc;
    } else {  // IPO: per-token averaged log ratios (the completion lengths, at least 1)
      const double nc = std::max<int64_t>(c.n, 1), nr = std::max<int64_t>(r.n, 1);
      const double h = cr / nc - rj / nr - 1 / (2 * b);
      loss += h * h;
      dc = 2 * h / nc;
      dr = -2 * h / nr;
    }
    if (g) g->d_logp[i] = dc / double(P), g->d_logp[P + i] = dr / double(P);
    rc[i] = b * cr, rr[i] = b * rj, lc[i] = c.sum, lr[i] = r.sum;
  }
  m.loss = loss / double(P);
  pair_metrics(rc, rr, lc, lr, m);
}

// SimPO: CPOTrainer with loss_type simpo (average log-probabilities, label smoothing, the NLL of
// the chosen answers weighted by cpo_alpha: CrossEntropyLoss, a mean over all their tokens).
void simpo(const PrefSpec& s, const PrefInput& in, size_t P, PrefMetrics& m, PrefGrad* g) {
  const double b = s.beta, ls = s.label_smoothing;
  std::vector<double> rc(P), rr(P), ac(P), ar(P);
  double loss = 0, nll_sum = 0;
  int64_t nll_n = 0;
  for (size_t i = 0; i < P; ++i) nll_sum -= in.policy[i].sum, nll_n += in.policy[i].n;
  const double nll = s.cpo_alpha == 0 ? 0 : nll_sum / double(std::max<int64_t>(nll_n, 1));
  for (size_t i = 0; i < P; ++i) {
    const SeqLogp &c = in.policy[i], &r = in.policy[P + i];
    const double nc = std::max<int64_t>(c.n, 1), nr = std::max<int64_t>(r.n, 1);
    ac[i] = c.sum / nc, ar[i] = r.sum / nr;
    const double x = ac[i] - ar[i] - s.simpo_gamma / b;
    loss += softplus_neg(b * x) * (1 - ls) + softplus_neg(-b * x) * ls;
    const double dx = -b * sigmoid(-b * x) * (1 - ls) + b * sigmoid(b * x) * ls;
    if (g) {
      g->d_logp[i] = dx / double(P) / nc;
      if (s.cpo_alpha != 0) g->d_logp[i] -= s.cpo_alpha / double(std::max<int64_t>(nll_n, 1));
      g->d_logp[P + i] = -dx / double(P) / nr;
    }
    rc[i] = b * ac[i], rr[i] = b * ar[i];
  }
  m.loss = loss / double(P) + s.cpo_alpha * nll;
  m.nll_loss = nll;
  pair_metrics(rc, rr, ac, ar, m);
}

// ORPO: the NLL of the whole chosen sequences (prompt and answer tokens: one mean) minus
// beta x mean log sigmoid(log odds ratio of the average answer log-probabilities).
void orpo(const PrefSpec& s, const PrefInput& in, size_t P, PrefMetrics& m, PrefGrad* g) {
  QLFT_CHECK_ARG(in.prompt_ce.size() == in.policy.size(), "orpo: prompt losses missing");
  const double b = s.beta;
  double ce = 0;
  int64_t n = 0;
  for (size_t i = 0; i < P; ++i)
    ce += -in.policy[i].sum + in.prompt_ce[i].sum, n += in.policy[i].n + in.prompt_ce[i].n;
  const double nt = double(std::max<int64_t>(n, 1));
  std::vector<double> rc(P), rr(P), ac(P), ar(P);
  double ratio_sum = 0;
  for (size_t i = 0; i < P; ++i) {
    const SeqLogp &c = in.policy[i], &r = in.policy[P + i];
    const double nc = std::max<int64_t>(c.n, 1), nr = std::max<int64_t>(r.n, 1);
    ac[i] = c.sum / nc, ar[i] = r.sum / nr;
    const double lo = (ac[i] - ar[i]) - (log1mexp(ac[i]) - log1mexp(ar[i]));
    ratio_sum += -softplus_neg(lo);
    if (g) {
      const double dlo = -b * sigmoid(-lo) / double(P);  // d loss / d log odds
      g->d_logp[i] = dlo / -std::expm1(ac[i]) / nc - 1 / nt;
      g->d_logp[P + i] = -dlo / -std::expm1(ar[i]) / nr;
      g->d_prompt_ce[i] = 1 / nt;
    }
    rc[i] = b * ac[i], rr[i] = b * ar[i];
  }
  m.nll_loss = ce / nt;
  m.loss = m.nll_loss - b * ratio_sum / double(P);
  pair_metrics(rc, rr, ac, ar, m);
}

// KTO (loss_type kto): desirable examples 1 - sigmoid(beta (log ratio - kl)), undesirable
// 1 - sigmoid(beta (kl - log ratio)), weighted, a mean over the examples; kl has no gradient.
void kto(const PrefSpec& s, const PrefInput& in, PrefMetrics& m, PrefGrad* g) {
  const size_t N = in.policy.size();
  QLFT_CHECK_ARG(in.desirable.size() == N, "kto: a desirable flag per example");
  const double b = s.beta;
  double loss = 0, rc = 0, rr = 0, lc = 0, lr = 0;
  int64_t nc = 0, nr = 0;
  for (size_t i = 0; i < N; ++i) {
    const double x = in.policy[i].sum - in.ref[i];
    if (in.desirable[i]) {
      const double sg = sigmoid(b * (x - in.kl));
      loss += s.desirable_weight * (1 - sg);
      if (g) g->d_logp[i] = -s.desirable_weight * b * sg * (1 - sg) / double(N);
      rc += b * x, lc += in.policy[i].sum, ++nc;
    } else {
      const double sg = sigmoid(b * (in.kl - x));
      loss += s.undesirable_weight * (1 - sg);
      if (g) g->d_logp[i] = s.undesirable_weight * b * sg * (1 - sg) / double(N);
      rr += b * x, lr += in.policy[i].sum, ++nr;
    }
  }
  m.loss = loss / double(N);
  m.kl = in.kl;
  m.rewards_chosen = nc ? rc / double(nc) : kNaN;
  m.logps_chosen = nc ? lc / double(nc) : kNaN;
  m.rewards_rejected = nr ? rr / double(nr) : kNaN;
  m.logps_rejected = nr ? lr / double(nr) : kNaN;
  m.rewards_margins = nc && nr ? m.rewards_chosen - m.rewards_rejected : kNaN;
  m.rewards_accuracies = kNaN;
}

std::vector<SeqLogp> to_logps(const std::vector<LossResult>& rows) {
  std::vector<SeqLogp> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = {-rows[i].loss_sum, rows[i].count};
  return out;
}

// Each row's answer log-probability, inference mode, with the adapter on or off.
std::vector<SeqLogp> eval_rows(LlamaRunner& r, const data::Batch& b, bool adapter) {
  SeqObjective measure;
  r.set_seq_objective(&measure);
  r.set_lora_enabled(adapter);
  try {
    r.eval_loss(token_batch(b));
  } catch (...) {
    r.set_lora_enabled(true);
    r.set_seq_objective(nullptr);
    throw;
  }
  r.set_lora_enabled(true);
  r.set_seq_objective(nullptr);
  return to_logps(r.seq_losses());
}

}  // namespace

bool is_paired(Objective o) {
  return o == Objective::Dpo || o == Objective::Ipo || o == Objective::Orpo ||
         o == Objective::Simpo;
}
bool needs_reference(Objective o) {
  return o == Objective::Dpo || o == Objective::Ipo || o == Objective::Kto;
}

PrefMetrics preference_loss(const PrefSpec& s, const PrefInput& in, PrefGrad* g) {
  const size_t R = in.policy.size();
  QLFT_CHECK_ARG(R > 0, "preference loss of an empty batch");
  QLFT_CHECK_ARG(!needs_reference(s.objective) || in.ref.size() == R,
                 "%s: a reference log-probability per row", name_of(s.objective));
  QLFT_CHECK_ARG(!is_paired(s.objective) || R % 2 == 0, "%s: rows come in pairs",
                 name_of(s.objective));
  if (g) g->d_logp.assign(R, 0.0), g->d_prompt_ce.assign(R, 0.0);
  PrefMetrics m;
  m.rows = static_cast<int64_t>(R);
  switch (s.objective) {
    case Objective::Dpo:
    case Objective::Ipo:
      dpo_ipo(s, in, R / 2, m, g);
      break;
    case Objective::Simpo:
      simpo(s, in, R / 2, m, g);
      break;
    case Objective::Orpo:
      orpo(s, in, R / 2, m, g);
      break;
    case Objective::Kto:
      kto(s, in, m, g);
      break;
    case Objective::Sft:
      throw_error(QLFT_ERR_INVALID_ARGUMENT, "preference_loss: train.objective is sft");
  }
  return m;
}

PrefSet PrefSet::load(const DataSpec& d, Objective o, const data::TextEncoder& enc) {
  QLFT_CHECK_ARG(o != Objective::Sft, "PrefSet: train.objective is sft");
  const bool kto = o == Objective::Kto;
  data::DropLog log;
  std::vector<data::PrefRecord> recs = data::read_preference_records(d.path, kto, d, log);
  PrefSet set;
  set.records = recs.size() + log.count;
  set.dropped = log.count;
  data::ChatTemplate chat;
  bool have_chat = false;
  for (const data::PrefRecord& r : recs) {
    if (r.chat && !have_chat) {
      std::string source;
      chat = data::resolve_template(d.chat_template, enc, &source);
      have_chat = true;
    }
    data::PrefExample e = data::tokenize_preference(r, kto, enc, have_chat ? &chat : nullptr);
    const size_t len = e.prompt.size() + std::max(e.chosen.size(), e.rejected.size());
    if (len > static_cast<size_t>(d.seq_len)) {
      ++set.dropped;
      continue;
    }
    set.examples.push_back(std::move(e));
  }
  QLFT_CHECK_FORMAT(!set.examples.empty(),
                    "%s: no usable %s records ({\"prompt\", %s}) of at most data.seq_len=%d tokens",
                    d.path.c_str(), kto ? "KTO" : "preference",
                    kto ? "\"completion\", \"label\"" : "\"chosen\", \"rejected\"", d.seq_len);
  return set;
}

void preference_logps(LlamaRunner& runner, const data::Batch& rows, bool reference,
                      std::vector<SeqLogp>* policy, std::vector<double>* ref) {
  if (policy) *policy = eval_rows(runner, rows, true);
  if (reference && ref) {
    std::vector<SeqLogp> r = eval_rows(runner, rows, false);
    ref->resize(r.size());
    for (size_t i = 0; i < r.size(); ++i) (*ref)[i] = r[i].sum;
  }
}

namespace {

struct RowSpec {
  const std::vector<int32_t>* prompt;
  const std::vector<int32_t>* answer;
};

// Rows of prompt + answer right-padded to seq: targets on the answer, prompt_targets (when
// given) on the prompt's next tokens.
data::Batch fill_rows(const std::vector<RowSpec>& rows, int seq, int32_t pad,
                      std::vector<int32_t>* prompt_targets) {
  data::Batch b;
  b.micro_batch = b.rows = static_cast<int>(rows.size());
  b.seq_len = seq;
  const size_t n = rows.size() * static_cast<size_t>(seq);
  b.tokens.assign(n, pad);
  b.targets.assign(n, kIgnoreIndex);
  if (prompt_targets) prompt_targets->assign(n, kIgnoreIndex);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<int32_t> ids = *rows[r].prompt;
    ids.insert(ids.end(), rows[r].answer->begin(), rows[r].answer->end());
    const size_t np = rows[r].prompt->size(), off = r * static_cast<size_t>(seq);
    std::copy(ids.begin(), ids.end(), b.tokens.begin() + static_cast<std::ptrdiff_t>(off));
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      if (t + 1 >= np)
        b.targets[off + t] = ids[t + 1];
      else if (prompt_targets)
        (*prompt_targets)[off + t] = ids[t + 1];
    }
  }
  for (int32_t x : b.targets) b.trained_tokens += x != kIgnoreIndex;
  return b;
}

}  // namespace

PrefBatch make_pref_batch(const std::vector<const data::PrefExample*>& ex, Objective o,
                          int32_t pad_id) {
  QLFT_CHECK_ARG(!ex.empty(), "a preference micro-batch needs examples");
  std::vector<RowSpec> rows, kl;
  if (o == Objective::Kto) {
    for (const data::PrefExample* e : ex) rows.push_back({&e->prompt, &e->chosen});
    for (size_t j = 0; j < ex.size(); ++j)  // TRL: answers rotated by one
      kl.push_back({&ex[j]->prompt, &ex[(j + ex.size() - 1) % ex.size()]->chosen});
  } else {
    for (const data::PrefExample* e : ex) rows.push_back({&e->prompt, &e->chosen});
    for (const data::PrefExample* e : ex) rows.push_back({&e->prompt, &e->rejected});
  }
  size_t seq = 1;
  for (const auto* v : {&rows, &kl})
    for (const RowSpec& r : *v) seq = std::max(seq, r.prompt->size() + r.answer->size());
  PrefBatch b;
  b.rows = fill_rows(rows, static_cast<int>(seq), pad_id,
                     o == Objective::Orpo ? &b.prompt_targets : nullptr);
  if (o == Objective::Kto) {
    b.kl_rows = fill_rows(kl, static_cast<int>(seq), pad_id, nullptr);
    for (const data::PrefExample* e : ex) b.desirable.push_back(e->desirable ? 1 : 0);
  }
  return b;
}

PrefMetrics preference_forward_backward(LlamaRunner& runner, const PrefSpec& s, const PrefBatch& b,
                                        float grad_scale, uint64_t dropout_seed) {
  const Objective o = s.objective;
  PrefInput in;
  if (needs_reference(o) && !b.ref.empty()) {
    QLFT_CHECK_ARG(b.ref.size() == static_cast<size_t>(b.rows.micro_batch),
                   "%s: %zu precomputed reference log-probabilities for %d rows", name_of(o),
                   b.ref.size(), b.rows.micro_batch);
    in.ref = b.ref;
  } else if (needs_reference(o)) {
    preference_logps(runner, b.rows, true, nullptr, &in.ref);
  }
  if (o == Objective::Kto) {
    QLFT_CHECK_ARG(b.kl_rows.micro_batch == b.rows.micro_batch, "kto: a KL row per example");
    in.desirable = b.desirable;
    std::vector<SeqLogp> pol;
    std::vector<double> ref;
    preference_logps(runner, b.kl_rows, true, &pol, &ref);
    double kl = 0;
    for (size_t i = 0; i < pol.size(); ++i) kl += pol[i].sum - ref[i];
    in.kl = std::max(0.0, kl / double(pol.size()));
  }
  PrefMetrics m;
  SeqObjective obj;
  if (o == Objective::Orpo) {
    QLFT_CHECK_ARG(b.prompt_targets.size() == b.rows.targets.size(),
                   "orpo: prompt targets missing");
    obj.aux_targets = b.prompt_targets.data();
  }
  obj.weigh = [&](const std::vector<LossResult>& main, const std::vector<LossResult>& aux,
                  std::vector<float>& ms, std::vector<float>& as) {
    in.policy = to_logps(main);
    in.prompt_ce.clear();
    for (const LossResult& a : aux) in.prompt_ce.push_back({a.loss_sum, a.count});
    PrefGrad g;
    m = preference_loss(s, in, &g);
    // Row i's cross-entropy sum is -logp: its scale is -d loss / d logp.
    for (size_t i = 0; i < ms.size(); ++i) {
      ms[i] = static_cast<float>(-g.d_logp[i] * grad_scale);
      if (!g.d_prompt_ce.empty()) as[i] = static_cast<float>(g.d_prompt_ce[i] * grad_scale);
    }
  };
  runner.set_seq_objective(&obj);
  try {
    runner.forward(token_batch(b.rows), 0.f, dropout_seed);
    runner.backward();
  } catch (...) {
    runner.set_seq_objective(nullptr);
    throw;
  }
  runner.set_seq_objective(nullptr);
  return m;
}

}  // namespace qlft
