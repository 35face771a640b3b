// ZeRO-3 with a sharded adapter (dist.zero3_shard_adapter): each rank keeps only the LoRA
// tensors it owns. Ownership is ZeRO's partition by whole tensors (dist/data_parallel.h): this
// rank's optimizer state and gradient shards are those tensors' already, so the owner steps
// them in place and nobody needs the others' updated values until their layer runs.
//
// When the ZeRO-3 stream installs a layer's unit (acquire), the A and B of that layer that this
// rank does not own are filled from their owners: per run of consecutive tensors (layer order:
// projection, A then B) with the same owner, the owner packs them into one staging buffer and
// broadcasts it (one broadcast per owner of the layer, usually one). They are freed when the
// unit is (release). Every rank acquires the same units in the same order, so every rank makes
// the same broadcasts; a rank replaying passes (Zero3Stream::replay_training_pass) joins them.
//
// Whole-adapter uses (checkpoints and adapter export, written by rank 0) fill every layer on rank
// 0 with the same broadcasts (fill_all, a collective) and drop them afterwards: the one path
// through which the adapter is gathered.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/memory.h"
#include "core/communicator.h"
#include "parallel/zero3_stream.h"
#include "model/lora.h"

namespace qlft::dist {

class Zero3Lora final : public LayerExtra {
 public:
  // owners: the owning rank of each of the adapter's tensors in the trainer's parameter order
  // (layer, projection, A then B over the targeted projections). Frees the tensors this rank
  // does not own (shard).
  Zero3Lora(LoraAdapter& lora, const std::vector<int>& owners, Communicator& comm,
            MemoryTracker* tracker);

  void fill(int layer) override;  // collective
  void drop(int layer) noexcept override;

  // Every layer filled (a collective) on root only (its peers pass the broadcasts and keep
  // nothing), or on every rank with root -1 / every tensor this rank does not own freed again.
  void fill_all(int root);
  void drop_all() noexcept;
  // Every tensor allocated locally (zeros where this rank does not own it; no communication):
  // for code that then writes every tensor itself, such as loading an adapter file.
  void allocate_all();

  // This rank's share of the adapter (bytes of the tensors it owns).
  uint64_t owned_bytes() const;
  // The most that fill(l) holds at once beside the owned tensors, for any l: the staging buffer
  // and the layer's tensors this rank does not own, each block rounded by round. The static
  // form computes it from the layout alone (the planner): bytes and owners per tensor in the
  // trainer's order, per_layer tensors per layer.
  uint64_t fill_peak_bytes(const std::function<uint64_t(uint64_t)>& round) const;
  static uint64_t fill_peak_bytes(const std::vector<uint64_t>& bytes,
                                  const std::vector<int>& owners, size_t per_layer, int rank,
                                  const std::function<uint64_t(uint64_t)>& round);

  int64_t broadcasts() const { return broadcasts_; }

 private:
  struct Tensor {
    int layer;
    Proj p;
    bool b;
    int owner;
    size_t bytes;
  };
  Buffer& buffer(const Tensor& t);
  bool mine(const Tensor& t) const { return t.owner == rank_; }
  void fill_on(int layer, int root);  // root -1: every rank keeps the layer's tensors

  LoraAdapter& lora_;
  Communicator& comm_;
  MemoryTracker* tracker_;
  int rank_;
  std::vector<std::vector<Tensor>> layers_;  // per layer, in parameter order
  std::vector<char> filled_;                 // per layer
  size_t staging_bytes_ = 0;                 // the largest run of one owner in one layer
  int64_t broadcasts_ = 0;
};

}  // namespace qlft::dist
