#include "model/checkpoint_offload.h"

#include <algorithm>

#include "core/error.h"

namespace qlft {

namespace {
uint64_t counted(int64_t n, int64_t bytes, uint64_t (*round)(uint64_t)) {
  const uint64_t b = (uint64_t(n) * uint64_t(bytes) + 63) / 64 * 64;
  return round ? round(b) : b;
}
int64_t bytes_of(DType t) {
  return t == DType::F32 ? 4 : 2;
}
}  // namespace

OffloadFootprint CheckpointOffload::footprint(int64_t elems, int n_off, DType acts,
                                              uint64_t (*round)(uint64_t)) {
  OffloadFootprint f;
  if (n_off <= 0) return f;
  const DType h = host_type(acts);
  f.device = uint64_t(std::min(slots(acts), n_off)) * counted(elems, 4, round);
  if (h != DType::F32 && n_off > 1) f.device += uint64_t(stages(acts)) * counted(elems, 2, round);
  f.host = uint64_t(n_off - 1) * counted(elems, bytes_of(h), nullptr);  // the last stays
  return f;
}

CheckpointOffload::CheckpointOffload(Backend& be, const std::vector<bool>& off, int64_t elems,
                                     DType acts)
    : be_(be), elems_(elems), host_t_(host_type(acts)), nslot_(slots(acts)), ord_(off.size(), -1) {
  const MemCategory A = MemCategory::Activations;
  int n = 0;
  for (size_t i = 0; i < off.size(); ++i)
    if (off[i]) ord_[i] = n++;
  QLFT_CHECK_ARG(n > 0, "checkpoint offload without an offloaded layer");
  const size_t hb = size_t(elems) * size_t(bytes_of(host_t_));
  for (int s = 0; s < nslot_ && s < n; ++s)
    slot_.push_back(
        be.alloc(A, size_t(elems) * 4, "offloaded checkpoint slot", BufferInit::Uninit));
  if (host_t_ != DType::F32 && n > 1)  // (a single entry is never copied)
    stage_.push_back(be.alloc(A, hb, "offloaded checkpoint staging", BufferInit::Uninit));
  top_ = n - 1;
  for (int j = 0; j < top_; ++j)
    host_.push_back(be.alloc_pinned(A, hb, "offloaded checkpoint (pinned host)"));
  out_.assign(size_t(n), 0);
  in_.assign(size_t(n), 0);
  out_live_.assign(size_t(n), false);
  in_live_.assign(size_t(n), false);
}

CheckpointOffload::~CheckpointOffload() {
  // A copy may still read or write a slot or a pinned buffer freed below.
  be_.sync_copies();
}

float* CheckpointOffload::at(int i) {
  return slot_[size_t(ord_[size_t(i)] % nslot_)].as<float>();
}

void CheckpointOffload::begin_pass() {
  if (any_) be_.wait_copy(last_);
  for (size_t j = 0; j < out_live_.size(); ++j) out_live_[j] = in_live_[j] = false;
}

void CheckpointOffload::will_write(int i) {
  // (Under 16 bits the copies read the staging slot, not this one: save waits for them.)
  const int j = ord_[size_t(i)];
  if (host_t_ == DType::F32 && j >= nslot_ && out_live_[size_t(j - nslot_)])
    be_.wait_copy(out_[size_t(j - nslot_)]);
}

void CheckpointOffload::save(int i) {
  if (ord_[size_t(i)] == top_) return;  // stays in its slot: backward needs it first
  const size_t j = size_t(ord_[size_t(i)]);
  const size_t s = j % size_t(nslot_);
  const void* src = slot_[s].data();
  if (host_t_ != DType::F32) {  // the one staging slot: the previous copy out read it
    if (j > 0 && out_live_[j - 1]) be_.wait_copy(out_[j - 1]);
    be_.to_16(host_t_, slot_[s].as<float>(), stage_[0].as<uint16_t>(), elems_);
    src = stage_[0].data();
  }
  out_[j] = last_ = be_.copy_async(host_[j].data(), src, host_[j].size());
  out_live_[j] = any_ = true;
  in_live_[j] = false;
}

void CheckpointOffload::fetch(int j) {
  // Into the staging slot after the work queued so far (copy_async), the widening of the entry
  // it held included; under fp32 into the slot the layer above does not read.
  const size_t s = size_t(j) % size_t(nslot_);
  void* dst = host_t_ != DType::F32 ? stage_[0].data() : slot_[s].data();
  in_[size_t(j)] = last_ = be_.copy_async(dst, host_[size_t(j)].data(), host_[size_t(j)].size());
  in_live_[size_t(j)] = any_ = true;
}

void CheckpointOffload::restore(int i) {
  const int j = ord_[size_t(i)];
  if (j != top_) {  // (the last is still in its slot, exact)
    if (!in_live_[size_t(j)]) fetch(j);
    be_.wait_copy(in_[size_t(j)]);
    const size_t s = size_t(j) % size_t(nslot_);
    if (host_t_ != DType::F32)
      be_.from_16(host_t_, stage_[0].as<uint16_t>(), slot_[s].as<float>(), elems_);
  }
  if (j > 0 && !in_live_[size_t(j - 1)]) fetch(j - 1);  // overlaps this layer's backward
}

}  // namespace qlft
