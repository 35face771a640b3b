// The trainer's distributed parts (dist.*, offload.*): building the communicator and the ZeRO
// partition (stage 3: the base weights sharded, dist/zero3_stream.h), sharding each global
// batch across ranks, and rank-0 checkpoint writes.
#include <malloc.h>

#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "parallel/comm_select.h"
#include "parallel/data_parallel.h"
#include "parallel/zero2_grads.h"
#include "parallel/zero3_lora.h"
#include "parallel/zero3_stream.h"
#include "model/file_unit_stream.h"
#include "train/trainer.h"

namespace qlft {

namespace {

// dist.zero_stage=3: the model's base weights become this rank's shards and a stream that
// gathers them (dist/zero3_stream.h).
// host_compute: the backend computes in host memory, so the embedding and head can be
// row-sharded (it reads their rows through the stream).
void install_zero3(Model& m, dist::DataParallel& dp, MemoryTracker* tracker,
                   DeviceAllocator* device, bool host_compute, uint64_t row_chunk_bytes,
                   bool prefetch) {
  // m is the trainer's own model (train/weight_placement.h), never the shared one: its full
  // weight Buffers are replaced by this rank's shards and the stream that gathers them, which
  // ends with the trainer (DataParallel detaches it before the communicator goes).
  // A deferred load is read through its FileUnitStream: the shards are made from its source
  // group by group, and the ZeRO-3 stream takes its place.
  std::shared_ptr<WeightStream> deferred;
  FileUnitStream* files = nullptr;
  if (m.load_options.deferred && m.stream) {
    deferred = m.stream;
    files = dynamic_cast<FileUnitStream*>(deferred.get());
  }
  if (m.stream && !files)
    throw_error(QLFT_ERR_INTERNAL,
                "dist.zero_stage=3: the trainer's weights are already streamed (%s)",
                m.stream->describe().c_str());
  // The micro-batch auto-tuner (train/autotune.h) runs the same trial steps on every rank, so
  // its trials' weight gathers match across ranks.
  // Over NCCL the shards and gathered units live in the device backend's memory.
  const bool on_device = dp.device_comm().device_buffers();
  if (files) files->evict();
  auto zs = std::make_shared<dist::Zero3Stream>(
      m, on_device ? &dp.device_comm() : &dp.comm(), tracker, on_device ? device : nullptr,
      files ? &files->source() : nullptr, host_compute ? row_chunk_bytes : 0);
  zs->set_prefetch(prefetch);
  m.stream = zs;
  dp.set_zero3_stream(zs);
#ifdef __GLIBC__
  // As for NVMe offload (offload/nvme_weight_stream.cpp): the gathered units and chunks are
  // freed every layer, and each free of a large block raises glibc's mmap threshold to its
  // size, after which such blocks come from the heap and their pages stay resident when freed
  // (measured on 4 SmolLM2 ranks: 4-6 MiB of each rank's peak). Fixed at glibc's default, large
  // blocks keep their own mappings and go back to the OS when freed.
  if (!on_device) mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
  log_message(QLFT_LOG_INFO, "rank %d: %s", dp.rank(), zs->describe().c_str());
}

}  // namespace

bool load_into_shards(const RunSpec& s) {
  // ZeRO-3 with several ranks launched (MPI or NCCL): shards are made from the file, group by
  // group, and the loaded model keeps no weights beside them (it reads its units from the file
  // for generation and export while the trainer holds the shards: train/weight_placement.h).
  // offload.params=nvme: the trainer writes the file from the model's bytes; a deferred model
  // reads them from the model file instead of keeping every weight in memory beside it.
  return (s.dist.zero_stage == 3 && s.dist.backend != DistBackend::None &&
          dist::detect_launch().world > 1) ||
         s.offload.params == OffloadTarget::Nvme;
}

int Trainer::rank() const {
  return dp_ ? dp_->rank() : 0;
}
int Trainer::world() const {
  return dp_ ? dp_->world() : 1;
}

void Trainer::init_dist(const RunSpec& spec, std::vector<ParamRef> params) {
  const DistSpec& ds = spec.dist;
  // NCCL collectives take device buffers: the gradients and weights they exchange are the
  // device backend's (attach_device in the trainer), so a host backend has nothing to give them.
  if (ds.backend == DistBackend::Nccl && !backend_->device_memory())
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "dist.backend=nccl exchanges device memory between GPUs; it needs backend=cuda "
                "(backend is %s; use dist.backend=mpi for CPU ranks)",
                backend_->name());
  // ZeRO-2/3 on a host backend shards the gradients during backward (init_grads).
  dp_ = std::make_unique<dist::DataParallel>(
      dist::make_communicator(ds.backend, ds.timeout_s), ds.zero_stage, std::move(params), tracker_,
      /*host_gradient_shards=*/!backend_->device_memory(), ds.bucket_bytes);
  if (world() > 1) {
    // Ranks that split batches or count steps differently would deadlock in a collective
    // later; catch it here with a message.
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(ts_.micro_batch));
    mix(static_cast<uint64_t>(ts_.accumulation));
    mix(static_cast<uint64_t>(ts_.max_steps));
    mix(ts_.seed);
    mix(train_ ? train_->train().rows() : 0);
    dp_->comm().check_same(h, "train.micro_batch/accumulation/max_steps, seed or the data");
    log_message(QLFT_LOG_INFO,
                "rank %d of %d (%s, ZeRO stage %d, device %d): %zu of %zu LoRA tensors here",
                rank(), world(), dp_->device_comm().backend(), ds.zero_stage,
                backend_->device_index(), dp_->owned_params().size(), dp_->params().size());
  }
  // NCCL's collectives wait for the backend's queued work (gradients, the weights in use).
  dp_->device_comm().follow_stream(backend_->native_stream());
  if (ds.zero_stage == 3)
    install_zero3(placement_->own(), *dp_, tracker_, backend_->device_memory(),
                  backend_->device_memory() == nullptr, ds.row_chunk_bytes, ds.prefetch);
}

void Trainer::init_grads(const RunSpec& spec) {
  // ZeRO-2 (and 3) on a host backend: this rank keeps the gradients of its own tensors only,
  // and the runner hands each projection's gradients to the exchange as backward makes them
  // (dist/zero2_grads.h). A device backend accumulates every gradient in its flat device array
  // (LlamaRunner::lora_device_grads) and reduce-scatters after backward: full gradients there.
  const bool shard = dp_->shards_gradients();
  std::unique_ptr<dist::Zero2Grads> g =
      dist::allocate_lora_gradients(*lora_, *dp_, shard, tracker_);
  if (g) {
    runner_->set_grad_sink(g.get());
    log_message(QLFT_LOG_INFO,
                "rank %d: ZeRO-%d sharded gradients: %zu of %zu LoRA gradients here, a %s reduce "
                "bucket per projection",
                rank(), dp_->zero_stage(), dp_->owned_params().size(), dp_->params().size(),
                format_bytes(g->bucket_bytes()).c_str());
    dp_->set_grad_shards(std::move(g));
  } else if (dp_->zero_stage() >= 2 && world() > 1) {
    log_message(QLFT_LOG_INFO,
                "rank %d: ZeRO-%d on the %s backend keeps every LoRA gradient (reduce-scattered "
                "after backward); sharded gradients are built for host backends",
                rank(), dp_->zero_stage(), backend_->name());
  }
  if (spec.dist.shard_adapter && world() > 1) return shard_adapter();
  // (values deferred for a sharding that does not happen: every tensor's)
  if (!adapter_has_values()) make_adapter_values([](size_t) { return true; });
}

bool Trainer::adapter_has_values() const {
  if (param_slots_.empty()) return true;
  const ParamSlot& ps = param_slots_[0];
  const LoraAdapter& a = *lora_;
  if (ps.moe >= 0) return !a.moe_slot(ps.layer, MoePart(ps.moe)).A.empty();
  return !a.slot(ps.layer, ps.p).A.empty();
}

void Trainer::make_adapter_values(const std::function<bool(size_t)>& keep) {
  auto key = [](int layer, Proj p, bool b) {
    return (static_cast<size_t>(layer) * kProjCount + static_cast<size_t>(p)) * 2 + (b ? 1 : 0);
  };
  std::vector<size_t> param(key(lora_->n_layers(), Proj::Q, false));  // by (layer, projection, b)
  for (size_t i = 0; i < param_slots_.size(); ++i)
    if (param_slots_[i].moe < 0)  // (an MoE layer's expert / router LoRA: made whole)
      param[key(param_slots_[i].layer, param_slots_[i].p, param_slots_[i].b)] = i;
  lora_->allocate_values([&](int layer, Proj p, bool b) { return keep(param[key(layer, p, b)]); });
  for (size_t i = 0; i < param_slots_.size(); ++i) {
    const ParamSlot& ps = param_slots_[i];
    if (ps.moe >= 0) {
      const MoeLoraSlot& m =
          static_cast<const LoraAdapter&>(*lora_).moe_slot(ps.layer, MoePart(ps.moe));
      dp_->set_data(i, const_cast<float*>((ps.b ? m.B : m.A).as<float>()));
      continue;
    }
    LoraSlot& s = lora_->slot(ps.layer, ps.p);
    Buffer& v = ps.b ? s.B : s.A;
    dp_->set_data(i, v.empty() ? nullptr : v.as<float>());
  }
}

void Trainer::shard_adapter() {
  // The owners step their tensors in place and the ZeRO-3 stream hands the others' to the
  // runner per layer, so only a host ZeRO-3 run with sharded gradients can drop them.
  if (dp_->zero_stage() != 3 || !dp_->shards_gradients() || !dp_->zero3_stream())
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "dist.zero3_shard_adapter needs dist.zero_stage=3 on CPU ranks "
                "(dist.backend=mpi, backend=cpu); this run has dist.zero_stage=%d on the %s "
                "backend",
                dp_->zero_stage(), backend_->name());
  std::vector<int> owners;
  for (size_t i = 0; i < dp_->params().size(); ++i) owners.push_back(dp_->owner(i));
  // Values made after the partition (no lora.init_from): only this rank's, never the others'.
  if (!adapter_has_values()) make_adapter_values([&](size_t i) { return dp_->owner(i) == rank(); });
  auto shards = std::make_unique<dist::Zero3Lora>(*lora_, owners, dp_->comm(), tracker_);
  log_message(QLFT_LOG_INFO, "rank %d: ZeRO-3 sharded adapter: %s of LoRA weights here", rank(),
              format_bytes(shards->owned_bytes()).c_str());
  dp_->set_adapter_shards(std::move(shards));
  // With lora.init_from the other ranks' tensors were made and are freed now: small heap blocks
  // in the middle of the heap, whose pages the allocator would keep resident beside everything
  // allocated later. (Otherwise only this rank's were ever made and this gives little back.)
  malloc_trim(0);
}

size_t Trainer::next_global_batches(std::vector<data::Batch>& mine) {
  // The global batch is accumulation x world consecutive micro-batches of the one seeded row
  // stream every rank walks; micro-batch i is rank i % world's. One rank with accumulation x
  // world micro-batches therefore sees exactly the same rows.
  size_t total = 0;
  const int n = ts_.accumulation * world();
  for (int i = 0; i < n; ++i) {
    if (ts_.max_steps > 0 && it_->position() >= it_->total_rows()) it_->seek(0);  // cycle
    data::Batch b;
    if (!it_->next(b)) break;
    ++total;
    if (dp_->owns_micro_batch(i)) mine.push_back(std::move(b));
  }
  return total;
}

bool Trainer::adapter_sharded() const {
  return dp_ && dp_->adapter_shards();
}

void Trainer::with_whole_adapter(const std::function<void()>& f) const {
  dist::Zero3Lora* a = dp_ ? dp_->adapter_shards() : nullptr;
  if (!a) return f();
  // The runner's step buffers go first, and the blocks the tracker keeps for the next step
  // (they are made again then), so the gathered tensors take their place rather than adding to
  // the training peak. Only rank 0, the writer, keeps the tensors.
  runner_->release();
  tracker_->trim_host_cache();
  a->fill_all(0);
  try {
    f();
  } catch (...) {
    a->drop_all();
    throw;
  }
  a->drop_all();
}

void Trainer::write_adapter(const std::function<void(const LoraAdapter&)>& write) const {
  if (!adapter_sharded()) return write(*lora_);
  with_whole_adapter([&] { write_checkpoint_on_rank0([&] { write(*lora_); }, "the adapter"); });
}

void Trainer::load_adapter(const std::function<void(LoraAdapter&)>& load) {
  dist::Zero3Lora* a = dp_ ? dp_->adapter_shards() : nullptr;
  if (!a) return load(*lora_);
  // Each rank reads the whole file and keeps its own tensors: no communication.
  a->allocate_all();
  try {
    load(*lora_);
  } catch (...) {
    a->drop_all();
    throw;
  }
  a->drop_all();
}

void Trainer::write_checkpoint_on_rank0(const std::function<void()>& write,
                                        const char* what) const {
  // Rank 0's outcome is broadcast so that every rank returns only once the file exists, and
  // every rank fails when the write failed.
  int32_t status = QLFT_OK;
  std::string msg;
  if (is_writer()) {
    try {
      write();
    } catch (const Error& e) {
      status = e.status();
      msg = e.what();
    } catch (const std::exception& e) {
      status = QLFT_ERR_INTERNAL;
      msg = e.what();
    }
  }
  char text[512] = {};
  std::snprintf(text, sizeof text, "%s", msg.c_str());
  dp_->comm().broadcast(&status, sizeof status, 0);
  dp_->comm().broadcast(text, sizeof text, 0);
  if (status != QLFT_OK)
    throw_error(status, "%s%s",
                is_writer() ? "" : strf("rank 0 failed to write %s: ", what).c_str(), text);
}

}  // namespace qlft
