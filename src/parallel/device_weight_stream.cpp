#include "parallel/device_weight_stream.h"

#include "core/error.h"
#include "model/model.h"

namespace qlft {

std::shared_ptr<DeviceWeightStream> DeviceWeightStream::offload(Model& model, const Model& host,
                                                                DeviceAllocator* device) {
  QLFT_CHECK_ARG(device, "offload.params=cpu streams weights to a device: no device memory");
  QLFT_CHECK_ARG(!model.stream, "offload.params=cpu: the base weights of %s are already streamed",
                 model.path.c_str());
  std::shared_ptr<DeviceWeightStream> s(new DeviceWeightStream(model, host, device));
  model.stream = s;
  return s;
}

DeviceWeightStream::DeviceWeightStream(Model& model, const Model& host, DeviceAllocator* device)
    : model_(&model), device_(device) {
  groups_.resize(model.layers.size() + 2);
  const std::vector<const Buffer*> bytes = weight_bytes_in(host, model, "offload.params=cpu");
  const bool move = &host == &model;
  size_t i = 0;
  for_each_weight_buffer(model, [&](int g, Buffer& b) {
    const Buffer* h = bytes[i++];
    if (h->empty()) return;  // absent (no bias, no scales): stays empty
    if (h->on_device())
      throw_error(QLFT_ERR_INTERNAL, "offload.params=cpu: the weights of %s are not on the host",
                  host.path.c_str());
    host_bytes_ += h->size();
    if (move)
      groups_[static_cast<size_t>(g)].push_back({&b, std::move(b), nullptr});
    else
      groups_[static_cast<size_t>(g)].push_back({&b, Buffer(), h});
  });
  unit_groups_ = weight_groups_of_units(model);
}

DeviceWeightStream::~DeviceWeightStream() {
  restore();
}

template <class F>
void DeviceWeightStream::each_slot(int u, const F& f) {
  for (int g : unit_groups_[static_cast<size_t>(u)])
    for (Slot& s : groups_[static_cast<size_t>(g)]) f(s);
}

DeviceWeightStream::Copy DeviceWeightStream::start(int u) {
  Copy c;
  c.unit = u;
  each_slot(u, [&](Slot& s) {
    const Buffer& h = s.host();
    c.bufs.emplace_back(device_, MemCategory::Weights, h.size(), "weights (offload.params)",
                        BufferInit::Uninit);
    c.bufs.back().copy_from_host(h.data(), h.size());
    copied_bytes_ += h.size();
  });
  return c;
}

void DeviceWeightStream::install(Copy& c) {
  size_t i = 0;
  each_slot(c.unit, [&](Slot& s) { *s.model_buf = std::move(c.bufs[i++]); });
  installed_.unit = c.unit;
  c = Copy();
}

void DeviceWeightStream::uninstall() noexcept {
  if (installed_.unit == kNoUnit) return;
  each_slot(installed_.unit, [](Slot& s) { s.model_buf->reset(); });
  installed_.unit = kNoUnit;
}

void DeviceWeightStream::acquire(int u, int next) {
  QLFT_CHECK_ARG(!restored_, "offload.params=cpu: the trainer that streamed %s has ended",
                 model_->path.c_str());
  check_one_unit_acquire("offload.params=cpu", u, unit_groups_.size(), held_);
  try {
    if (installed_.unit != u) {
      uninstall();
      Copy c = ahead_.unit == u ? std::move(ahead_) : start(u);
      ahead_ = Copy();
      install(c);
    }
    held_ = u;
    keep_ = next == u;
    if (next != kNoUnit && next != u && ahead_.unit != next) {
      QLFT_CHECK_ARG(next >= 0 && next < static_cast<int>(unit_groups_.size()),
                     "offload.params=cpu: next unit %d does not exist", next);
      ahead_ = Copy();
      ahead_ = start(next);
    }
  } catch (...) {
    if (installed_.unit == u) uninstall();
    held_ = kNoUnit;
    ahead_ = Copy();
    throw;
  }
}

void DeviceWeightStream::release(int u) noexcept {
  if (held_ != u) return;
  held_ = kNoUnit;
  if (!keep_ && installed_.unit == u) uninstall();
}

std::string DeviceWeightStream::describe() const {
  return strf("offload.params=cpu (%s of weights in host memory, a unit at a time on the device)",
              format_bytes(host_bytes_).c_str());
}

void DeviceWeightStream::restore() noexcept {
  if (restored_) return;
  ahead_ = Copy();
  uninstall();
  held_ = kNoUnit;
  for (std::vector<Slot>& g : groups_)
    for (Slot& s : g)
      if (!s.read) *s.model_buf = std::move(s.moved);
  restored_ = true;
}

}  // namespace qlft
