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

#include "backend/cuda_plugin.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "parallel/data_parallel.h"
#include "formats/atomic_file.h"
#include "train/planner.h"
#include "train/trainer.h"

namespace qlft {

namespace {

// What the OS says could still be allocated without swapping (/proc/meminfo MemAvailable).
uint64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// What a budget of 0 may still use: the device's free memory for a device budget, else the
// OS's MemAvailable.
uint64_t available(MemoryTracker* tr, bool device) {
  if (!device) return mem_available();
  return cuda_plugin::get("auto-tune's device budget").device_available(tr);
}

// A device backend's trial starts with its caching allocator's free blocks returned: the
// allocator hands a request a cached block of up to twice its size, so blocks left by a larger
// trial would inflate a smaller one and make a trial's outcome depend on the trials before it.
void empty_device_cache(Trainer& t) {
  if (t.runner().backend().device_memory()) cuda_plugin::get("auto-tune").empty_cache(t.tracker());
}

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

bool autotune_trial(Trainer& t, int micro_batch, int seq_len, bool second_forward, uint64_t* peak) {
  MemoryTracker* tr = t.tracker();
  const int vocab = t.model().cfg.vocab;
  const int64_t R = static_cast<int64_t>(micro_batch) * seq_len;
  // Synthetic rows, one document each, every target trained: the most a batch can hold (the
  // cross-entropy chunk grows with the trained targets). Plain vectors, like data batches.
  std::vector<int32_t> tokens(R), targets(R), pos(R), docs(R, 0);
  for (int64_t i = 0; i < R; ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + 1) % vocab);
    targets[i] = static_cast<int32_t>((i * 13 + 5) % vocab);
    pos[i] = static_cast<int32_t>(i % seq_len);
  }
  TokenBatch tb;
  tb.batch = micro_batch;
  tb.seq = seq_len;
  tb.tokens = tokens.data();
  tb.targets = targets.data();
  tb.positions = pos.data();
  tb.doc_ids = docs.data();
  LlamaRunner& run = t.runner();
  auto undo = [&] {
    run.release();
    t.lora().zero_grad();
    tr->set_phase("setup");
  };
  empty_device_cache(t);
  tr->reset_peaks();
  try {
    const float scale = 1.f / static_cast<float>(R);
    run.forward(tb, scale, /*dropout_seed=*/1);
    run.backward();
    // With accumulation the next micro-batch's forward runs beside the backward temporaries.
    if (second_forward) run.forward(tb, scale, 2);
  } catch (const Error& e) {
    undo();
    if (e.status() == QLFT_ERR_OUT_OF_MEMORY) return false;
    throw;
  } catch (...) {
    undo();
    throw;
  }
  if (peak) *peak = tr->budgeted_peak();
  undo();
  return true;
}

namespace {

// limits: memory.limit of every rank ("a,b" with several; "free-ram" for a 0).
std::string cache_key(const Trainer& t, const RunSpec& s, int ranks, const std::string& limits) {
  const Model& m = t.model();
  const TrainSettings& ts = t.settings();
  const int threads = num_threads();
  Trainer& mt = const_cast<Trainer&>(t);
  return strf(
      "model=%s weights=%llu arch=%s layers=%d dim=%d vocab=%d; precision=%s "
      "grad_checkpointing=%d seq_len=%d lora.r=%d lora.target_modules=%s lora.dropout=%g optim=%s "
      "effective_batch=%lld accumulation=%d ranks=%d margin=%g; zero_stage=%d "
      "offload.params=%s offload.optimizer=%s offload.buffers=%d; backend=%s threads=%d; "
      "memory.limit=%s",
      m.path.c_str(), static_cast<unsigned long long>(weight_footprint_for_plan(m, s.quant).bytes),
      m.cfg.arch.c_str(), m.cfg.n_layers, m.cfg.dim, m.cfg.vocab, name_of(ts.precision),
      s.train.grad_checkpointing, s.data.seq_len, s.lora.r,
      mt.lora().config().targets_string().c_str(), static_cast<double>(s.lora.dropout),
      name_of(s.optim.kind), static_cast<long long>(ts.effective_batch), ts.accumulation, ranks,
      s.train.autotune_margin, s.dist.zero_stage, name_of(s.offload.params),
      name_of(s.offload.optimizer), s.offload.buffers, mt.runner().backend().name(), threads,
      limits.c_str());
}

std::string limit_text(uint64_t limit) {
  return limit ? std::to_string(limit) : "free-ram";
}

}  // namespace

std::string autotune_cache_key(const Trainer& t, const RunSpec& s, int ranks) {
  return cache_key(t, s, ranks, limit_text(t.tracker()->limit()));
}

AutotuneResult autotune_batch_shape(Trainer& t, const RunSpec& spec, int ranks) {
  const TrainSettings ts = t.settings();
  ranks = std::max(ranks, 1);
  const int64_t E = ts.effective_batch;
  AutotuneResult r;
  if (!ts.micro_batch_auto) {
    // A fixed micro-batch: accumulation follows from the effective batch.
    const int64_t per = static_cast<int64_t>(ts.micro_batch) * ranks;
    QLFT_CHECK_ARG(E % per == 0,
                   "train.effective_batch %lld is not a multiple of train.micro_batch %d x %d "
                   "rank(s)",
                   static_cast<long long>(E), ts.micro_batch, ranks);
    const int64_t acc = E / per;
    QLFT_CHECK_ARG(!spec.train.accumulation_set || acc == ts.accumulation,
                   "train.effective_batch %lld needs train.accumulation %lld with micro_batch %d "
                   "and %d rank(s), but it is set to %d; leave it unset",
                   static_cast<long long>(E), static_cast<long long>(acc), ts.micro_batch, ranks,
                   ts.accumulation);
    QLFT_CHECK_ARG(acc <= 65536, "train.effective_batch %lld needs %lld micro-batches per step",
                   static_cast<long long>(E), static_cast<long long>(acc));
    t.set_batch_shape(ts.micro_batch, static_cast<int>(acc));
    r.micro_batch = ts.micro_batch;
    r.accumulation = static_cast<int>(acc);
    return r;
  }
  QLFT_CHECK_ARG(E % ranks == 0, "train.effective_batch %lld is not a multiple of the %d ranks",
                 static_cast<long long>(E), ranks);
  const int64_t per_rank = E / ranks;  // 0: nothing to hold
  const int seq = spec.data.seq_len;
  int64_t upper = 65536;
  if (per_rank > 0) upper = std::min<int64_t>(upper, per_rank);
  if (t.train_data())
    upper = std::min<int64_t>(
        upper, std::max<int64_t>(1, static_cast<int64_t>(t.train_data()->train().rows())));

  // With several ranks every rank runs the same search and ends with the same shape: the
  // cache is rank 0's, the start and bounds are agreed (the smallest), and a trial fits only
  // when it fits on every rank (one all-reduce after each; no rank leaves a trial early while
  // another is inside a collective of it).
  MemoryTracker* tr = t.tracker();
  dist::DataParallel& dp = t.data_parallel();
  dist::Communicator& comm = dp.comm();
  const int world = dp.world();
  upper = min_over_ranks(comm, upper);
  std::string limits;
  for (const std::string& l : gather(comm, limit_text(tr->limit())))
    limits += (limits.empty() ? "" : ",") + l;
  const std::string& cache = spec.train.autotune_cache;  // "": off
  const std::string key = cache_key(t, spec, ranks, limits);
  {
    // Rank 0 reads the cache; every rank takes its answer.
    int32_t hit[4] = {0, 0, 0, 0};  // micro_batch, accumulation, max_fit, first_fail
    if (!cache.empty() && dp.is_writer()) {
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
    if (world > 1) comm.broadcast(hit, sizeof hit, 0);
    if (hit[0] >= 1) {
      r.micro_batch = hit[0];
      r.accumulation = hit[1];
      r.max_fit = hit[2];
      r.first_fail = hit[3];
      r.from_cache = true;
      t.set_batch_shape(r.micro_batch, r.accumulation);
      QLFT_LOG_I("auto-tune: micro_batch %d, accumulation %d (from %s)", r.micro_batch,
                 r.accumulation, cache.c_str());
      return r;
    }
  }

  // The budget: memory.limit, or what is tracked now plus this rank's part of what the OS still
  // has (ranks on one machine share it). With a device budget (backend=cuda: the tracker's limit
  // counts device bytes only) that is device memory: what the device has free.
  const uint64_t limit = tr->limit();
  const bool device = tr->limit_space() == MemSpace::Device;
  const uint64_t reserved = tr->budgeted_reserved();
  const uint64_t sharing = static_cast<uint64_t>(ranks_on_this_host(comm));  // collective
  const uint64_t budget = limit ? limit : reserved + available(tr, device) / sharing;
  const double margin = spec.train.autotune_margin;
  const uint64_t trial_limit = static_cast<uint64_t>(static_cast<double>(budget) * (1.0 - margin));
  const bool full = trial_limit <= reserved;
  if (count_over_ranks(comm, full) > 0) {
    if (full)
      throw_error(QLFT_ERR_OUT_OF_MEMORY,
                  "auto-tune: the memory budget (%s, less a %.0f%% margin) is already taken by "
                  "the model, adapter and optimizer (%s)%s; raise memory.limit",
                  format_bytes(budget).c_str(), margin * 100, format_bytes(reserved).c_str(),
                  world > 1 ? strf(" on rank %d", dp.rank()).c_str() : "");
    throw_error(QLFT_ERR_OUT_OF_MEMORY,
                "auto-tune: on another rank the memory budget is already taken by the model, "
                "adapter and optimizer; raise memory.limit there");
  }

  // Start where the planner says the largest fit is (the smallest over ranks). What the tracker
  // holds beyond the planner's persistent categories (another model, say) comes off the budget.
  const bool accumulates_anyway = per_rank == 0 && ts.accumulation > 1;
  PlanSettings ps = PlanSettings::from_spec(spec);
  ps.world = world;
  ps.accumulation = (per_rank > 0 || ts.accumulation > 1) ? 2 : 1;
  const WeightFootprint w = weight_footprint_for_plan(t.model(), spec.quant);
  ps.micro_batch = 1;
  const MemoryPlan one = plan_memory_of_rank(t.model().cfg, w, ps, dp.rank());
  // The categories the budget counts: the device's (a device budget and plan), else all.
  const auto& held = device && one.device ? one.device_train : one.train;
  uint64_t persistent = held[int(MemCategory::Weights)] + held[int(MemCategory::Adapter)] +
                        held[int(MemCategory::Gradients)] + held[int(MemCategory::Optimizer)];
  // A device backend uploads its weights at their first use (not yet), and holds its fixed
  // workspace (cuBLASLt's) from the start.
  if (device && one.device) persistent += one.device_fixed - held[int(MemCategory::Weights)];
  const int stage = spec.dist.zero_stage;
  // The exchange buffer is allocated by now; ZeRO-3's gathered units are not.
  if (stage < 3) persistent += held[int(MemCategory::Communication)];
  const uint64_t other = reserved > persistent ? reserved - persistent : 0;
  const int start = static_cast<int>(min_over_ranks(
      comm,
      plan_max_micro_batch(t.model().cfg, w, ps, trial_limit - other, static_cast<int>(upper))));

  // ZeRO-3 over several ranks gathers weights inside the trial: a rank that ran out of memory
  // halfway would leave the others waiting in a gather. There the trial runs without the limit
  // and fits when its measured peak is within it; sizes the planner puts past the whole budget
  // on some rank are not run at all (agreed first).
  // ZeRO-2's sharded gradients (host backends) exchange inside backward the same way.
  const bool measured = (stage == 3 || dp.grad_shards() != nullptr) && world > 1;
  LimitGuard guard{tr, limit};
  tr->set_limit(measured ? 0 : trial_limit);
  auto fits = [&](int m, uint64_t* peak) {
    const bool second = accumulates_anyway || (per_rank > 0 && m < per_rank);
    if (measured) {
      PlanSettings pm = ps;
      pm.micro_batch = m;
      const bool past =
          plan_memory_of_rank(t.model().cfg, w, pm, dp.rank()).budgeted_peak() + other > budget;
      if (count_over_ranks(comm, past) > 0) return false;
    }
    int outcome = 0;  // 0 fit, 1 out of memory, 2 another error
    std::exception_ptr err;
    uint64_t pk = 0;
    try {
      outcome = autotune_trial(t, m, seq, second, &pk) ? 0 : 1;
      if (measured && outcome == 0 && pk > trial_limit) outcome = 1;
    } catch (...) {
      err = std::current_exception();
      outcome = 2;
    }
    if (world > 1) {
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
  };
  AutotuneResult s = search_micro_batch(fits, std::max(start, 1), static_cast<int>(upper));
  s.predicted = start;
  s.budget = trial_limit;
  int64_t micro = s.max_fit, acc = ts.accumulation;
  if (per_rank > 0) {
    micro = largest_divisor_upto(per_rank, s.max_fit);
    acc = per_rank / micro;
    QLFT_CHECK_ARG(acc <= 65536, "train.effective_batch %lld needs %lld micro-batches per step",
                   static_cast<long long>(E), static_cast<long long>(acc));
  }
  s.micro_batch = static_cast<int>(micro);
  s.accumulation = static_cast<int>(acc);
  t.set_batch_shape(s.micro_batch, s.accumulation);
  empty_device_cache(t);  // the first step starts as the trials did
  tr->reset_peaks();
  std::string tried;
  for (const AutotuneTrial& x : s.trials) tried += strf(" %d%s", x.micro_batch, x.fits ? "" : "!");
  QLFT_LOG_I(
      "auto-tune: micro_batch %d, accumulation %d (largest fit %d, first failure %d, planner "
      "predicted %d; trials:%s; budget %s)",
      s.micro_batch, s.accumulation, s.max_fit, s.first_fail, start, tried.c_str(),
      format_bytes(trial_limit).c_str());
  if (!cache.empty() && dp.is_writer()) write_cache(cache, key, s);
  return s;
}

}  // namespace qlft
