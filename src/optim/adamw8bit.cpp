#include "optim/adamw8bit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "backend/adamw_math.h"
#include "core/state_store.h"
#include "quant/blockwise8.h"
#include "core/threads.h"

namespace qlft {

namespace {

struct ParamState {
  bool quantized = false;
  int64_t n = 0, blocks = 0;
  float* m32 = nullptr;  // fp32 path
  float* v32 = nullptr;
  uint8_t* q1 = nullptr;  // 8-bit path: codes of m (signed map) and v (unsigned map)
  uint8_t* q2 = nullptr;
  float* absmax1 = nullptr;
  float* absmax2 = nullptr;
  int ids[4] = {-1, -1, -1, -1};  // the store's arrays: q1 q2 absmax1 absmax2, or m32 v32
};

class AdamW8bit final : public Optimizer {
 public:
  AdamW8bit(const OptimSettings& s, std::vector<ParamRef> params, std::unique_ptr<StateStore> store)
      : Optimizer(s, std::move(params)),
        store_(std::move(store)),
        qm_(create_dynamic_map(true)),
        qv_(create_dynamic_map(false)) {
    // One state group per parameter, in step order.
    for (size_t k = 0; k < params_.size(); ++k) {
      const ParamRef& p = params_[k];
      const int g = static_cast<int>(k);
      ParamState st;
      st.n = static_cast<int64_t>(p.numel);
      st.quantized = st.n >= kAdam8bitMinElements;
      if (st.quantized) {
        st.blocks = (st.n + kAdam8bitBlock - 1) / kAdam8bitBlock;
        st.ids[0] = store_->add(g, p.numel, "adamw8bit state1");
        st.ids[1] = store_->add(g, p.numel, "adamw8bit state2");
        st.ids[2] = store_->add(g, st.blocks * sizeof(float), "adamw8bit absmax1");
        st.ids[3] = store_->add(g, st.blocks * sizeof(float), "adamw8bit absmax2");
      } else {
        st.ids[0] = store_->add(g, p.numel * sizeof(float), "adamw8bit exp_avg");
        st.ids[1] = store_->add(g, p.numel * sizeof(float), "adamw8bit exp_avg_sq");
      }
      state_.push_back(st);
    }
  }

  OptimStepStats step(double lr) override {
    const int64_t t = step_ + 1;
    QLFT_CHECK_ARG(std::isfinite(lr) && lr >= 0,
                   "optimizer step: lr must be a finite number >= 0, got %g", lr);

    OptimStepStats stats;
    for (size_t k = 0; k < params_.size(); ++k) {
      const ParamRef& p = params_[k];
      const AdamBnbCoeffs c = adam_bnb_coeffs(settings_, lr * p.lr_scale, t);
      const ParamState st = begin(k);
      int64_t skipped = 0;
      if (!st.quantized) {
        for (int64_t i = 0; i < st.n; ++i)
          skipped += !adam_bnb_32bit_update(p.data[i], st.m32[i], st.v32[i], p.grad[i], c);
      } else {
        const int nt = qlft::num_threads();
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : skipped) if (st.blocks >= 64)
        for (int64_t b = 0; b < st.blocks; ++b) skipped += step_block(p, st, b, c);
      }
      store_->end(static_cast<int>(k), true);
      stats.skipped_elements += skipped;
    }
    step_ = t;
    return stats;
  }

  uint64_t state_bytes() const override {
    return store_->bytes();
  }

  void save_state(StateDict& out, const std::string& prefix) const override {
    out.put_string(prefix + "type", "adamw8bit");
    out.put_i64(prefix + "step", step_);
    for (size_t k = 0; k < params_.size(); ++k) {
      const ParamState st = begin(k);
      const std::string base = prefix + params_[k].name;
      if (st.quantized) {
        out.put_u8(base + ".state1", st.q1, st.n);
        out.put_u8(base + ".state2", st.q2, st.n);
        out.put_f32(base + ".absmax1", st.absmax1, st.blocks);
        out.put_f32(base + ".absmax2", st.absmax2, st.blocks);
      } else {
        out.put_f32(base + ".exp_avg", st.m32, st.n);
        out.put_f32(base + ".exp_avg_sq", st.v32, st.n);
      }
      store_->end(static_cast<int>(k), false);
    }
  }

  void load_state(const StateDict& in, const std::string& prefix) override {
    const int64_t step = adamw8bit_checkpoint_step(in, prefix, name());
    // Validate all, then copy: a failure changes nothing.
    // The source of each of the group's arrays (ids[] order).
    std::vector<std::vector<const StateTensor*>> src(params_.size());
    for (size_t k = 0; k < params_.size(); ++k) {
      const ParamState& st = state_[k];
      const std::string base = prefix + params_[k].name;
      const std::vector<int64_t> n{st.n}, nb{st.blocks};
      if (st.quantized) {
        src[k] = {&in.require(base + ".state1", DType::U8, n),
                  &in.require(base + ".state2", DType::U8, n),
                  &in.require(base + ".absmax1", DType::F32, nb),
                  &in.require(base + ".absmax2", DType::F32, nb)};
      } else {
        src[k] = {&in.require(base + ".exp_avg", DType::F32, n),
                  &in.require(base + ".exp_avg_sq", DType::F32, n)};
      }
    }
    for (size_t k = 0; k < params_.size(); ++k) {
      store_->begin(static_cast<int>(k), next_group(k));
      for (size_t a = 0; a < src[k].size(); ++a)
        std::memcpy(store_->data(state_[k].ids[a]), src[k][a]->bytes.data(),
                    src[k][a]->bytes.size());
      store_->end(static_cast<int>(k), true);
    }
    step_ = step;
  }

 private:
  int next_group(size_t k) const {
    return k + 1 < params_.size() ? static_cast<int>(k) + 1 : -1;
  }

  // Begins parameter k's state group and returns its state with the pointers filled in (valid
  // until store_->end(k)).
  ParamState begin(size_t k) const {
    store_->begin(static_cast<int>(k), next_group(k));
    ParamState st = state_[k];
    auto at = [&](int i) { return store_->data(st.ids[i]); };
    if (st.quantized) {
      st.q1 = static_cast<uint8_t*>(at(0));
      st.q2 = static_cast<uint8_t*>(at(1));
      st.absmax1 = static_cast<float*>(at(2));
      st.absmax2 = static_cast<float*>(at(3));
    } else {
      st.m32 = static_cast<float*>(at(0));
      st.v32 = static_cast<float*>(at(1));
    }
    return st;
  }

  // Dequantize -> update -> requantize one block of 256 (bnb's order); returns the number of
  // elements skipped for a non-finite gradient.
  int64_t step_block(const ParamRef& p, const ParamState& st, int64_t b,
                     const AdamBnbCoeffs& c) const {
    const int64_t s = b * kAdam8bitBlock, len = std::min(kAdam8bitBlock, st.n - s);
    float m[kAdam8bitBlock], v[kAdam8bitBlock];
    dequantize_blockwise8(qm_.code(), st.q1 + s, st.absmax1 + b, len, kAdam8bitBlock, m);
    dequantize_blockwise8(qv_.code(), st.q2 + s, st.absmax2 + b, len, kAdam8bitBlock, v);
    int64_t skipped = 0;
    for (int64_t i = 0; i < len; ++i)
      skipped += !adam_bnb_8bit_update(p.data[s + i], m[i], v[i], p.grad[s + i], c);
    st.absmax1[b] = qm_.quantize_block(m, len, st.q1 + s);
    st.absmax2[b] = qv_.quantize_block(v, len, st.q2 + s);
    return skipped;
  }

  std::unique_ptr<StateStore> store_;
  Blockwise8Quantizer qm_, qv_;
  std::vector<ParamState> state_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw8bit(const OptimSettings& s, std::vector<ParamRef> params,
                                          std::unique_ptr<StateStore> store) {
  return std::make_unique<AdamW8bit>(s, std::move(params), std::move(store));
}

}  // namespace qlft
