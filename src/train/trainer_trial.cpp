// The trainer's side of the micro-batch auto-tuner (train/autotune.h): what the search plans
// with, and its "does this fit" callback, a trial step on this trainer's runner that leaves
// nothing behind.
#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cuda_plugin.h"
#include "core/error.h"
#include "parallel/data_parallel.h"
#include "train/autotune.h"
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

}  // namespace

// A device backend's trial starts with its caching allocator's free blocks returned: the
// allocator hands a request a cached block of up to twice its size, so blocks left by a larger
// trial would inflate a smaller one and make a trial's outcome depend on the trials before it.
void Trainer::empty_device_cache() {
  if (backend_->device_memory()) cuda_plugin::get("auto-tune").empty_cache(tracker_);
}

bool Trainer::try_micro_batch(int micro_batch, int seq_len, bool second_forward, uint64_t* peak) {
  MemoryTracker* tr = tracker_;
  const int vocab = model_.cfg.vocab;
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
  LlamaRunner& run = *runner_;
  auto undo = [&] {
    run.release();
    lora_->zero_grad();
    tr->set_phase("setup");
  };
  empty_device_cache();
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

AutotuneInputs Trainer::autotune_inputs(const RunSpec& spec) {
  MemoryTracker* tr = tracker_;
  return AutotuneInputs{
      model_,
      spec,
      tr,
      *dp_,
      train_ ? std::max<uint64_t>(1, static_cast<uint64_t>(train_->train().rows())) : 0,
      lora_->config().targets_string(),
      backend_->name(),
      [tr]() -> uint64_t {
        if (tr->limit_space() == MemSpace::Device)
          return cuda_plugin::get("auto-tune's device budget").device_available(tr);
        return mem_available();
      }};
}

void Trainer::plan_batch_shape(const RunSpec& spec) {
  const int seq = spec.data.seq_len;
  const AutotuneResult r =
      autotune_batch_shape(autotune_inputs(spec), [this, seq](int m, bool second, uint64_t* peak) {
        return try_micro_batch(m, seq, second, peak);
      });
  set_batch_shape(r.micro_batch, r.accumulation);
  if (r.searched) {
    empty_device_cache();  // the first step starts as the trials did
    tracker_->reset_peaks();
  }
}

}  // namespace qlft
