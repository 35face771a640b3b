// DataParallel's device-resident exchange (data_parallel.h, attach_device): gradients reduced
// and updated tensors gathered with the device communicator on the backend's arrays.
#include <cmath>

#include "backend/backend.h"
#include "core/error.h"
#include "parallel/data_parallel.h"

namespace qlft::dist {

void DataParallel::attach_device(Backend& be, float* w, float* g, int64_t n) {
  QLFT_CHECK_ARG(comm_->device_buffers(),
                 "device-resident gradient exchange needs a device communicator (dist.backend="
                 "nccl), not %s",
                 comm_->backend());
  QLFT_CHECK_ARG(be.device_memory(), "device-resident gradient exchange needs a device backend");
  int64_t total = 0;
  for (const ParamRef& p : params_) total += static_cast<int64_t>(p.numel);
  QLFT_CHECK_ARG(total == n, "attach_device: the parameters hold %lld values, the arrays %lld",
                 static_cast<long long>(total), static_cast<long long>(n));
  dev_ = &be;
  dev_w_ = w;
  dev_g_ = g;
  dev_n_ = n;
  // Stages 1-3 exchange equal blocks (reduce-scatter, all-gather); the last block receives
  // this rank's reduced share.
  if (world() > 1 && stage_ > 0)
    dev_flat_ = be.alloc(MemCategory::Communication,
                         (static_cast<size_t>(world()) + 1) * segment_ * sizeof(float),
                         "gradient/parameter exchange buffer (device)", BufferInit::Zero);
}

int64_t DataParallel::owned_begin() const {
  if (stage_ == 0) return 0;
  int64_t b = 0;
  for (int r = 0; r < rank(); ++r) b += static_cast<int64_t>(fill_[static_cast<size_t>(r)]);
  return b;
}

int64_t DataParallel::owned_count() const {
  if (stage_ == 0) return dev_n_;
  return static_cast<int64_t>(fill_[static_cast<size_t>(rank())]);
}

float* DataParallel::device_grads(int64_t* n) const {
  if (stage_ < 2 || world() == 1) {
    *n = dev_n_;
    return dev_g_;
  }
  *n = owned_count();
  return dev_g_ + owned_begin();
}

void DataParallel::reduce_device_gradients() {
  if (stage_ < 2) {  // every rank needs every sum (stage 1 then updates its own tensors)
    comm_->all_reduce(dev_g_, static_cast<size_t>(dev_n_), ReduceOp::Sum);
    return;
  }
  // Rank r's range into block r, reduce-scatter into the last block, back into the range.
  float* f = dev_flat_.as<float>();
  int64_t begin = 0;
  for (int r = 0; r < world(); ++r) {
    const int64_t n = static_cast<int64_t>(fill_[static_cast<size_t>(r)]);
    dev_->copy(f + static_cast<size_t>(r) * segment_, dev_g_ + begin, n);
    begin += n;
  }
  float* mine = f + static_cast<size_t>(world()) * segment_;
  comm_->reduce_scatter(f, mine, segment_, ReduceOp::Sum);
  dev_->copy(dev_g_ + owned_begin(), mine, owned_count());
}

ClipResult DataParallel::device_clip(double max_norm) {
  int64_t n = 0;
  float* g = device_grads(&n);
  // Stages 0-1: every rank holds the same full gradients, so its own norm is the global one.
  double sq = dev_->sum_squares(g, n);
  if (stage_ >= 2 && world() > 1) sq = host_->sum(sq);
  const ClipResult r = clip_rule(std::sqrt(sq), max_norm);
  if (r.clipped) dev_->scale(g, n, static_cast<float>(r.coef));
  return r;
}

void DataParallel::gather_device_params() {
  // This rank's updated range into the last block (the send buffer, apart from the received
  // blocks), all-gather, every other rank's block into its range.
  float* f = dev_flat_.as<float>();
  float* out = f + static_cast<size_t>(world()) * segment_;
  dev_->copy(out, dev_w_ + owned_begin(), owned_count());
  comm_->all_gather(out, f, segment_);
  int64_t begin = 0;
  for (int r = 0; r < world(); ++r) {
    const int64_t n = static_cast<int64_t>(fill_[static_cast<size_t>(r)]);
    if (r != rank()) dev_->copy(dev_w_ + begin, f + static_cast<size_t>(r) * segment_, n);
    begin += n;
  }
}

}  // namespace qlft::dist
