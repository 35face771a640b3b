// The micro-batch auto-tuner (train.micro_batch = auto) and the effective-batch rule.
//
// The search tries real training micro-batches: a forward and backward of micro_batch rows of
// full data.seq_len length with every target trained (the most memory a batch can take), and a
// second forward beside the kept backward temporaries when the step will accumulate. A trial
// "fits" when it peaks below (1 - train.autotune_margin) x the budget (memory.limit, or the
// tracked bytes plus the OS's MemAvailable when the limit is 0); past it the tracker throws
// QLFT_ERR_OUT_OF_MEMORY and the trial is undone. With backend=cuda the budget is the device's
// (the tracker's limit counts device bytes; with memory.limit 0 the device's free memory), the
// out-of-memory is the device allocator's, and each trial starts with the allocator's cache
// returned (a cached block serves requests down to half its size: left by a larger trial it
// would inflate a smaller one).
//
// Search: start at the memory planner's prediction. On failure go down, by 1, 2, 4, ... sizes
// but never more than halving (the planner is usually off by little; far off this is plain
// halving); on success go up the same way (at most doubling); once a fit and a failure are
// known, bisect between the last fit and the first failure. It ends when the largest fitting
// size m and a failing m + 1 are both known (or m is the upper bound), after at most 6 trials
// (otherwise the largest fit found is kept; with no fit yet it goes on halving). The upper
// bound is
// train.effective_batch / ranks when set, else the training rows (at most 65536).
//
// Accumulation: with train.effective_batch = E, micro_batch becomes the largest divisor of E /
// ranks not above m and accumulation = E / (ranks x micro_batch), so every step sees exactly E
// rows. Without it accumulation stays train.accumulation.
//
// Several ranks (dist.backend): every rank runs the same trial sequence and ends with the same
// micro-batch and accumulation. The start is the smallest of the ranks' planner predictions, a
// trial fits only when it fits on every rank (each rank's own budget: its memory.limit, or its
// share of the machine's MemAvailable among the ranks on that host), agreed by one all-reduce
// after the trial, before any other collective; an error other than out-of-memory in one rank's
// trial ends every rank (that rank's error, QLFT_ERR_DISTRIBUTED on the others). Under ZeRO-3
// (collectives inside the trial) the trial runs without the limit and fits when its measured
// peak is within it; sizes the planner puts past a rank's whole budget are not run. Rank 0 reads
// and writes the cache and hands its answer to the others; the key has the world size, the ZeRO
// stage, the offload settings and every rank's memory.limit.
//
// The search knows nothing of the step it sizes: its caller plans with it before the data
// batches exist and gives a "does this fit" callback (the trainer's trial step, Trainer::
// try_micro_batch), which must leave everything as it was: gradients zeroed, activations and
// workspace freed, no optimizer step, no data consumed (batches are synthetic), no RNG drawn
// (dropout masks are functions of the step). The result is cached in a JSON file keyed by
// model, settings, device and memory.limit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/run_spec.h"
#include "model/model.h"

namespace qlft {

namespace dist {
class DataParallel;
}

struct AutotuneTrial {
  int micro_batch = 0;
  bool fits = false;
  uint64_t peak = 0;  // the trial's peak tracked bytes (when it fit)
};

struct AutotuneResult {
  int micro_batch = 0;   // the batch shape to train with
  int accumulation = 0;  // the batch shape to train with
  int max_fit = 0;       // the largest micro-batch that trained without running out of memory
  int first_fail = 0;    // the smallest that ran out (0: none did; max_fit is the upper bound)
  int predicted = 0;     // the planner's largest fit (the search's start)
  int upper = 0;         // the largest size considered
  uint64_t budget = 0;   // bytes the trials could use: (1 - margin) x memory budget
  bool from_cache = false;
  bool searched = false;  // trials ran (the caller then restarts the tracker's peaks)
  std::vector<AutotuneTrial> trials;
};

constexpr int kAutotuneMaxTrials = 6;

// The search alone: fits(m, &peak) runs a trial of micro-batch m (true: it fit, peak set).
// Throws QLFT_ERR_OUT_OF_MEMORY when not even 1 fits.
AutotuneResult search_micro_batch(const std::function<bool(int, uint64_t*)>& fits, int start,
                                  int upper, int max_trials = kAutotuneMaxTrials);

// "Does micro-batch m fit": one trial (second_forward: a second forward beside the kept
// backward temporaries, as an accumulating step holds). true and *peak (the tracker's budgeted
// peak) when it fit, false on QLFT_ERR_OUT_OF_MEMORY; other errors throw. Leaves nothing behind.
using AutotuneFits = std::function<bool(int micro_batch, bool second_forward, uint64_t* peak)>;

// What the search plans with, besides the trial callback.
struct AutotuneInputs {
  const Model& model;  // shapes and weight footprint (the planner's start) and the cache key
  const RunSpec& spec;
  MemoryTracker* tracker;    // its limit bounds the trials; the budget with memory.limit
  dist::DataParallel& dp;    // the ranks agree through its communicator (world 1 alone)
  uint64_t data_rows = 0;    // the training rows (0: no data; they bound the micro-batch)
  std::string lora_targets;  // the adapter's target modules (the cache key)
  std::string backend_name;  // the cache key
  // What a budget of 0 may still use: the device's free memory for a device budget
  // (tracker->limit_space() == Device), else the OS's MemAvailable.
  std::function<uint64_t()> free_memory;
};

// For train.micro_batch=auto or train.effective_batch > 0: validates the effective batch and
// searches (or reads the cache) for the batch shape.
AutotuneResult autotune_batch_shape(const AutotuneInputs& in, const AutotuneFits& fits);

// The cache key of a search (model, settings, ranks, ZeRO stage, offload, device,
// memory.limit) with this rank's memory.limit (the search itself keys on every rank's).
std::string autotune_cache_key(const AutotuneInputs& in);

}  // namespace qlft
