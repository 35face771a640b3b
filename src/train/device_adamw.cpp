#include "train/device_adamw.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "optim/adamw.h"

namespace qlft {

namespace {

class DeviceAdamW final : public Optimizer {
 public:
  DeviceAdamW(const OptimSettings& s, std::vector<ParamRef> params, Backend& be, float* w,
              const float* g, int64_t n, uint16_t* w16)
      : Optimizer(s, std::move(params)), be_(be), w_(w), w16_(w16), g_(g), n_(n) {
    int64_t total = 0;
    for (const ParamRef& p : params_) {
      offset_.push_back(total);
      total += static_cast<int64_t>(p.numel);
    }
    QLFT_CHECK_ARG(total == n,
                   "device AdamW: the parameters hold %lld values, the device copy %lld",
                   static_cast<long long>(total), static_cast<long long>(n));
    m_ = be.alloc(MemCategory::Optimizer, static_cast<size_t>(n) * 4, "adamw exp_avg (device)");
    v_ = be.alloc(MemCategory::Optimizer, static_cast<size_t>(n) * 4, "adamw exp_avg_sq (device)");
  }

  OptimStepStats step(double lr) override {
    const int64_t t = step_ + 1;
    // One launch per run of consecutive parameters with the same lr_scale (one for the whole
    // array without LoRA+; A and B alternate with it).
    for (size_t k = 0; k < params_.size();) {
      size_t e = k + 1;
      while (e < params_.size() && params_[e].lr_scale == params_[k].lr_scale) ++e;
      const int64_t o = offset_[k], n = (e < params_.size() ? offset_[e] : n_) - o;
      const AdamWTorchCoeffs c = adamw_torch_coeffs(settings_, lr * params_[k].lr_scale, t);
      if (w16_)
        be_.adamw_torch_to_16(w_ + o, m_.as<float>() + o, v_.as<float>() + o, g_ + o, n, c,
                              DType::BF16, w16_ + o);
      else
        be_.adamw_torch(w_ + o, m_.as<float>() + o, v_.as<float>() + o, g_ + o, n, c);
      k = e;
    }
    step_ = t;
    return {};
  }

  uint64_t state_bytes() const override { return m_.size() + v_.size(); }

  void save_state(StateDict& out, const std::string& prefix) const override {
    std::vector<float> m(static_cast<size_t>(n_)), v(static_cast<size_t>(n_));
    m_.copy_to_host(m.data(), m.size() * 4);
    v_.copy_to_host(v.data(), v.size() * 4);
    save_adamw_header(out, prefix, step_);
    for (size_t k = 0; k < params_.size(); ++k) {
      const std::string base = prefix + params_[k].name;
      out.put_f32(base + ".exp_avg", m.data() + offset_[k], params_[k].numel);
      out.put_f32(base + ".exp_avg_sq", v.data() + offset_[k], params_[k].numel);
    }
  }

  void load_state(const StateDict& in, const std::string& prefix) override {
    const int64_t step = load_adamw_header(in, prefix);
    std::vector<float> m(static_cast<size_t>(n_)), v(static_cast<size_t>(n_));
    for (size_t k = 0; k < params_.size(); ++k) {  // everything checked before anything changes
      const ParamRef& p = params_[k];
      const std::vector<int64_t> shape{static_cast<int64_t>(p.numel)};
      const StateTensor& a = in.require(prefix + p.name + ".exp_avg", DType::F32, shape);
      const StateTensor& b = in.require(prefix + p.name + ".exp_avg_sq", DType::F32, shape);
      std::memcpy(m.data() + offset_[k], a.bytes.data(), a.bytes.size());
      std::memcpy(v.data() + offset_[k], b.bytes.data(), b.bytes.size());
    }
    m_.copy_from_host(m.data(), m.size() * 4);
    v_.copy_from_host(v.data(), v.size() * 4);
    step_ = step;
  }

 private:
  Backend& be_;
  float* w_;
  uint16_t* w16_;  // w's bf16 copy, or null
  const float* g_;
  int64_t n_;
  std::vector<int64_t> offset_;
  Buffer m_, v_;
};

}  // namespace

std::unique_ptr<Optimizer> make_device_adamw(const OptimSettings& s, std::vector<ParamRef> params,
                                             Backend& be, float* w, const float* g, int64_t n,
                                             uint16_t* w16) {
  return std::make_unique<DeviceAdamW>(s, std::move(params), be, w, g, n, w16);
}

bool device_unscale_and_check(Backend& be, float* g, int64_t n, float scale) {
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale));  // as LossScaler
  const bool found = be.count_nonfinite(g, n) > 0;
  if (inv != 1.0f) be.scale(g, n, inv);
  return found;
}

ClipResult device_clip_grad_norm(Backend& be, float* g, int64_t n, double max_norm) {
  const ClipResult r = clip_rule(std::sqrt(be.sum_squares(g, n)), max_norm);
  if (r.clipped) be.scale(g, n, static_cast<float>(r.coef));
  return r;
}

}  // namespace qlft
