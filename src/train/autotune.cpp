// The micro-batch auto-tuner (train/autotune.h): the effective-batch rule, the cache, the
// budget, the planner's start and the agreed search over a "does this fit" callback.
#include "train/autotune.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "formats/atomic_file.h"
#include "parallel/data_parallel.h"
#include "train/planner.h"

namespace qlft {

namespace {

// Restores the tracker's limit and phase however the search ends.
struct LimitGuard {
  MemoryTracker* t;
  uint64_t old;
  ~LimitGuard() {
    t->set_limit(old);
    t->set_phase("setup");
  }
};

nlohmann::json read_cache(const std::string& path) {
  std::ifstream f(path);
  if (!f) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    if (j.is_object() && j.contains("entries") && j["entries"].is_object()) return j;
  } catch (const std::exception&) {
  }
  QLFT_LOG_W("%s: not an auto-tune cache, ignoring it (it will be rewritten)", path.c_str());
  return nlohmann::json::object();
}

void write_cache(const std::string& path, const std::string& key, const AutotuneResult& r) {
  try {
    nlohmann::json j = read_cache(path);
    j["version"] = 1;
    nlohmann::json e;
    e["micro_batch"] = r.micro_batch;
    e["accumulation"] = r.accumulation;
    e["max_fit"] = r.max_fit;
    e["first_fail"] = r.first_fail;
    e["trials"] = r.trials.size();
    j["entries"][key] = e;
    const size_t slash = path.rfind('/');
    if (slash != std::string::npos && slash > 0) ::mkdir(path.substr(0, slash).c_str(), 0755);
    write_file_atomic(path, j.dump(2) + "\n");
  } catch (const std::exception& e) {
    QLFT_LOG_W("could not write the auto-tune cache %s: %s", path.c_str(), e.what());
  }
}

// Every rank's value, in rank order (world 1: just this one).
std::vector<std::string> gather(dist::Communicator& comm, const std::string& mine) {
  if (comm.world() == 1) return {mine};
  return comm.all_gather_bytes(mine);
}

int64_t min_over_ranks(dist::Communicator& comm, int64_t v) {
  for (const std::string& s : gather(comm, std::to_string(v)))
    v = std::min<int64_t>(v, std::stoll(s));
  return v;
}

// How many ranks share this machine (and so its free RAM).
int ranks_on_this_host(dist::Communicator& comm) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  int n = 0;
  for (const std::string& h : gather(comm, host)) n += h == host ? 1 : 0;
  return std::max(n, 1);
}

// How many ranks raised a flag (one all-reduce; 0 with one rank and no flag).
int count_over_ranks(dist::Communicator& comm, bool flag) {
  double v = flag ? 1.0 : 0.0;
  if (comm.world() > 1) comm.all_reduce(&v, 1, dist::ReduceOp::Sum);
  return static_cast<int>(v + 0.5);
}

// The largest divisor of n that is at most cap (>= 1).
int64_t largest_divisor_upto(int64_t n, int64_t cap) {
  for (int64_t d = std::min(n, cap); d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

}  // namespace

AutotuneResult search_micro_batch(const std::function<bool(int, uint64_t*)>& fits, int start,
                                  int upper, int max_trials) {
  QLFT_CHECK_ARG(upper >= 1, "auto-tune: the upper bound %d must be positive", upper);
  AutotuneResult r;
  r.upper = upper;
  int lo = 0, hi = 0;  // the largest size that fit, the smallest that did not (0: none yet)
  int c = std::clamp(start, 1, upper);
  r.predicted = c;
  int step = 1;  // doubles while the search walks away from the start
  // Past max_trials the search only goes on while nothing has fit yet, halving (it must end
  // with a size that trained).
  while (static_cast<int>(r.trials.size()) < max_trials || lo == 0) {
    AutotuneTrial tr;
    tr.micro_batch = c;
    tr.fits = fits(c, &tr.peak);
    r.trials.push_back(tr);
    if (tr.fits)
      lo = std::max(lo, c);
    else
      hi = hi ? std::min(hi, c) : c;
    if (lo == upper || (hi && hi == lo + 1)) break;  // converged
    if (lo == 0) {  // nothing fit yet: back off by 1, 2, 4, ... but never more than half
      if (hi == 1) break;
      const bool over = static_cast<int>(r.trials.size()) >= max_trials;
      c = std::max(1, over ? hi / 2 : hi - std::min(step, hi / 2));
      step *= 2;
    } else if (hi == 0) {  // nothing failed yet: up by 1, 2, 4, ... but at most doubling
      c = std::min(upper, lo + std::min(step, lo));
      step *= 2;
    } else {  // bisect between the last fit and the first failure
      c = lo + (hi - lo) / 2;
    }
  }
  if (lo == 0)
    throw_error(QLFT_ERR_OUT_OF_MEMORY,
                "auto-tune: not even a micro-batch of 1 sequence fits the memory budget; raise "
                "memory.limit, lower data.seq_len, enable train.grad_checkpointing or use "
                "optim.name=paged_adamw8bit");
  r.max_fit = lo;
  r.first_fail = hi;
  return r;
}

namespace {

std::string limit_text(uint64_t limit) {
  return limit ? std::to_string(limit) : "free-ram";
}

// limits: memory.limit of every rank ("a,b" with several; "free-ram" for a 0).
std::string cache_key(const AutotuneInputs& in, const std::string& limits) {
  const Model& m = in.model;
  const RunSpec& s = in.spec;
  return strf(
      "model=%s weights=%llu arch=%s layers=%d dim=%d vocab=%d; precision=%s "
      "grad_checkpointing=%d offload_checkpoints=%d mlp_tile_rows=%lld seq_len=%d lora.r=%d "
      "lora.target_modules=%s lora.dropout=%g optim=%s "
      "effective_batch=%lld accumulation=%d ranks=%d margin=%g; zero_stage=%d "
      "offload.params=%s offload.optimizer=%s offload.buffers=%d; backend=%s threads=%d; "
      "memory.limit=%s",
      m.path.c_str(), static_cast<unsigned long long>(weight_footprint_for_plan(m, s.quant).bytes),
      m.cfg.arch.c_str(), m.cfg.n_layers, m.cfg.dim, m.cfg.vocab, name_of(s.backend.precision),
      s.train.grad_checkpointing, int(s.train.offload_checkpoints),
      static_cast<long long>(s.train.mlp_tile_rows), s.data.seq_len, s.lora.r,
      in.lora_targets.c_str(), static_cast<double>(s.lora.dropout), name_of(s.optim.kind),
      static_cast<long long>(s.train.effective_batch), s.train.accumulation, in.dp.world(),
      s.train.autotune_margin, s.dist.zero_stage, name_of(s.offload.params),
      name_of(s.offload.optimizer), s.offload.buffers, in.backend_name.c_str(), num_threads(),
      limits.c_str());
}

// A fixed micro-batch with train.effective_batch: accumulation follows from it.
AutotuneResult fixed_micro_batch_shape(const AutotuneInputs& in) {
  const TrainSpec& t = in.spec.train;
  const int ranks = in.dp.world();
  const int64_t E = t.effective_batch;
  const int64_t per = static_cast<int64_t>(t.micro_batch.n) * ranks;
  QLFT_CHECK_ARG(E % per == 0,
                 "train.effective_batch %lld is not a multiple of train.micro_batch %d x %d "
                 "rank(s)",
                 static_cast<long long>(E), t.micro_batch.n, ranks);
  const int64_t acc = E / per;
  QLFT_CHECK_ARG(!t.accumulation_set || acc == t.accumulation,
                 "train.effective_batch %lld needs train.accumulation %lld with micro_batch %d "
                 "and %d rank(s), but it is set to %d; leave it unset",
                 static_cast<long long>(E), static_cast<long long>(acc), t.micro_batch.n, ranks,
                 t.accumulation);
  QLFT_CHECK_ARG(acc <= 65536, "train.effective_batch %lld needs %lld micro-batches per step",
                 static_cast<long long>(E), static_cast<long long>(acc));
  AutotuneResult r;
  r.micro_batch = t.micro_batch.n;
  r.accumulation = static_cast<int>(acc);
  return r;
}

// Rank 0 reads the cache; every rank takes its answer (false: no entry for key within upper).
bool cached_shape(const AutotuneInputs& in, const std::string& key, int64_t upper,
                  AutotuneResult* r) {
  const std::string& cache = in.spec.train.autotune_cache;  // "": off
  int32_t hit[4] = {0, 0, 0, 0};  // micro_batch, accumulation, max_fit, first_fail
  if (!cache.empty() && in.dp.is_writer()) {
    nlohmann::json j = read_cache(cache);
    if (j.contains("entries") && j["entries"].contains(key)) {
      const nlohmann::json& e = j["entries"][key];
      if (e.is_object() && e.value("micro_batch", 0) >= 1 && e.value("accumulation", 0) >= 1 &&
          e.value("micro_batch", 0) <= upper) {
        hit[0] = e.value("micro_batch", 0);
        hit[1] = e.value("accumulation", 0);
        hit[2] = e.value("max_fit", hit[0]);
        hit[3] = e.value("first_fail", 0);
      }
    }
  }
  if (in.dp.world() > 1) in.dp.comm().broadcast(hit, sizeof hit, 0);
  if (hit[0] < 1) return false;
  r->micro_batch = hit[0];
  r->accumulation = hit[1];
  r->max_fit = hit[2];
  r->first_fail = hit[3];
  r->from_cache = true;
  QLFT_LOG_I("auto-tune: micro_batch %d, accumulation %d (from %s)", r->micro_batch,
             r->accumulation, cache.c_str());
  return true;
}

// The memory the trials may use on this rank.
struct Budget {
  uint64_t limit = 0;     // the tracker's limit before the search (0: none)
  bool device = false;    // a device budget (backend=cuda)
  uint64_t reserved = 0;  // what is held already
  uint64_t budget = 0;    // memory.limit, or what is held plus this rank's share of the free
  uint64_t trials = 0;    // (1 - margin) x budget
};

// memory.limit, or what is tracked now plus this rank's part of what is still free (ranks on
// one machine share it). Throws QLFT_ERR_OUT_OF_MEMORY on every rank when some rank's budget is
// already taken.
Budget trial_budget(const AutotuneInputs& in) {
  MemoryTracker* tr = in.tracker;
  dist::Communicator& comm = in.dp.comm();
  Budget b;
  b.limit = tr->limit();
  b.device = tr->limit_space() == MemSpace::Device;
  b.reserved = tr->budgeted_reserved();
  const uint64_t sharing = static_cast<uint64_t>(ranks_on_this_host(comm));  // collective
  b.budget = b.limit ? b.limit : b.reserved + in.free_memory() / sharing;
  const double margin = in.spec.train.autotune_margin;
  b.trials = static_cast<uint64_t>(static_cast<double>(b.budget) * (1.0 - margin));
  const bool full = b.trials <= b.reserved;
  if (count_over_ranks(comm, full) > 0) {
    if (full)
      throw_error(QLFT_ERR_OUT_OF_MEMORY,
                  "auto-tune: the memory budget (%s, less a %.0f%% margin) is already taken by "
                  "the model, adapter and optimizer (%s)%s; raise memory.limit",
                  format_bytes(b.budget).c_str(), margin * 100, format_bytes(b.reserved).c_str(),
                  in.dp.world() > 1 ? strf(" on rank %d", in.dp.rank()).c_str() : "");
    throw_error(QLFT_ERR_OUT_OF_MEMORY,
                "auto-tune: on another rank the memory budget is already taken by the model, "
                "adapter and optimizer; raise memory.limit there");
  }
  return b;
}

// The planner's view of a trial: what it holds besides the persistent categories (`other`:
// another model, say, comes off the budget) and each size's predicted peak.
struct TrialPlan {
  WeightFootprint w;
  PlanSettings ps;
  uint64_t other = 0;
};

TrialPlan trial_plan(const AutotuneInputs& in, const Budget& b, bool accumulates) {
  TrialPlan p;
  const RunSpec& s = in.spec;
  p.ps = PlanSettings::from_spec(s);
  p.ps.world = in.dp.world();
  p.ps.accumulation = accumulates ? 2 : 1;
  p.w = weight_footprint_for_plan(in.model, s.quant);
  p.ps.micro_batch = 1;
  const MemoryPlan one = plan_memory_of_rank(in.model.cfg, p.w, p.ps, in.dp.rank());
  // The categories the budget counts: the device's (a device budget and plan), else all.
  const auto& held = b.device && one.device ? one.device_train : one.train;
  uint64_t persistent = held[int(MemCategory::Weights)] + held[int(MemCategory::Adapter)] +
                        held[int(MemCategory::Gradients)] + held[int(MemCategory::Optimizer)];
  // A device backend uploads its weights at their first use (not yet), and holds its fixed
  // workspace (cuBLASLt's) from the start.
  if (b.device && one.device) persistent += one.device_fixed - held[int(MemCategory::Weights)];
  // The exchange buffer is allocated by now; ZeRO-3's gathered units are not.
  if (s.dist.zero_stage < 3) persistent += held[int(MemCategory::Communication)];
  p.other = b.reserved > persistent ? b.reserved - persistent : 0;
  return p;
}

// One trial as every rank sees it: it fits only when it fit on every rank (one all-reduce
// after it, before any other collective); an error other than out-of-memory on one rank ends
// every rank. measured (ZeRO-3, or ZeRO-2's sharded gradients, over several ranks: collectives
// inside the trial, so no rank may leave it halfway): the trial runs without the limit and fits
// when its measured peak is within it, and sizes the planner puts past some rank's whole budget
// are not run (agreed first).
bool agreed_trial(const AutotuneInputs& in, const AutotuneFits& fits, const Budget& b,
                  const TrialPlan& p, bool measured, int m, bool second, uint64_t* peak) {
  dist::Communicator& comm = in.dp.comm();
  if (measured) {
    PlanSettings pm = p.ps;
    pm.micro_batch = m;
    const bool past =
        plan_memory_of_rank(in.model.cfg, p.w, pm, in.dp.rank()).budgeted_peak() + p.other >
        b.budget;
    if (count_over_ranks(comm, past) > 0) return false;
  }
  int outcome = 0;  // 0 fit, 1 out of memory, 2 another error
  std::exception_ptr err;
  uint64_t pk = 0;
  try {
    outcome = fits(m, second, &pk) ? 0 : 1;
    if (measured && outcome == 0 && pk > b.trials) outcome = 1;
  } catch (...) {
    err = std::current_exception();
    outcome = 2;
  }
  if (in.dp.world() > 1) {
    double v[2] = {outcome == 1 ? 1.0 : 0.0, outcome == 2 ? 1.0 : 0.0};
    comm.all_reduce(v, 2, dist::ReduceOp::Sum);
    if (v[1] > 0) {
      if (err) std::rethrow_exception(err);
      throw_error(QLFT_ERR_DISTRIBUTED,
                  "auto-tune: another rank failed in its trial step of micro-batch %d", m);
    }
    if (v[0] > 0) return false;
  } else if (err) {
    std::rethrow_exception(err);
  }
  if (peak) *peak = pk;
  return outcome == 0;
}

}  // namespace

std::string autotune_cache_key(const AutotuneInputs& in) {
  return cache_key(in, limit_text(in.tracker->limit()));
}

AutotuneResult autotune_batch_shape(const AutotuneInputs& in, const AutotuneFits& fits) {
  const RunSpec& s = in.spec;
  const TrainSpec& ts = s.train;
  if (!ts.micro_batch.is_auto) return fixed_micro_batch_shape(in);
  const int ranks = in.dp.world();
  const int64_t E = ts.effective_batch;
  QLFT_CHECK_ARG(E % ranks == 0, "train.effective_batch %lld is not a multiple of the %d ranks",
                 static_cast<long long>(E), ranks);
  const int64_t per_rank = E / ranks;  // 0: nothing to hold
  int64_t upper = 65536;
  if (per_rank > 0) upper = std::min<int64_t>(upper, per_rank);
  if (in.data_rows > 0) upper = std::min<int64_t>(upper, static_cast<int64_t>(in.data_rows));

  // With several ranks every rank runs the same search and ends with the same shape: the
  // cache is rank 0's, the start and bounds are agreed (the smallest), and a trial fits only
  // when it fits on every rank.
  MemoryTracker* tr = in.tracker;
  dist::Communicator& comm = in.dp.comm();
  upper = min_over_ranks(comm, upper);
  std::string limits;
  for (const std::string& l : gather(comm, limit_text(tr->limit())))
    limits += (limits.empty() ? "" : ",") + l;
  const std::string key = cache_key(in, limits);
  AutotuneResult r;
  if (cached_shape(in, key, upper, &r)) return r;

  const Budget b = trial_budget(in);
  // Start where the planner says the largest fit is (the smallest over ranks).
  const bool accumulates_anyway = per_rank == 0 && ts.accumulation > 1;
  const TrialPlan p = trial_plan(in, b, per_rank > 0 || ts.accumulation > 1);
  const int start = static_cast<int>(min_over_ranks(
      comm,
      plan_max_micro_batch(in.model.cfg, p.w, p.ps, b.trials - p.other, static_cast<int>(upper))));
  const bool measured =
      (s.dist.zero_stage == 3 || in.dp.grad_shards() != nullptr) && in.dp.world() > 1;
  LimitGuard guard{tr, b.limit};
  tr->set_limit(measured ? 0 : b.trials);
  auto fit = [&](int m, uint64_t* peak) {
    const bool second = accumulates_anyway || (per_rank > 0 && m < per_rank);
    return agreed_trial(in, fits, b, p, measured, m, second, peak);
  };
  r = search_micro_batch(fit, std::max(start, 1), static_cast<int>(upper));
  r.predicted = start;
  r.budget = b.trials;
  r.searched = true;
  int64_t micro = r.max_fit, acc = ts.accumulation;
  if (per_rank > 0) {
    micro = largest_divisor_upto(per_rank, r.max_fit);
    acc = per_rank / micro;
    QLFT_CHECK_ARG(acc <= 65536, "train.effective_batch %lld needs %lld micro-batches per step",
                   static_cast<long long>(E), static_cast<long long>(acc));
  }
  r.micro_batch = static_cast<int>(micro);
  r.accumulation = static_cast<int>(acc);
  std::string tried;
  for (const AutotuneTrial& x : r.trials) tried += strf(" %d%s", x.micro_batch, x.fits ? "" : "!");
  QLFT_LOG_I(
      "auto-tune: micro_batch %d, accumulation %d (largest fit %d, first failure %d, planner "
      "predicted %d; trials:%s; budget %s)",
      r.micro_batch, r.accumulation, r.max_fit, r.first_fail, start, tried.c_str(),
      format_bytes(b.trials).c_str());
  if (!ts.autotune_cache.empty() && in.dp.is_writer()) write_cache(ts.autotune_cache, key, r);
  return r;
}

}  // namespace qlft
