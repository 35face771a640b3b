#include "model/file_unit_stream.h"

#include "core/error.h"

namespace qlft {

FileUnitStream::FileUnitStream(Model& model, MemoryTracker* tracker)
    : model_(model),
      source_(WeightGroupSource::open(tracker, model)),
      unit_groups_(weight_groups_of_units(model)) {}

FileUnitStream::~FileUnitStream() {
  evict();
}

std::string FileUnitStream::describe() const {
  return "rank-local reads of " + model_.path;
}

bool FileUnitStream::present(int u) const {
  bool all = true;
  for (int g : unit_groups_[static_cast<size_t>(u)]) {
    bool any = false;
    for_each_weight_buffer(model_, [&](int bg, const Buffer& b) {
      if (bg == g && !b.empty()) any = true;
    });
    all = all && any;
  }
  return all;
}

void FileUnitStream::uninstall(int u) noexcept {
  for (int g : unit_groups_[static_cast<size_t>(u)])
    for_each_weight_buffer(model_, [&](int bg, Buffer& b) {
      if (bg == g) b.reset();
    });
  if (installed_ == u) installed_ = kNoUnit;
}

void FileUnitStream::evict() noexcept {
  if (installed_ != kNoUnit) uninstall(installed_);
  held_ = kNoUnit;
  keep_ = false;
}

void FileUnitStream::acquire(int u, int next) {
  QLFT_CHECK_ARG(u >= 0 && u < static_cast<int>(unit_groups_.size()),
                 "unit %d does not exist (%zu units)", u, unit_groups_.size());
  if (held_ != kNoUnit && held_ != u)
    throw_error(QLFT_ERR_INTERNAL, "unit %d acquired while unit %d is still held", u, held_);
  // Another stream over the same model (the ZeRO-3 gathers) may have emptied the Buffers.
  if (installed_ != u || !present(u)) {
    if (installed_ != kNoUnit) uninstall(installed_);
    try {
      for (int g : unit_groups_[static_cast<size_t>(u)])
        source_->load(model_, g, /*with_head=*/true);
    } catch (...) {
      uninstall(u);
      throw;
    }
    installed_ = u;
    ++loads_;
  }
  held_ = u;
  keep_ = next == u;
}

void FileUnitStream::release(int u) noexcept {
  if (held_ != u) return;
  held_ = kNoUnit;
  if (!keep_ && installed_ == u) uninstall(u);
}

}  // namespace qlft
