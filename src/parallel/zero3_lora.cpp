#include "parallel/zero3_lora.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/error.h"

namespace qlft::dist {

namespace {

// f(layer, p, b, bytes, param index) over the adapter's tensors in the trainer's order.
template <class F>
void each_tensor(const LoraAdapter& lora, F&& f) {
  size_t i = 0;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int q = 0; q < kProjCount; ++q) {
      const Proj p = static_cast<Proj>(q);
      if (!lora.active(l, p)) continue;
      f(l, p, false, static_cast<size_t>(lora.a_size(l, p)) * 4, i++);
      f(l, p, true, static_cast<size_t>(lora.b_size(l, p)) * 4, i++);
    }
}

}  // namespace

Zero3Lora::Zero3Lora(LoraAdapter& lora, const std::vector<int>& owners, Communicator& comm,
                     MemoryTracker* tracker)
    : lora_(lora), comm_(comm), tracker_(tracker), rank_(comm.rank()) {
  layers_.resize(static_cast<size_t>(lora.n_layers()));
  size_t count = 0;
  each_tensor(lora, [&](int l, Proj p, bool b, size_t bytes, size_t i) {
    QLFT_CHECK_ARG(i < owners.size(), "ZeRO-3 adapter shards: %zu owners for more tensors",
                   owners.size());
    layers_[static_cast<size_t>(l)].push_back({l, p, b, owners[i], bytes});
    ++count;
  });
  QLFT_CHECK_ARG(count == owners.size(), "ZeRO-3 adapter shards: %zu owners for %zu tensors",
                 owners.size(), count);
  filled_.assign(layers_.size(), 0);
  for (const std::vector<Tensor>& ts : layers_)
    for (size_t i = 0, run = 0; i < ts.size(); ++i) {
      run = i > 0 && ts[i].owner == ts[i - 1].owner ? run + ts[i].bytes : ts[i].bytes;
      staging_bytes_ = std::max(staging_bytes_, run);
    }
  drop_all();
}

Buffer& Zero3Lora::buffer(const Tensor& t) {
  LoraSlot& s = lora_.slot(t.layer, t.p);
  return t.b ? s.B : s.A;
}

void Zero3Lora::fill(int layer) {
  fill_on(layer, -1);
}

void Zero3Lora::fill_on(int layer, int root) {
  const std::vector<Tensor>& ts = layers_.at(static_cast<size_t>(layer));
  const bool keep = root < 0 || root == rank_;  // others only pass the broadcasts
  if (filled_[static_cast<size_t>(layer)]) return;
  try {
    Buffer staging;
    for (size_t i = 0; i < ts.size();) {
      // One run: consecutive tensors of one owner, packed by the owner and broadcast.
      size_t j = i, bytes = 0;
      for (; j < ts.size() && ts[j].owner == ts[i].owner; ++j) bytes += ts[j].bytes;
      if (staging.empty())
        staging = Buffer(tracker_, MemCategory::Communication, staging_bytes_, "LoRA broadcast",
                         BufferInit::Uninit);
      char* s = staging.as<char>();
      const bool owner = mine(ts[i]);
      if (owner)
        for (size_t k = i, off = 0; k < j; off += ts[k].bytes, ++k)
          std::memcpy(s + off, buffer(ts[k]).data(), ts[k].bytes);
      comm_.broadcast(s, bytes, ts[i].owner);
      ++broadcasts_;
      if (!owner && keep)
        for (size_t k = i, off = 0; k < j; off += ts[k].bytes, ++k) {
          Buffer& b = buffer(ts[k]);
          b = Buffer(tracker_, MemCategory::Communication, ts[k].bytes, "gathered LoRA",
                     BufferInit::Uninit);
          std::memcpy(b.data(), s + off, ts[k].bytes);
        }
      i = j;
    }
  } catch (...) {
    drop(layer);
    throw;
  }
  filled_[static_cast<size_t>(layer)] = keep ? 1 : 0;
}

void Zero3Lora::drop(int layer) noexcept {
  for (const Tensor& t : layers_[static_cast<size_t>(layer)])
    if (!mine(t)) buffer(t).reset();
  filled_[static_cast<size_t>(layer)] = 0;
}

void Zero3Lora::fill_all(int root) {
  try {
    for (int l = 0; l < static_cast<int>(layers_.size()); ++l) fill_on(l, root);
  } catch (...) {
    drop_all();
    throw;
  }
}

void Zero3Lora::drop_all() noexcept {
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) drop(l);
}

void Zero3Lora::allocate_all() {
  for (std::vector<Tensor>& ts : layers_) {
    for (const Tensor& t : ts)
      if (!mine(t) && buffer(t).empty())
        buffer(t) = Buffer(tracker_, MemCategory::Communication, t.bytes, "gathered LoRA");
    if (!ts.empty()) filled_[static_cast<size_t>(ts.front().layer)] = 1;
  }
}

uint64_t Zero3Lora::owned_bytes() const {
  uint64_t n = 0;
  for (const std::vector<Tensor>& ts : layers_)
    for (const Tensor& t : ts)
      if (mine(t)) n += t.bytes;
  return n;
}

uint64_t Zero3Lora::fill_peak_bytes(const std::vector<uint64_t>& bytes,
                                    const std::vector<int>& owners, size_t per_layer, int rank,
                                    const std::function<uint64_t(uint64_t)>& round) {
  // fill(l) holds the staging buffer (the largest run of one owner within a layer, over every
  // layer) beside the tensors of l this rank does not own.
  uint64_t run = 0, staging = 0, others = 0, most = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const bool first = i % per_layer == 0;
    run = !first && owners[i] == owners[i - 1] ? run + bytes[i] : bytes[i];
    staging = std::max(staging, run);
    if (first) others = 0;
    if (owners[i] != rank) others += round(bytes[i]);
    most = std::max(most, others);
  }
  return bytes.empty() ? 0 : round(staging) + most;
}

uint64_t Zero3Lora::fill_peak_bytes(const std::function<uint64_t(uint64_t)>& round) const {
  std::vector<uint64_t> bytes;
  std::vector<int> owners;
  for (const std::vector<Tensor>& ts : layers_)
    for (const Tensor& t : ts) {
      bytes.push_back(t.bytes);
      owners.push_back(t.owner);
    }
  return fill_peak_bytes(bytes, owners, layers_.empty() ? 1 : layers_[0].size(), rank_, round);
}

}  // namespace qlft::dist
