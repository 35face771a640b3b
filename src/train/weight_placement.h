// Where one trainer's frozen base weights live: the shared Model as loaded, or the trainer's
// own copy of it whose storage a WeightStream places elsewhere (ZeRO-3 shards, an NVMe file,
// host memory copied unit by unit to a device).
//
// A Model is shared: generation, merged export and other trainers read it while a trainer
// trains. So a trainer never changes it. A trainer that streams its weights takes its own Model
// (the same shapes, types and bytes) and converts that one; the stream lives in the copy and
// ends with the trainer. The copy of a resident model costs its bytes until the stream frees
// them (every stream frees the copy's storage as it places it); to train with less than the
// whole model resident, load the model deferred (LoadOptions::deferred: load_into_shards says
// when), so the shared model holds no weights and the copy reads its groups from the file.
#pragma once

#include <memory>

#include "model/model.h"

namespace qlft {

class WeightPlacement {
 public:
  // own: the trainer streams its weights, or the shared model is itself read through a stream
  // (a deferred load, whose Buffers its stream fills: a trainer must not share them).
  WeightPlacement(const Model& shared, MemoryTracker* tracker, bool own);
  ~WeightPlacement();
  WeightPlacement(const WeightPlacement&) = delete;
  WeightPlacement& operator=(const WeightPlacement&) = delete;

  // What the trainer's runner reads: the trainer's own model, or the shared one.
  const Model& model() const { return own_ ? *own_ : shared_; }
  const Model& shared() const { return shared_; }
  bool owns() const { return own_ != nullptr; }
  // The trainer's own model (QLFT_ERR_INTERNAL without one): what a stream converts.
  Model& own();
  // Every weight group's storage in own(), its file stream (a deferred copy's) dropped: what
  // NVMe and device offload start from.
  void make_resident();

 private:
  const Model& shared_;
  MemoryTracker* tracker_;
  std::unique_ptr<Model> own_;
};

}  // namespace qlft
