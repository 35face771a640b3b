// Where one trainer's frozen base weights live: the shared Model as loaded, or the trainer's
// own copy of it whose storage a WeightStream places elsewhere (ZeRO-3 shards, an NVMe file,
// host memory copied unit by unit to a device).
//
// A Model is shared: generation, merged export and other trainers read it while a trainer
// trains. So a trainer never changes it. A trainer that streams its weights takes its own Model
// and converts that one; the stream lives in it and ends with the trainer. ZeRO-3 replaces the
// weights by shards, so its own model is a copy (the same shapes, types and bytes), which costs
// the bytes until the stream frees them. Device and NVMe offload only read the host bytes, so
// their own model is a skeleton (the same shapes and types, no storage) and the stream reads
// the shared model's const Buffers: a resident model is held once. To train with less than the
// whole model resident, load the model deferred (LoadOptions::deferred: load_into_shards says
// when), so the shared model holds no weights and the own model reads its groups from the file.
#pragma once

#include <memory>

#include "model/model.h"

namespace qlft {

// What a trainer's stream does with the base weights.
enum class WeightUse {
  Shared,   // none: the trainer reads the shared model (unless that one is itself streamed)
  Convert,  // the stream replaces the storage (ZeRO-3 shards): its own model is a copy
  Read,     // the stream only reads the host bytes (device, NVMe offload): a skeleton
};

class WeightPlacement {
 public:
  // The trainer has its own model when use is not Shared, or when the shared model is itself
  // read through a stream (a deferred load, whose Buffers its stream fills: a trainer must not
  // share them; its own model's stream reads the file).
  WeightPlacement(const Model& shared, MemoryTracker* tracker, WeightUse use);
  ~WeightPlacement();
  WeightPlacement(const WeightPlacement&) = delete;
  WeightPlacement& operator=(const WeightPlacement&) = delete;

  // What the trainer's runner reads: the trainer's own model, or the shared one.
  const Model& model() const { return own_ ? *own_ : shared_; }
  const Model& shared() const { return shared_; }
  bool owns() const { return own_ != nullptr; }
  // The trainer's own model (QLFT_ERR_INTERNAL without one): what a stream converts.
  Model& own();
  // Every weight group's storage in host memory, its file stream (a deferred own model's)
  // dropped: what NVMe and device offload start from. Returns the model whose const Buffers
  // hold those bytes: the shared model (a skeleton over a resident one), or own().
  const Model& make_resident();

 private:
  const Model& shared_;
  MemoryTracker* tracker_;
  std::unique_ptr<Model> own_;
  bool skeleton_ = false;  // own_ has no storage: its stream reads the shared model's
};

}  // namespace qlft
