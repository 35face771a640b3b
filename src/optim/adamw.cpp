#include "optim/adamw.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "backend/adamw_math.h"
#include "core/state_store.h"
#include "core/threads.h"

namespace qlft {

namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimSettings& s, std::vector<ParamRef> params, std::unique_ptr<StateStore> store)
      : Optimizer(s, std::move(params)), store_(std::move(store)) {
    // One state group per parameter (m then v), in step order.
    for (size_t k = 0; k < params_.size(); ++k) {
      const size_t bytes = params_[k].numel * sizeof(float);
      m_.push_back(store_->add(static_cast<int>(k), bytes, "adamw exp_avg"));
      v_.push_back(store_->add(static_cast<int>(k), bytes, "adamw exp_avg_sq"));
    }
  }

  OptimStepStats step(double lr) override {
    const int64_t t = step_ + 1;
    for (size_t k = 0; k < params_.size(); ++k) {
      const ParamRef& p = params_[k];
      const AdamWTorchCoeffs c = adamw_torch_coeffs(settings_, lr * p.lr_scale, t);
      store_->begin(static_cast<int>(k), next_group(k));
      float* m = static_cast<float*>(store_->data(m_[k]));
      float* v = static_cast<float*>(store_->data(v_[k]));
      const int64_t n = static_cast<int64_t>(p.numel);
      float* const w = p.data;  // (locals: through p the loop would reload them per element)
      const float* const g = p.grad;
      // simd: at -O2 GCC vectorizes no loop that needs an alias check (and this one only with
      // CMakeLists.txt's -fno-math-errno -fno-trapping-math for this file).
#pragma omp parallel for simd num_threads(qlft::num_threads()) schedule(static) if (n >= (1 << 16))
      for (int64_t i = 0; i < n; ++i) adamw_torch_update(w[i], m[i], v[i], g[i], c);
      store_->end(static_cast<int>(k), true);
    }
    step_ = t;
    return {};
  }

  uint64_t state_bytes() const override {
    return store_->bytes();  // as the tracker counts it
  }

  void save_state(StateDict& out, const std::string& prefix) const override {
    save_adamw_header(out, prefix, step_);
    for (size_t k = 0; k < params_.size(); ++k) {
      const std::string base = prefix + params_[k].name;
      store_->begin(static_cast<int>(k), next_group(k));
      out.put_f32(base + ".exp_avg", static_cast<const float*>(store_->data(m_[k])),
                  params_[k].numel);
      out.put_f32(base + ".exp_avg_sq", static_cast<const float*>(store_->data(v_[k])),
                  params_[k].numel);
      store_->end(static_cast<int>(k), false);
    }
  }

  void load_state(const StateDict& in, const std::string& prefix) override {
    const int64_t step = load_adamw_header(in, prefix);
    std::vector<const StateTensor*> src;
    for (const ParamRef& p : params_) {
      const std::vector<int64_t> shape{static_cast<int64_t>(p.numel)};
      src.push_back(&in.require(prefix + p.name + ".exp_avg", DType::F32, shape));
      src.push_back(&in.require(prefix + p.name + ".exp_avg_sq", DType::F32, shape));
    }
    for (size_t k = 0; k < params_.size(); ++k) {
      store_->begin(static_cast<int>(k), next_group(k));
      std::memcpy(store_->data(m_[k]), src[2 * k]->bytes.data(), src[2 * k]->bytes.size());
      std::memcpy(store_->data(v_[k]), src[2 * k + 1]->bytes.data(), src[2 * k + 1]->bytes.size());
      store_->end(static_cast<int>(k), true);
    }
    step_ = step;
  }

 private:
  int next_group(size_t k) const {
    return k + 1 < params_.size() ? static_cast<int>(k) + 1 : -1;
  }

  // Mutable through const save_state(): reading a group back is not a change of state.
  std::unique_ptr<StateStore> store_;
  std::vector<int> m_, v_;  // the store's array ids
};

}  // namespace

void save_adamw_header(StateDict& out, const std::string& prefix, int64_t step) {
  out.put_string(prefix + "type", "adamw");
  out.put_i64(prefix + "step", step);
}

int64_t load_adamw_header(const StateDict& in, const std::string& prefix) {
  const std::string type = in.get_string(prefix + "type");
  if (type != "adamw")
    throw_error(QLFT_ERR_FORMAT,
                "checkpoint state: '%stype' is '%s' but the optimizer is adamw (optim.name)",
                prefix.c_str(), type.c_str());
  const int64_t step = in.get_i64(prefix + "step");
  QLFT_CHECK_FORMAT(step >= 0, "checkpoint state: '%sstep' is negative (%lld)", prefix.c_str(),
                    static_cast<long long>(step));
  return step;
}

AdamWTorchCoeffs adamw_torch_coeffs(const OptimSettings& s, double lr, int64_t t) {
  QLFT_CHECK_ARG(std::isfinite(lr) && lr >= 0,
                 "optimizer step: lr must be a finite number >= 0, got %g", lr);
  // The scalars as torch computes them in Python (double), then as float tensor operands.
  AdamWTorchCoeffs c;
  c.decay = s.weight_decay != 0 ? static_cast<float>(1.0 - lr * s.weight_decay) : 1.0f;
  c.w1 = static_cast<float>(1.0 - s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.one_m_beta2 = static_cast<float>(1.0 - s.beta2);
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(t));
  c.bc2_sqrt = static_cast<float>(std::pow(bc2, 0.5));
  c.eps = static_cast<float>(s.eps);
  c.neg_step_size = static_cast<float>(-(lr / bc1));
  return c;
}

std::unique_ptr<Optimizer> make_adamw(const OptimSettings& s, std::vector<ParamRef> params,
                                      std::unique_ptr<StateStore> store) {
  return std::make_unique<AdamW>(s, std::move(params), std::move(store));
}

}  // namespace qlft
