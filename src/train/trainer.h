// The QLoRA trainer: LoRA adapters on a frozen model, trained on a dataset's batches with
// gradient accumulation, clipping, an LR schedule, fp16 loss scaling and gradient
// checkpointing; evaluation; checkpoints that resume exactly.
//
// One optimizer step = train.accumulation micro-batches of train.micro_batch rows. The loss of
// a step is the mean over every trained token of all its micro-batches (not a mean of means), so
// accumulation gives the same gradient as one big batch.
//
// Failure safety: a step that throws (out of memory, cancel, bad data) leaves the trainer as it
// was before the step: gradients zeroed, activations freed, the data position rewound, the
// optimizer untouched (it runs last).
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "config/run_spec.h"
#include "data/dataset.h"
#include "model/llama.h"
#include "model/lora.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/preference.h"
#include "train/preference_ref_cache.h"
#include "train/weight_placement.h"

namespace qlft {

class DeviceWeightStream;
struct AutotuneInputs;

namespace dist {
class DataParallel;
struct StateEntry;
}  // namespace dist

// Whether a model loaded for these settings should be loaded deferred (LoadOptions::deferred):
// dist.zero_stage=3 over MPI with several ranks launched, so each rank shards the weights
// straight from the file and none holds the whole model (dist/zero3_stream.h).
bool load_into_shards(const RunSpec& s);

struct TrainSettings {
  int micro_batch = 4;
  int accumulation = 1;
  bool micro_batch_auto = false;  // train.micro_batch=auto: train/autotune.h picks it
  int64_t effective_batch = 0;    // train.effective_batch (0: micro_batch x accumulation)
  int64_t max_steps = 0;          // 0: one pass over data.epochs
  Precision precision = Precision::FP32;
  int checkpoint_every_layers = 0;   // gradient checkpointing: 0 off, 1 every layer, N every N-th
  bool offload_checkpoints = false;  // train.offload_checkpoints (model/checkpoint_offload.h)
  int64_t eval_every = 0, save_every = 0;
  std::string output_dir = "qlft-out";
  uint64_t seed = 42;
  bool stop_on_nonfinite = false;
  int max_nonfinite_in_row = 10;
  static TrainSettings from_spec(const RunSpec& s);  // train.*, train.precision, seed
};

struct StepReport {
  int64_t step = 0;  // optimizer steps done including this one
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  float loss_scale = 1;
  bool skipped = false;
  int64_t trained_tokens = 0;
  int64_t tokens = 0;  // non-padding tokens processed
  double seconds = 0;
  TransferCounts moved;  // host<->device bytes and waits of this step (device backends)
  std::vector<KernelLaunches> launches;  // moved.launches by kernel (device backends)
  // A preference objective's step (step_pref): TRL's logged values, means over its micro-batches.
  bool preference = false;
  PrefMetrics pref;
};

struct EvalReport {
  double loss = 0;
  int64_t tokens = 0;
};

class Trainer {
 public:
  // train may be nullptr (evaluation / adapter use only). Neither model nor train is owned.
  // The model is only read: a trainer that streams its base weights (ZeRO-3, NVMe or device
  // offload) streams its own copy (placement()), so generation, merged export and other
  // trainers use the model while this one exists.
  // pref_data: with train.objective != sft, the preference examples step() trains on (not
  // owned; train is then nullptr).
  Trainer(const Model& model, MemoryTracker* tracker, const data::Dataset* train,
          const RunSpec& spec, const PrefSet* pref_data = nullptr);
  ~Trainer();

  // One optimizer step; false (and nothing done) when the data or max_steps is exhausted.
  // The step's gradients (unscaled, after clipping) stay in the adapter's dA/dB until the
  // next step starts, for inspection (with ZeRO-2 on several ranks, only this rank's share:
  // the others' dA/dB are empty).
  bool step(StepReport* out);
  // The same step on explicit micro-batches (each [micro_batch, seq_len] with targets; positions
  // and doc ids may be empty), bypassing the dataset: for parity tests and custom loops.
  void step_on(const std::vector<data::Batch>& batches, StepReport* out);
  // A step of the preference objective train.objective (train/preference.h) on explicit
  // micro-batches (one rank): each micro-batch's loss is TRL's mean over its pairs or examples,
  // the step's (StepReport::loss) their mean, as the gradient; *m gets the metrics' means.
  void step_pref(const std::vector<PrefBatch>& batches, StepReport* out, PrefMetrics* m = nullptr);
  const PrefSpec& pref() const { return pref_; }
  // pref.precompute_ref: whether this trainer's reference log-probabilities came from the file
  // beside the data (true) or were computed (false) by its first preference step.
  bool reference_loaded() const { return pref_ref_loaded_; }
  bool done() const;
  int64_t steps_done() const { return step_; }
  int64_t total_steps() const { return total_steps_; }

  // Mean token loss over data's eval split (or its train split when eval_split is false).
  EvalReport evaluate(const data::Dataset& data, bool eval_split = true);

  void save_checkpoint(const std::string& path) const;
  void resume(const std::string& path);

  // Thread- and signal-safe: the next step boundary throws QLFT_ERR_CANCELLED.
  void cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancel_requested() const { return cancel_.load(std::memory_order_relaxed); }
  void clear_cancel() { cancel_.store(false); }

  LoraAdapter& lora() { return *lora_; }
  const LoraAdapter& lora() const { return *lora_; }
  // dist.zero3_shard_adapter on several ranks: this rank holds only its own LoRA tensors
  // (dist/zero3_lora.h), so lora() lacks the others' values outside the calls below.
  bool adapter_sharded() const;
  // f with every LoRA tensor in rank 0's adapter: with dist.zero3_shard_adapter (a collective)
  // the others' tensors are filled on rank 0 from their owners first and freed after; otherwise
  // f as is.
  void with_whole_adapter(const std::function<void()>& f) const;
  // Writes the adapter (a PEFT or GGUF file): write(lora()) as is, or with a sharded adapter a
  // collective: every rank calls it, the whole adapter is gathered and rank 0 alone writes;
  // every rank throws if that failed.
  void write_adapter(const std::function<void(const LoraAdapter&)>& write) const;
  // Loads values into the adapter: load(lora()), or with a sharded adapter every tensor is made
  // for the call and this rank keeps its own after it (each rank must call it; no collective).
  void load_adapter(const std::function<void(LoraAdapter&)>& load);
  LlamaRunner& runner() { return *runner_; }
  const Backend& backend() const { return *backend_; }
  const TrainSettings& settings() const { return ts_; }
  // Sets micro_batch and accumulation; only before the trainer has data batches (the
  // constructor plans them with the auto-tuner before they are made).
  void set_batch_shape(int micro_batch, int accumulation);
  // trainer_trial.cpp: the auto-tuner's "does this fit" (train/autotune.h): one forward and
  // backward of a synthetic micro-batch of micro_batch full-length rows (second_forward: a
  // second forward beside the kept backward temporaries), under the tracker's current limit.
  // true if it fit (*peak: its budgeted peak), false on QLFT_ERR_OUT_OF_MEMORY; leaves the
  // trainer as it was (gradients zeroed, activations freed, no step, no data, no RNG).
  bool try_micro_batch(int micro_batch, int seq_len, bool second_forward, uint64_t* peak);
  // What the auto-tuner plans this trainer's batch shape with (its model, spec, tracker, ranks,
  // data rows, adapter targets, backend).
  AutotuneInputs autotune_inputs(const RunSpec& spec);
  const data::Dataset* train_data() const { return train_; }
  const Model& model() const { return model_; }
  // Where this trainer's base weights live (its own streamed copy, or the model as loaded).
  const WeightPlacement& placement() const { return *placement_; }
  // Tests wrap the stream of the trainer's own model (fault injection, tests/dist/dist_worker).
  WeightPlacement& placement() { return *placement_; }
  MemoryTracker* tracker() const { return tracker_; }
  // Distributed training (dist.*): this process's rank, the world size, and whether it is the
  // rank that writes files (rank 0). save_checkpoint is collective: every rank must call it.
  int rank() const;
  int world() const;
  bool is_writer() const { return rank() == 0; }
  int64_t nonfinite_in_row() const { return nonfinite_in_row_; }
  // The communicator and ZeRO partition (world 1 without dist.backend): the auto-tuner agrees
  // on its trial steps' outcomes through it.
  dist::DataParallel& data_parallel() { return *dp_; }

 private:
  std::vector<GradSpan> grad_spans();
  // trainer_dist.cpp: the communicator and ZeRO partition, and this rank's micro-batches of
  // the next global batch (micro_batch x accumulation x world rows).
  void init_dist(const RunSpec& spec, std::vector<ParamRef> params);
  // trainer_dist.cpp: the adapter's gradients, after init_dist: every dA / dB, or with ZeRO-2
  // on several ranks and a host backend this rank's share and the runner's gradient sink;
  // with dist.zero3_shard_adapter also only this rank's A / B (dist/zero3_lora.h).
  void init_grads(const RunSpec& spec);
  void shard_adapter();
  // The adapter's values of params()[i] where keep(i), for an adapter made without them.
  void make_adapter_values(const std::function<bool(size_t)>& keep);
  bool adapter_has_values() const;  // false: made without them (values after the partition)
  // trainer_offload.cpp: offload.optimizer / offload.params, before the optimizer is made.
  void init_offload(const RunSpec& spec);
  void end_offload() noexcept;  // ~Trainer: offload.params=cpu's device units freed
  void write_profile() const noexcept;
  // trainer_trial.cpp: the batch shape from the auto-tuner (train.micro_batch=auto or
  // train.effective_batch), before the data batches exist.
  void plan_batch_shape(const RunSpec& spec);
  void empty_device_cache();  // a device backend's cached free blocks returned
  size_t next_global_batches(std::vector<data::Batch>& mine);
  uint64_t dropout_seed(int64_t step, int micro) const;
  std::string fingerprint() const;
  // sd: this rank's entries (its optimizer state; the scheduler's and scaler's are added).
  // remote: other ranks' optimizer entries (ZeRO, on rank 0), in name order; fetch(name) gives
  // their bytes, asked for once each in that order for the checksum, then in data order.
  void write_checkpoint_file(
      const std::string& path, StateDict& sd,
      const std::vector<const dist::StateEntry*>& remote = {},
      const std::function<const void*(const std::string&)>& fetch = nullptr) const;
  // ZeRO 1-3 on several ranks: rank 0 writes every rank's share (the whole adapter present).
  void write_sharded_checkpoint(const std::string& path, StateDict& mine) const;
  // Runs write on rank 0 only; every rank returns when it is done and throws if it failed.
  // what names the file in the other ranks' error ("the checkpoint").
  void write_checkpoint_on_rank0(const std::function<void()>& write,
                                 const char* what = "the checkpoint") const;

  const Model& model_;
  MemoryTracker* tracker_;
  HostCacheHold host_cache_;  // before every buffer the trainer owns: outlives them
  const data::Dataset* train_;
  TrainSettings ts_;
  std::unique_ptr<WeightPlacement> placement_;  // what the runner reads; outlives it
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LoraAdapter> lora_;
  // Where params()[i] lives in the adapter (its values move under a sharded adapter).
  struct ParamSlot {
    int layer;
    Proj p;
    bool b;
    bool m = false;  // DoRA's magnitude (b false)
    int moe = -1;    // an MoE layer's expert / router LoRA (MoePart; p unused), else -1
  };
  std::vector<ParamSlot> param_slots_;
  const float* param_values(size_t i) const;  // throws when this rank does not hold it
  std::unique_ptr<LlamaRunner> runner_;
  bool device_step_ = false;  // adapter, gradients and AdamW state in the backend's device memory
  bool device_writes16_ = false;            // the device optimizer writes A / B's bf16 copy too
  std::unique_ptr<dist::DataParallel> dp_;  // always set (world 1 without dist.backend)
  std::shared_ptr<DeviceWeightStream> device_stream_;  // offload.params=cpu on a device backend
  std::unique_ptr<Optimizer> opt_;  // over this rank's ZeRO share of the LoRA tensors
  std::unique_ptr<LrSchedule> sched_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<data::BatchIterator> it_;
  int64_t step_ = 0;
  int64_t total_steps_ = 0;
  int64_t nonfinite_in_row_ = 0;
  int64_t steps_run_ = 0;     // step_on calls on this trainer (trial steps included)
  std::string profile_path_;  // QLFT_PROFILE: where the destructor writes the op profile
  std::atomic<bool> cancel_{false};
  PrefSpec pref_;
  const PrefSet* pref_set_ = nullptr;  // step()'s preference examples
  uint64_t pref_pos_ = 0;              // examples consumed (over epochs)
  int pref_epochs_ = 1;
  bool step_preference(StepReport* out);  // step() with train.objective != sft
  bool pref_done() const;
  // pref.precompute_ref: where the set's reference log-probabilities are kept, and (from the
  // first preference step on) their values (train/preference_ref_cache.h).
  void init_pref_ref(const RunSpec& spec);
  std::string pref_ref_path_;
  uint64_t pref_ref_key_ = 0;
  std::unique_ptr<PrefRefCache> pref_ref_;
  bool pref_ref_loaded_ = false;
  const std::vector<PrefBatch>* pref_batches_ = nullptr;  // step_pref's, during its step_on
  std::vector<PrefMetrics> pref_seen_;                    // each micro-batch's, in that step
};

}  // namespace qlft
