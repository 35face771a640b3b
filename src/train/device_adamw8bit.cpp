// 8-bit AdamW (bitsandbytes' AdamW8bit / PagedAdamW8bit, optim/adamw8bit.h) stepping where the
// device adapter lives: per LoRA tensor, in step order, one Backend::adamw_bnb8 (blockwise 8-bit
// state) or adamw_bnb32 (fp32 state of tensors under kAdam8bitMinElements) on the runner's
// device copy of the parameters and gradients. The state is in the backend's device memory
// (adamw8bit) or in its managed state store (paged_adamw8bit: paged by the driver, prefetched
// group by group as the step begins each). Checkpoints hold the host AdamW8bit's entries, copied
// through the host, so either backend resumes the other's.
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/state_store.h"
#include "optim/adamw8bit.h"
#include "train/device_adamw.h"

namespace qlft {

namespace {

// adamw8bit's state on the device: each array a zeroed Buffer from Backend::alloc.
class BackendStateStore final : public StateStore {
 public:
  explicit BackendStateStore(Backend& be) : be_(be) {}
  void* allocate(size_t bytes, const char* what) override {
    bufs_.push_back(be_.alloc(MemCategory::Optimizer, bytes, what));
    bytes_ += bytes;
    return bufs_.back().data();
  }
  bool paged() const override { return false; }
  const char* kind() const override { return "device"; }

 private:
  Backend& be_;
  std::vector<Buffer> bufs_;
};

struct TensorState {
  int64_t offset = 0, n = 0, blocks = 0;
  bool quantized = false;
  int ids[4] = {-1, -1, -1, -1};  // the store's arrays: q1 q2 absmax1 absmax2, or m v
  // The checkpoint entries of ids[] (the host AdamW8bit's names), their dtypes and lengths.
  int count() const { return quantized ? 4 : 2; }
  const char* field(int a) const {
    static const char* const q[4] = {".state1", ".state2", ".absmax1", ".absmax2"};
    static const char* const f[2] = {".exp_avg", ".exp_avg_sq"};
    return quantized ? q[a] : f[a];
  }
  DType dtype(int a) const { return quantized && a < 2 ? DType::U8 : DType::F32; }
  int64_t length(int a) const { return quantized && a >= 2 ? blocks : n; }
  size_t bytes(int a) const { return size_t(length(a)) * (dtype(a) == DType::U8 ? 1 : 4); }
};

class DeviceAdamW8bit final : public Optimizer {
 public:
  DeviceAdamW8bit(const OptimSettings& s, std::vector<ParamRef> params, Backend& be, float* w,
                  const float* g, int64_t n, std::unique_ptr<StateStore> store)
      : Optimizer(s, std::move(params)), be_(be), w_(w), g_(g), store_(std::move(store)) {
    int64_t total = 0;
    for (size_t k = 0; k < params_.size(); ++k) {
      TensorState st;
      st.offset = total;
      st.n = static_cast<int64_t>(params_[k].numel);
      st.quantized = adam8bit_quantized(st.n);
      st.blocks = st.quantized ? adam8bit_blocks(st.n) : 0;
      static const char* const what[4] = {"adamw8bit state1 (device)", "adamw8bit state2 (device)",
                                          "adamw8bit absmax1 (device)",
                                          "adamw8bit absmax2 (device)"};
      static const char* const what32[2] = {"adamw8bit exp_avg (device)",
                                            "adamw8bit exp_avg_sq (device)"};
      for (int a = 0; a < st.count(); ++a)
        st.ids[a] =
            store_->add(static_cast<int>(k), st.bytes(a), st.quantized ? what[a] : what32[a]);
      state_.push_back(st);
      total += st.n;
    }
    QLFT_CHECK_ARG(total == n,
                   "device 8-bit AdamW: the parameters hold %lld values, the device copy %lld",
                   static_cast<long long>(total), static_cast<long long>(n));
  }

  // The trainer steps only gradients whose global norm is finite, so no element is skipped here
  // and none is counted (counting would cost the step a device-to-host copy and a wait).
  OptimStepStats step(double lr) override {
    const int64_t t = step_ + 1;
    for (size_t k = 0; k < params_.size(); ++k) {
      const TensorState& st = state_[k];
      const AdamBnbCoeffs c = adam_bnb_coeffs(settings_, lr * params_[k].lr_scale, t);
      store_->begin(static_cast<int>(k), next_group(k));
      float* p = w_ + st.offset;
      const float* g = g_ + st.offset;
      if (st.quantized)
        be_.adamw_bnb8(p, at<uint8_t>(st, 0), at<uint8_t>(st, 1), at<float>(st, 2),
                       at<float>(st, 3), g, st.n, c);
      else
        be_.adamw_bnb32(p, at<float>(st, 0), at<float>(st, 1), g, st.n, c);
      store_->end(static_cast<int>(k), true);
    }
    step_ = t;
    return {};
  }

  uint64_t state_bytes() const override { return store_->bytes(); }

  void save_state(StateDict& out, const std::string& prefix) const override {
    out.put_string(prefix + "type", "adamw8bit");
    out.put_i64(prefix + "step", step_);
    std::vector<uint8_t> host;
    for (size_t k = 0; k < params_.size(); ++k) {
      const TensorState& st = state_[k];
      const std::string base = prefix + params_[k].name;
      for (int a = 0; a < st.count(); ++a) {
        host.resize(st.bytes(a));
        be_.device_memory()->to_host(host.data(), store_->data(st.ids[a]), host.size());
        if (st.dtype(a) == DType::U8)
          out.put_u8(base + st.field(a), host.data(), size_t(st.length(a)));
        else
          out.put_f32(base + st.field(a), reinterpret_cast<const float*>(host.data()),
                      size_t(st.length(a)));
      }
    }
  }

  void load_state(const StateDict& in, const std::string& prefix) override {
    const int64_t step = adamw8bit_checkpoint_step(in, prefix, name());
    // Everything checked before anything changes.
    std::vector<std::vector<const StateTensor*>> src(params_.size());
    for (size_t k = 0; k < params_.size(); ++k) {
      const TensorState& st = state_[k];
      for (int a = 0; a < st.count(); ++a)
        src[k].push_back(
            &in.require(prefix + params_[k].name + st.field(a), st.dtype(a), {st.length(a)}));
    }
    for (size_t k = 0; k < params_.size(); ++k)
      for (int a = 0; a < state_[k].count(); ++a)
        be_.device_memory()->to_device(store_->data(state_[k].ids[a]), src[k][a]->bytes.data(),
                                       src[k][a]->bytes.size());
    step_ = step;
  }

 private:
  int next_group(size_t k) const { return k + 1 < params_.size() ? static_cast<int>(k) + 1 : -1; }
  template <class T>
  T* at(const TensorState& st, int a) const {
    return static_cast<T*>(store_->data(st.ids[a]));
  }

  Backend& be_;
  float* w_;
  const float* g_;
  std::unique_ptr<StateStore> store_;
  std::vector<TensorState> state_;
};

}  // namespace

std::unique_ptr<Optimizer> make_device_adamw8bit(const OptimSettings& s,
                                                 std::vector<ParamRef> params, Backend& be,
                                                 float* w, const float* g, int64_t n) {
  QLFT_CHECK_ARG(be.device_memory() != nullptr, "device 8-bit AdamW: backend %s has no device",
                 be.name());
  std::unique_ptr<StateStore> store;
  if (s.kind == OptimizerKind::PagedAdamW8bit) {
    store = be.managed_state_store();
    if (!store)
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "optim.name=paged_adamw8bit: backend %s has no managed memory", be.name());
  } else {
    QLFT_CHECK_ARG(s.kind == OptimizerKind::AdamW8bit,
                   "device 8-bit AdamW: optim.name is %s, not adamw8bit or paged_adamw8bit",
                   name_of(s.kind));
    store = std::make_unique<BackendStateStore>(be);
  }
  return std::make_unique<DeviceAdamW8bit>(s, std::move(params), be, w, g, n, std::move(store));
}

}  // namespace qlft
