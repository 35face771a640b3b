// Data parallelism and ZeRO stages 1-2 over a Communicator, for the trainer's LoRA parameters.
//
// Every rank holds the full LoRA weights (they are small next to the frozen base) and computes
// gradients on its own shard of each global batch. Then:
//   stage 0: gradients all-reduced (summed; the trainer already scaled each rank's loss by
//            1 / global token count, so the sum is the global mean's gradient), every rank
//            clips and steps every parameter identically.
//   stage 1: the same all-reduce, but each rank's optimizer holds state only for the tensors it
//            owns and updates only them; an all-gather then hands every rank every tensor.
//   stage 2: each rank holds only its owned tensors' gradients: on host backends the runner's
//            backward hands each projection's gradients to dist/zero2_grads.h as soon as they
//            are computed (summed across ranks at once; the owner keeps them), so no rank holds
//            every dA / dB (set_grad_shards). Device backends keep full gradients and
//            reduce-scatter them after backward. The global norm for clipping is an all-reduce
//            of the shards' squared sums.
//   stage 3: stage 2 for the LoRA tensors, and the frozen base weights sharded across ranks
//            (dist/zero3_stream.h; the trainer installs the stream).
//
// Ownership is by whole tensors, a contiguous run per rank balanced by element count: each
// tensor's optimizer math (including 8-bit AdamW's per-tensor blocks) is then exactly the
// 1-rank math, so a checkpoint's gathered state has the 1-rank layout and resumes at any world
// size.
//
// Device-resident exchange (dist.backend=nccl with a device backend, attach_device): the LoRA
// weights and gradients are the runner's device copies, one flat array each with params() back
// to back, so a rank's owned tensors are one range of them. reduce_gradients, device_clip and
// gather_params then run NCCL collectives on those arrays (packed into a device exchange buffer
// where ranks' ranges must be equal blocks), ordered after the backend's stream; nothing goes
// through the host but the scalars. The host-buffer collectives (scalars, state gathering) use
// the communicator's host() side.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "config/run_spec.h"
#include "core/communicator.h"
#include "optim/grad_clip.h"
#include "optim/optimizer.h"
#include "optim/state_dict.h"

namespace qlft {
class Backend;
}  // namespace qlft

namespace qlft::dist {

class Zero3Stream;
class Zero2Grads;
class Zero3Lora;

// One optimizer state entry of one rank (DataParallel::state_catalog).
struct StateEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
  int owner;
};

class DataParallel {
 public:
  // params: every trainable tensor, in the same order on every rank (checked).
  // host_gradient_shards: at stages 2-3 on several ranks the gradients will be sharded as
  // backward runs (set_grad_shards, before any step): the exchange buffer then has no segment
  // for receiving a reduce-scatter (world x the largest share instead of world + 1).
  // bucket_bytes: dist.bucket_kib.
  DataParallel(std::unique_ptr<Communicator> comm, int zero_stage, std::vector<ParamRef> params,
               MemoryTracker* tracker, bool host_gradient_shards = false,
               uint64_t bucket_bytes = DistSpec().bucket_bytes);
  // Whether the gradients are (to be) sharded during backward (host_gradient_shards applied).
  bool shards_gradients() const { return shard_grads_; }
  ~DataParallel();

  // The communicator for host buffers (the MPI bootstrap under NCCL).
  Communicator& comm() { return *host_; }
  // The communicator as made (NCCL's device buffers, or the same as comm()).
  Communicator& device_comm() { return *comm_; }
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world(); }
  int zero_stage() const { return stage_; }
  bool is_writer() const { return comm_->rank() == 0; }

  const std::vector<ParamRef>& params() const { return params_; }
  // The tensors whose optimizer state and update live on this rank (all of them at stage 0).
  std::vector<ParamRef> owned_params() const;
  // Owner rank of params()[i].
  int owner(size_t i) const { return owner_[i]; }
  // Micro-batch i of a global step (accumulation x world of them) belongs to this rank.
  bool owns_micro_batch(int i) const { return i % world() == rank(); }

  int64_t global_sum(int64_t v) { return comm_->sum(v); }
  double global_sum(double v) { return comm_->sum(v); }
  bool any(bool flag);
  // The first collective of a training step and of a collective evaluation: agrees on flag
  // (any rank's) and checks that every rank is in the same kind of call. A rank evaluating alone
  // while its peers start a step then fails with QLFT_ERR_INVALID_ARGUMENT on every rank, saying
  // every rank must call it, instead of the two calls' collectives mismatching.
  enum class Collective { Step, Evaluate };
  bool begin_collective(Collective what, bool flag = false);

  // params()[i]'s gradient array (nullptr: this rank holds none, ZeRO-2 sharded gradients). The
  // trainer sets them once the adapter's gradients are allocated, before any step.
  void set_grad(size_t i, float* grad) { params_[i].grad = grad; }
  // params()[i]'s values, for an adapter whose values are made after the partition (a sharded
  // adapter's: only the owned ones).
  void set_data(size_t i, float* data) { params_[i].data = data; }

  // After backward: gradients summed across ranks (all of them at stages 0-1, the owned ones at
  // stage 2; the others then hold stale local values that nothing reads). With sharded
  // gradients (set_grad_shards) they were summed during backward: nothing to do.
  void reduce_gradients();
  // The gradients this rank clips, unscales and steps: all (stages 0-1) or owned (stage 2).
  std::vector<GradSpan> grad_spans() const;
  // Global-norm clipping over every rank's gradients; the same result on every rank.
  ClipResult clip(const std::vector<GradSpan>& grads, double max_norm);
  // After the optimizer updated the owned tensors: every rank receives every tensor (with a
  // sharded adapter nobody holds the others' tensors between uses: nothing to do).
  void gather_params();
  // ZeRO checkpoints: rank 0 writes every rank's optimizer state (the 1-rank layout) without
  // holding it all. state_catalog lists every rank's entries of `mine`, in name order, the
  // same list on every rank (a collective). Then every rank calls fetch_state_entry for the
  // same entries in the same order (rank 0 writing its file, the others following): an entry
  // of a rank other than 0 is broadcast from it. It returns the entry's bytes (valid until the
  // next call) on its owner and on rank 0, nullptr elsewhere.
  std::vector<StateEntry> state_catalog(const StateDict& mine);
  const void* fetch_state_entry(const StateEntry& e, const StateDict& mine,
                                std::vector<uint8_t>* scratch);

  // ---- device-resident exchange -----------------------------------------------------------
  // w and g: the params' values and gradients back to back (n floats) in be's memory. Needs a
  // communicator with device buffers (dist.backend=nccl). From then on reduce_gradients and
  // gather_params work on these arrays.
  void attach_device(Backend& be, float* w, float* g, int64_t n);
  bool on_device() const { return dev_ != nullptr; }
  // This rank's owned range of the flat arrays, in elements (everything at stage 0).
  int64_t owned_begin() const;
  int64_t owned_count() const;
  // The gradients this rank checks and clips (device arrays): all at stages 0-1, the owned
  // range at stages 2-3. Global-norm clipping of them, the same result on every rank.
  float* device_grads(int64_t* n) const;
  ClipResult device_clip(double max_norm);

  // ZeRO-3: the base-weight stream this trainer installed in the model. It is detached (its
  // later acquires throw) when this object goes, before the communicator.
  void set_zero3_stream(std::shared_ptr<Zero3Stream> s);
  Zero3Stream* zero3_stream() const { return zero3_.get(); }
  // ZeRO-2 sharded gradients (host backends, world > 1): the runner's gradient sink, which
  // holds the exchanges each backward runs. Kept here so that replay_passes can join them.
  void set_grad_shards(std::unique_ptr<Zero2Grads> g);
  Zero2Grads* grad_shards() const { return grads_.get(); }
  // ZeRO-3 with a sharded adapter (dist.zero3_shard_adapter, dist/zero3_lora.h), after
  // set_zero3_stream and set_grad_shards: the stream fills each layer's tensors from their
  // owners, params()' values of the tensors other ranks own become nullptr, and gather_params
  // has nothing to do (the owners step theirs in place), so the exchange buffer goes.
  void set_adapter_shards(std::unique_ptr<Zero3Lora> a);
  Zero3Lora* adapter_shards() const { return lora_.get(); }

  // ZeRO-3 or sharded gradients, before a step's forward/backward passes: how many fewer passes
  // this rank runs than the rank with the most (no micro-batch of a short last global batch, or
  // one whose targets are all masked). After its own passes the rank calls replay_passes with
  // it: it joins the others' remaining weight gathers and gradient exchanges without computing.
  // missing_passes is collective; both are no-ops (0) without them or with one rank.
  int missing_passes(int passes);
  // head_walks: Backend::cross_entropy_walks of the ranks' backend (ZeRO-3's row-sharded head).
  void replay_passes(int n, int head_walks = 2);

 private:
  // The exchange runs chunk by chunk: elements [lo, lo + n) of every rank's segment, rank r's
  // at flat_ + r n (and a reduce-scatter's result after them).
  template <class F>
  void each_in_chunk(size_t lo, size_t n, F&& f) const;  // f(param, its first, chunk's, count)
  template <class F>
  void each_bucket(F&& f) const;  // f(lo, n) for each chunk of the segments, in order
  void pack(bool grads, size_t lo, size_t n);
  void unpack(bool grads, int only_rank, size_t lo, size_t n);

  void reduce_device_gradients();
  void gather_device_params();

  std::unique_ptr<Communicator> comm_;
  Communicator* host_;  // comm_->host()
  int stage_;
  std::vector<ParamRef> params_;
  std::vector<int> owner_;
  std::vector<size_t> offset_;  // of params_[i] in the flat buffer (its owner's segment)
  size_t segment_ = 0;          // floats per rank segment (the largest rank's share)
  std::vector<size_t> fill_;    // elements per rank (its owned tensors)
  size_t chunk_ = 0;            // floats of each segment exchanged at once
  Buffer flat_;                 // host_exchange_bytes, MemCategory::Communication
  // attach_device: the backend, its flat arrays and a device exchange buffer like flat_.
  Backend* dev_ = nullptr;
  float *dev_w_ = nullptr, *dev_g_ = nullptr;
  int64_t dev_n_ = 0;
  Buffer dev_flat_;
  std::shared_ptr<Zero3Stream> zero3_;
  std::unique_ptr<Zero2Grads> grads_;
  std::unique_ptr<Zero3Lora> lora_;
  bool shard_grads_ = false;
};

// The host exchange buffer (gradients, parameters) moves a bucket of at most bucket_bytes
// (dist.bucket_kib) of each rank's segment at once: it holds (world + 1) buckets (world with
// gradients sharded during backward), not (world + 1) segments (measured: 9.9 of 14.4 MiB of
// communication on each of 4 ZeRO-3 ranks, SmolLM2 r 8, before it was bucketed).
size_t exchange_chunk_floats(size_t segment, uint64_t bucket_bytes);
uint64_t host_exchange_bytes(int world, size_t segment, bool shard_grads, uint64_t bucket_bytes);

// The bytes of a state dict and back (gathering state across ranks).
// with_bytes false: names, dtypes, shapes and byte counts only (the bytes go separately).
std::string serialize_state(const StateDict& sd, bool with_bytes = true);
void deserialize_state(const std::string& bytes, StateDict& out);
// f(name, dtype, shape, data, byte count) for each entry of serialize_state's bytes, in order
// (data nullptr when they were made without bytes). Throws QLFT_ERR_FORMAT naming the problem.
void each_state_entry(const std::string& bytes, bool with_bytes,
                      const std::function<void(const std::string&, DType, std::vector<int64_t>,
                                               const char*, uint64_t)>& f);

}  // namespace qlft::dist
