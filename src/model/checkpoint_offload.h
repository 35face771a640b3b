// Offloaded gradient checkpoints (train.offload_checkpoints): the saved input of each
// checkpointed layer (the residual stream's entry the layer reads) leaves the backend's memory
// for pinned host memory while forward goes on, and comes back one layer ahead of its
// recompute in backward, as Unsloth's offloaded gradient checkpointing does.
//
// The device keeps a ring of fp32 slots the offloaded entries live in while they are there
// (entry of ordinal j: slot j % slots(acts)), not one buffer per layer. Forward: an entry is
// written into its slot (after the copy out of the slot's previous entry), converted to 16
// bits (bf16 under bf16 / fp16, where the residual stream can exceed fp16's range; fp32 copies
// under fp32) into the staging slot (after the copy out of the previous entry, which read it),
// and copied out on the backend's copy stream (Backend::copy_async: after an event behind the
// producer, with an event the next user of the slot waits on). Backward: the entry's copy in
// (prefetched while the layer above ran) is waited for, widened into its slot, and the next
// offloaded entry below is prefetched. The last offloaded entry is not copied at all: it is
// still in its slot when backward, which needs it first, begins (a copy back would hold up the
// compute stream there).
// Under 16 bits one fp32 slot: the copy out reads the staging slot, so once an entry is staged
// its fp32 slot is free, and the layer reading the entry writes its output over it (layer_fwd
// reads its input for the last time in the attention residual add, before it writes its
// output; backward's recompute writes its output elsewhere). Under fp32 the copy reads the
// slot itself: two slots, the next entry written beside the one being copied.
// Under fp32 the recompute sees the exact input; under bf16 / fp16 the bf16 rounding of it.
//
// On a host backend the copies are plain copies (Backend's defaults) and nothing is saved; the
// logic is the same, which the CPU tests use.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace qlft {

// Bytes the offload holds, as the tracker counts them (the planner's rows: train/planner.cpp).
struct OffloadFootprint {
  uint64_t device = 0;  // the fp32 ring slots and the 16-bit staging slot (activations)
  uint64_t host = 0;    // one pinned copy per offloaded entry but the last (activations, host)
};

class CheckpointOffload {
 public:
  // The type an entry is stored in on the host for activation storage type acts.
  static DType host_type(DType acts) { return acts == DType::F32 ? DType::F32 : DType::BF16; }
  // fp32 slots of the ring (2 under fp32, 1 under 16 bits) and 16-bit staging slots (0 or 1).
  static int slots(DType acts) { return host_type(acts) == DType::F32 ? 2 : 1; }
  static int stages(DType acts) { return host_type(acts) == DType::F32 ? 0 : 1; }
  // n_off entries of elems floats each; round: the device allocator's rounding (nullptr: 64).
  static OffloadFootprint footprint(int64_t elems, int n_off, DType acts,
                                    uint64_t (*round)(uint64_t) = nullptr);

  // off[i]: entry i (i < off.size()) is offloaded; elems floats an entry.
  CheckpointOffload(Backend& be, const std::vector<bool>& off, int64_t elems, DType acts);
  ~CheckpointOffload();
  CheckpointOffload(const CheckpointOffload&) = delete;
  CheckpointOffload& operator=(const CheckpointOffload&) = delete;

  bool offloaded(int i) const { return i >= 0 && i < int(ord_.size()) && ord_[size_t(i)] >= 0; }
  // The device slot entry i lives in while it is on the device.
  float* at(int i);

  // A pass begins: its work waits for every copy of the passes before it.
  void begin_pass();
  // Entry i is about to be written into its slot (waits for the copy out of its previous entry).
  void will_write(int i);
  // Forward of a training pass: entry i was written; copies it out.
  void save(int i);
  // Backward: entry i is needed in its slot now; prefetches the next offloaded entry below it.
  void restore(int i);

 private:
  void fetch(int j);  // issues the copy in of ordinal j

  Backend& be_;
  int64_t elems_;
  DType host_t_;
  int nslot_;             // slots(acts)
  std::vector<int> ord_;  // per entry: its ordinal among the offloaded ones, or -1
  std::vector<Buffer> slot_, stage_, host_;
  std::vector<uint64_t> out_, in_;  // tickets of each ordinal's copy out / in
  std::vector<bool> out_live_, in_live_;
  int top_ = 0;        // the last offloaded entry's ordinal: it is not copied (see the top)
  uint64_t last_ = 0;  // the latest ticket
  bool any_ = false;   // a copy has been issued
};

}  // namespace qlft
