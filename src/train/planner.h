// The memory planner: predicts, before anything is allocated, what a training run will hold per
// memory category (weights, adapter, gradients, optimizer, activations, workspace) and its total
// peak, in bytes as the MemoryTracker counts them.
//
// How each category is predicted:
//  - weights: every buffer the loader makes (from a loaded model, or from the file's tensor
//    shapes and types with the quant.* settings), exact;
//  - adapter, gradients, optimizer: the LoRA A/B shapes and the optimizer's state layout, exact;
//  - activations: LlamaRunner::footprint(), the same element counts the runner allocates with,
//    exact (stored layers, the shared checkpoint scratch, the residual stream);
//  - workspace: the largest set of scratch buffers alive at once in the backend's kernels, as
//    the backend's workspace model gives them (backend/workspace_model.h: CPU panels, attention
//    tiles and cross-entropy chunks from CpuTuning and the thread count; CUDA panels, logits
//    chunk, autocast copies and the cuBLASLt workspace) plus the backward temporaries. The
//    cross-entropy chunk assumes every target is trained (the worst case), so real data may use
//    less.
//
// backend=cuda (PlanSettings::backend): the runner's tensors and the backend's scratch are device
// memory, each block rounded as the caching allocator rounds it (backend/cuda_sizes.h); the
// device also holds a resident copy of every weight the runner uses (data and float scales,
// norm weights, biases, the rope table), the adapter's device copy and its gradients, and with
// the device optimizer step (optim.name=adamw on one rank or over NCCL, its state not offloaded)
// the AdamW state of this rank's tensors (and over NCCL at stages 1-3 the device exchange
// buffer). The host keeps the loaded weights, the adapter and its gradients (and the optimizer
// state of a host step). With offload.params=cpu the device holds the stream's unit pair
// instead of every weight; with ZeRO-3 over NCCL the shards and the gathered units are device
// memory and the host keeps none. MemoryPlan::device_* is the device part; memory.limit budgets
// it (budgeted_peak()).
// Cached free blocks of the caching allocator are not predicted: past a budget the allocator
// returns them before it fails, so the live bytes are what must fit.
// The training peak is reached in backward with every activation alive, so it is the sum of the
// persistent categories, the activations and the workspace peak. Loading holds the weights and
// an f32 staging copy of one tensor being quantized (workspace); that is the load peak.
//
// Sharding and offload (PlanSettings::world, zero_stage, offload_*), for one rank:
//  - ZeRO-1/2/3: optimizer state only for this rank's LoRA tensors. Ownership is that of
//    dist::DataParallel (whole tensors in trainer order, contiguous runs balanced by elements:
//    tensor i goes to rank floor(start_i x world / total)), computed here the same way; the
//    prediction is the rank with the largest total. Gradients stay whole at stages 0-1 and on
//    the cuda backend; ZeRO-2/3 on several ranks of a host backend keeps only this rank's
//    tensors' gradients, plus a reduce bucket of the largest projection's A + B floats in
//    `communication` (dist/zero2_grads.h). With world > 1 the gradient/parameter exchange
//    buffer ((world + 1) x the largest rank's elements, f32; world x with sharded gradients) is
//    `communication`.
//  - ZeRO-3 (dist/zero3_stream.h): weights = this rank's slices: each buffer of 64 KiB or more
//    on its own and the smaller ones of each unit packed together, ceil(bytes / world) rounded
//    up to 64 each; communication adds the gathered unit in use plus the one gathered ahead
//    (none with dist.zero3_prefetch=false), the largest pair along the runner's forward and
//    backward unit order (units: embedding, each
//    layer, final norm + untied head).
//  - dist.zero3_shard_adapter (dist/zero3_lora.h; ZeRO-3 with sharded gradients): adapter = this
//    rank's own tensors; communication adds what filling one layer holds (the others' tensors
//    of that layer and the staging buffer, the largest over the layers) and drops the exchange
//    buffer.
//  - offload.params=nvme (offload/nvme_weight_stream.h): weights = the units resident at once:
//    the one in use and the next one the runner names (read ahead when offload.buffers > 0),
//    the largest such pair.
//  - offload.optimizer=nvme (offload/nvme_state_store.h): the state leaves RAM but for
//    1 + offload.buffers slots, each as large as this rank's largest tensor state.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "config/run_spec.h"
#include "core/memory.h"
#include "model/lora.h"
#include "model/model.h"

namespace qlft {

// Weight storage of a model as loaded.
struct WeightFootprint {
  uint64_t bytes = 0;         // every weight buffer, rounded as the tracker counts it
  uint64_t load_staging = 0;  // the most workspace held at once while loading
  // The storage buffers' sizes (unrounded, empty ones left out) per group, as ZeRO-3 groups
  // them: 0 the embedding, 1..n_layers the layers, n_layers + 1 the final norm and untied head.
  std::vector<std::vector<uint64_t>> groups;
  // Per group, per buffer of groups: 1 when the load holds the file's bytes unchanged
  // (gguf_kept_as_stored; weight_footprint_of_file of a GGUF file only): a deferred ZeRO-3 load
  // reads a rank's slices of a group of such buffers by range and never holds it whole.
  std::vector<std::vector<uint8_t>> kept;
  bool kept_as_stored(size_t g, size_t i) const {
    return g < kept.size() && i < kept[g].size() && kept[g][i];
  }
  bool tied = false;  // the head unit also reads group 0
  // The token embedding (group 0's first buffer) and an untied head (group n_layers + 1's
  // second) as plain f32 matrices of this many rows of row_bytes each, which ZeRO-3 on host
  // ranks shards by rows (dist/zero3_stream.h); 0 when they are not both plain f32.
  int64_t f32_rows = 0;
  uint64_t row_bytes = 0;
  // Bytes of one embedding (untied head) row as the file stores it (weight_footprint_of_file; 0
  // otherwise): a deferred ZeRO-3 load keeps their row shards so.
  uint64_t emb_stored_row_bytes = 0, head_stored_row_bytes = 0;
  // The blocks a device backend makes of the weights the runner uses (unrounded): each matrix's
  // data and its float scales (NF4 absmax as fp32, INT8 row scales), norm weights and biases.
  std::vector<uint64_t> device_slots;
  // Which device_slots are the embedding and an untied head as plain f32 tables: at 16-bit GEMM
  // tiles (train.precision bf16 / fp16) the CUDA backend keeps those in 16 bits, half the bytes
  // (CudaBackend::resident16).
  std::vector<size_t> device_f32_tables;
};

// Of a loaded model (exact for bytes; staging assumes the linears were quantized at load when
// they are NF4/INT8, which over-states it for pre-quantized bitsandbytes files).
WeightFootprint weight_footprint(const Model& m);
// Of a loaded model as a plan needs it: weight_footprint(m), or, when a trainer streams its
// weights (ZeRO-3 shards, NVMe offload: its buffers are empty now), the footprint of its file
// with the quant.* settings of c (those it was loaded with).
WeightFootprint weight_footprint_for_plan(const Model& m, const QuantSpec& q);
// From a model file without loading its weights: a .gguf file (header only) or an HF model
// (config.json + safetensors headers). Fills *cfg with the model's shape.
WeightFootprint weight_footprint_of_file(const std::string& path, const LoadOptions& opt,
                                         ModelConfig* cfg);

struct PlanSettings {
  Precision precision = Precision::FP32;  // bf16 / fp16 add autocast copies
  int checkpoint_every = 0;               // train.grad_checkpointing
  int seq_len = 512;
  int micro_batch = 4;
  // Rows a micro-batch's example trains on (train.objective): 2 for preference pairs (chosen
  // and rejected in one batch, train/preference.h), else 1.
  int rows_per_example = 1;
  // The objective's reference pass (DPO, IPO, KTO: the frozen base over the same rows, no
  // stored activations), whose buffers the step holds beside the policy's activations.
  bool reference_pass = false;
  // The preference objectives' loss runs the head's cross-entropy one sequence (seq_len rows) at
  // a time (LlamaRunner::seq_cross_entropy), not over the micro-batch's rows at once.
  bool per_sequence_loss = false;
  int accumulation = 1;  // micro-batches per step (more than one keeps backward temporaries)
  OptimizerKind optimizer = OptimizerKind::AdamW;
  LoraConfig lora;
  int threads = 0;  // kernel threads; 0: what OpenMP would use now
  BackendKind backend = BackendKind::Cpu;
  int world = 1;                                 // ranks
  DistBackend dist_backend = DistBackend::None;  // nccl keeps the AdamW step on the device
  int zero_stage = 0;                            // dist.zero_stage
  uint64_t row_chunk_bytes = 2 << 20;            // dist.row_chunk_kib
  uint64_t bucket_bytes = 256 << 10;             // dist.bucket_kib
  bool shard_adapter = false;                    // dist.zero3_shard_adapter
  bool zero3_prefetch = true;                    // dist.zero3_prefetch
  OffloadTarget offload_optimizer = OffloadTarget::None, offload_params = OffloadTarget::None;
  int offload_buffers = 2;  // offload.buffers: NVMe buffers in flight besides the one in use
  bool offload_checkpoints = false;  // train.offload_checkpoints (train/planner_offload.h)
  // train.offload_checkpoints=auto: plan_memory plans offload_checkpoints as given; the
  // budget's searches and plan_offload_checkpoints resolve it.
  bool offload_checkpoints_auto = false;
  // train.mlp_tile_rows (0: whole; -1: auto, mlp_tile_rows_of), engaged as mlp_tile_for says.
  int64_t mlp_tile_rows = 0;

  // train.precision, train.grad_checkpointing, data.seq_len, train.micro_batch (auto gives 1),
  // optim.name, lora.* (or lora.init_from's adapter_config.json), threads, backend,
  // dist.zero_stage, offload.optimizer/params; world: the launcher's (dist::detect_launch) when
  // dist.backend is set, else 1.
  static PlanSettings from_spec(const RunSpec& s);
};

struct MemoryPlan {
  // per category, over loading and training (weights: the whole model as loaded, plus the
  // ZeRO-3 shards made from it, when that is more than training holds)
  std::array<uint64_t, kMemCategoryCount> peak{};
  std::array<uint64_t, kMemCategoryCount> train{};  // per category at the training peak
  uint64_t train_peak = 0;                          // total during a training step
  uint64_t load_peak = 0;                           // total while loading the weights
  uint64_t total_peak = 0;                          // max(train_peak, load_peak)
  int world = 1;                                    // ranks planned for
  int peak_rank = 0;  // the rank whose prediction this is (the largest train_peak)
  // backend=cuda: the device memory alone (also counted in train / train_peak, which add host
  // and device as the tracker's totals do). The host's part is train - device_train.
  bool device = false;
  std::array<uint64_t, kMemCategoryCount> device_train{};  // per category at the training peak
  uint64_t device_train_peak = 0;
  uint64_t device_fixed = 0;  // of device_train's workspace: held for the backend's life
  // backend=cuda: host -> device bytes of a training step after the first: each micro-batch's
  // ids, labels, positions and document ids; with offload.params=cpu the units the weight
  // stream copies (a pass's acquires, read ahead by one); with a host optimizer step the
  // adapter's A/B per micro-batch. (The first step adds the one-time uploads.)
  uint64_t device_h2d_per_step = 0;
  // backend=cuda: device -> host bytes of a step: the gradients of a host optimizer step, per
  // micro-batch (the scalars read besides, the loss and the norm, are not in it: a few dozen
  // bytes a step).
  uint64_t device_d2h_per_step = 0;
  // What memory.limit budgets: the device's training peak on a device backend, else the total.
  uint64_t budgeted_peak() const { return device ? device_train_peak : train_peak; }
};

// Owner rank of each of the trainer's LoRA tensors (layer-major, targeted projections in order,
// A then B), as dist::DataParallel assigns them: numel[i] elements each.
std::vector<int> plan_lora_owners(const std::vector<uint64_t>& numel, int world);

// What a process training on the CPU maps on its first step beyond what it held untracked when
// it planned (qlft_memory_estimate::process_base): the compute library's code pages and JIT
// kernels (oneDNN: 4.6 MiB of libdnnl's pages, about 1 MiB of JIT code) and the allocator's
// slack from the step's small blocks (about 5 MiB): 12 MiB, measured on SmolLM2-135M at 1, 2
// and 4 ZeRO-3 ranks (docs/PERFORMANCE.md, "Scale-out memory").
constexpr uint64_t kCpuFirstStepUntracked = uint64_t(12) << 20;

MemoryPlan plan_memory(const ModelConfig& mc, const WeightFootprint& w, const PlanSettings& s);
// The same for one rank (rank in [0, s.world)); plan_memory is the largest of these.
MemoryPlan plan_memory_of_rank(const ModelConfig& mc, const WeightFootprint& w,
                               const PlanSettings& s, int rank);

// train.offload_checkpoints for a budget: as given unless s.offload_checkpoints_auto, where it is
// on exactly when the backend's memory is a device's, layers are checkpointed, budget is set
// (not 0) and the plan without it has a budgeted peak above budget (whether or not the plan with
// it fits: it is the nearer). s is returned resolved (offload_checkpoints_auto false).
PlanSettings plan_offload_checkpoints(const ModelConfig& mc, const WeightFootprint& w,
                                      PlanSettings s, uint64_t budget);

// The largest micro-batch in [1, upper] whose predicted budgeted peak (the device's training
// peak on backend=cuda, else the total) is at most budget; 0 when not even 1 fits. The peak grows
// with the micro-batch, so this is a binary search. Each size is planned with
// plan_offload_checkpoints (auto: offloaded where it would not fit otherwise).
int plan_max_micro_batch(const ModelConfig& mc, const WeightFootprint& w, PlanSettings s,
                         uint64_t budget, int upper);
// The longest data.seq_len in [1, upper] at micro-batch 1 whose budgeted peak is at most budget
// (0: not even 1 token fits); the same search along the sequence ("the largest context").
int plan_max_seq_len(const ModelConfig& mc, const WeightFootprint& w, PlanSettings s,
                     uint64_t budget, int upper);

}  // namespace qlft
