// LlamaRunner: the LoRA adapter as the kernels see it, and its device copy (one buffer of
// every A and B, one of their gradients) kept in step with the host adapter.
#include "model/llama.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/dropout.h"
#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "model/llama_internal.h"

namespace qlft {

using namespace runner_detail;

LoraRef LlamaRunner::lora_ref(int l, Proj p, bool* has) const {
  *has = lora_ && lora_on_ && lora_->active(l, p);
  if (!*has) return LoraRef{};
  // A fused module's parts (phi3's q / k / v, gate / up) share A and so its input's dropout mask.
  const Proj mp = lora_->module(p).first;
  LoraRef r;
  if (!lora_w_.empty()) {  // the device copy (no host access: it may be stale)
    const std::array<int64_t, 2>& o = lora_off_[static_cast<size_t>(l * kProjCount + int(p))];
    r.A = lora_w_.as<float>() + o[0];
    r.B = lora_w_.as<float>() + o[1];
    r.r = lora_->config().r;
    r.scale = lora_->config().scale();
    r.dropout_p = lora_->config().dropout;
    r.dropout_seed = proj_seed(dropout_seed_, l, mp);
    if (lora16_current_) {  // (kept beside lora_w_ at the same offsets)
      r.A16 = lora_w16_.as<uint16_t>() + o[0];
      r.B16 = lora_w16_.as<uint16_t>() + o[1];
    }
  } else {
    r = lora_->ref(l, p, proj_seed(dropout_seed_, l, mp));
  }
  if (!training_) r.dropout_p = 0.f;  // inference: dropout is the identity
  return r;
}

bool LlamaRunner::moe_lora_of(int l, bool gradients, MoeLora* out) const {
  if (!lora_ || !lora_on_ || !lora_->has_moe()) return false;
  bool any = false;
  for (int p = 0; p < kMoePartCount; ++p) any |= lora_->moe_active(l, MoePart(p));
  if (!any) return false;
  QLFT_CHECK_ARG(!sink_,
                 "a LoRA gradient sink (ZeRO-2 sharded gradients) does not carry the experts' / "
                 "router's LoRA (lora.target_modules w1 / w2 / w3 / gate)");
  if (lora_w_.empty()) {  // a host backend: the adapter's own buffers
    *out = lora_->moe_lora(l, gradients);
    return true;
  }
  // The device copies (LlamaRunner::lora_to_device), shaped as the adapter's slots.
  MoeLoraPart* parts[kMoePartCount] = {&out->gate_up, &out->down, &out->router};
  for (int p = 0; p < kMoePartCount; ++p) {
    *parts[p] = MoeLoraPart{};
    const std::array<int64_t, 2>& o = moe_off_[size_t(l * kMoePartCount + p)];
    if (o[0] < 0) continue;
    const MoeLoraSlot s = moe_lora_shape(lora_->model_shapes(), lora_->config(), l, MoePart(p));
    float* g = gradients ? const_cast<Buffer&>(lora_g_).as<float>() : nullptr;
    *parts[p] = MoeLoraPart{lora_w_.as<float>() + o[0],
                            lora_w_.as<float>() + o[1],
                            g ? g + o[0] : nullptr,
                            g ? g + o[1] : nullptr,
                            s.r,
                            s.scale};
  }
  return true;
}

void LlamaRunner::keep_lora_on_device() {
  if (!lora_ || !be_.device_memory()) return;
  lora_resident_ = true;
  lora_to_device();
  lora16_refresh();  // (made now, so the device optimizer can write it)
}

void LlamaRunner::lora16_refresh() {
  const bool keep = !lora_w_.empty() && act_dtype_ == DType::BF16 && be_.takes_xa_16(DType::BF16);
  if (!keep) {
    lora_w16_ = Buffer();
    lora16_current_ = false;
    return;
  }
  if (lora16_current_ && lora_w16_.size() * 2 == lora_w_.size()) return;
  if (lora_w16_.size() * 2 != lora_w_.size())
    lora_w16_ = be_.alloc(MemCategory::Adapter, lora_w_.size() / 2, "lora A/B (device, bf16)",
                          BufferInit::Uninit);
  be_.to_16(DType::BF16, lora_w_.as<float>(), lora_w16_.as<uint16_t>(),
            static_cast<int64_t>(lora_w_.size() / 4));
  lora16_current_ = true;
}

void LlamaRunner::zero_lora_grads() {
  if (lora_resident_ && !lora_g_.empty()) {
    // The device copy takes the host's writes first: once the hook below is set, the device
    // holds the newest values of everything (a host write clears the hook by refreshing).
    lora_to_device();
    lora_g_.zero();
    lora_->set_host_stale([this] { lora_device_to_host(); });
  } else if (lora_) {
    lora_->zero_grad();
  }
}

void LlamaRunner::set_grad_sink(LoraGradSink* sink) {
  QLFT_CHECK_ARG(!sink || !extras_,
                 "a LoRA gradient sink (ZeRO-2 sharded gradients) does not carry DoRA's magnitude "
                 "or a PiSSA / OLoRA start");
  QLFT_CHECK_ARG(!sink || !be_.device_memory(),
                 "a LoRA gradient sink takes host arrays; the %s backend keeps its gradients on "
                 "the device",
                 be_.name());
  sink_ = sink;
}

template <class F>
void LlamaRunner::each_lora_slot(const F& f) {
  for (int l = 0; l < lora_->n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p)
      if (lora_->active(l, static_cast<Proj>(p)))
        f(lora_->slot(l, static_cast<Proj>(p)), lora_off_[static_cast<size_t>(l * kProjCount + p)]);
}

template <class F>
void LlamaRunner::each_moe_slot(const F& f) {
  for (int l = 0; l < lora_->n_layers(); ++l)
    for (int p = 0; p < kMoePartCount; ++p)
      if (lora_->moe_active(l, MoePart(p)))
        f(lora_->moe_slot_rw(l, MoePart(p)), moe_off_[static_cast<size_t>(l * kMoePartCount + p)]);
}

void LlamaRunner::lora_device_to_host() {
  std::vector<float> w(lora_w_.size() / 4), g(lora_g_.size() / 4);
  lora_w_.copy_to_host(w.data(), lora_w_.size());
  lora_g_.copy_to_host(g.data(), lora_g_.size());
  each_lora_slot([&](LoraSlot& s, const std::array<int64_t, 2>& o) {
    std::memcpy(s.A.data(), w.data() + o[0], s.A.size());
    std::memcpy(s.B.data(), w.data() + o[1], s.B.size());
    std::memcpy(s.dA.data(), g.data() + o[0], s.dA.size());
    std::memcpy(s.dB.data(), g.data() + o[1], s.dB.size());
  });
  each_moe_slot([&](MoeLoraSlot& s, const std::array<int64_t, 2>& o) {
    std::memcpy(s.A.data(), w.data() + o[0], s.A.size());
    std::memcpy(s.B.data(), w.data() + o[1], s.B.size());
    std::memcpy(s.dA.data(), g.data() + o[0], s.dA.size());
    std::memcpy(s.dB.data(), g.data() + o[1], s.dB.size());
  });
  lora_copied_at_ = lora_->host_writes();  // the host now equals the device copy
}

void LlamaRunner::lora_to_device() {
  if (!lora_ || !be_.device_memory()) return;
  if (lora_resident_ && !lora_w_.empty() && lora_copied_at_ == lora_->host_writes()) return;
  const LoraAdapter& lora = *lora_;  // reads only (the const slot() counts no write)
  const int L = lora.n_layers();
  std::vector<float> host;
  lora_off_.assign(static_cast<size_t>(L) * kProjCount, {0, 0});
  for (int l = 0; l < L; ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const LoraSlot& s = lora.slot(l, static_cast<Proj>(p));
      if (!s.active()) continue;
      std::array<int64_t, 2>& o = lora_off_[static_cast<size_t>(l * kProjCount + p)];
      o[0] = static_cast<int64_t>(host.size());
      if (s.shares_a)  // a fused module's later part: its first part's A (and dA) on the device
        o[0] = lora_off_[static_cast<size_t>(l * kProjCount) +
                         static_cast<size_t>(lora.module(static_cast<Proj>(p)).first)][0];
      else
        host.insert(host.end(), s.A.as<float>(), s.A.as<float>() + s.A.size() / 4);
      o[1] = static_cast<int64_t>(host.size());
      host.insert(host.end(), s.B.as<float>(), s.B.as<float>() + s.B.size() / 4);
    }
  // The MoE layers' expert / router factors after them, A then B (the Trainer's parameter order).
  moe_off_.assign(static_cast<size_t>(L) * kMoePartCount, {-1, -1});
  for (int l = 0; l < L; ++l)
    for (int p = 0; p < kMoePartCount; ++p) {
      if (!lora.moe_active(l, MoePart(p))) continue;
      const MoeLoraSlot& s = lora.moe_slot(l, MoePart(p));
      std::array<int64_t, 2>& o = moe_off_[static_cast<size_t>(l * kMoePartCount + p)];
      o[0] = static_cast<int64_t>(host.size());
      host.insert(host.end(), s.A.as<float>(), s.A.as<float>() + s.a_n());
      o[1] = static_cast<int64_t>(host.size());
      host.insert(host.end(), s.B.as<float>(), s.B.as<float>() + s.b_n());
    }
  if (host.empty()) return;
  const size_t bytes = host.size() * 4;
  if (lora_w_.size() != bytes) {
    lora_w_ = be_.alloc(MemCategory::Adapter, bytes, "lora A/B (device copy)", BufferInit::Uninit);
    lora_g_ = be_.alloc(MemCategory::Gradients, bytes, "lora dA/dB (device)");
  }
  lora_w_.copy_from_host(host.data(), bytes);
  lora16_current_ = false;  // (lora16_refresh converts it)
  lora_copied_at_ = lora_->host_writes();
}

void LlamaRunner::lora_grads_to_host() {
  if (lora_g_.empty()) return;
  if (lora_resident_) {  // they stay on the device; a host read copies them out
    lora_->set_host_stale([this] { lora_device_to_host(); });
    return;
  }
  std::vector<float> g(lora_g_.size() / 4);
  lora_g_.copy_to_host(g.data(), lora_g_.size());
  lora_g_.zero();
  each_lora_slot([&](LoraSlot& s, const std::array<int64_t, 2>& o) {
    float* dA = s.dA.as<float>();
    float* dB = s.dB.as<float>();
    if (!s.shares_a)  // (a fused module's dA once)
      for (size_t i = 0; i < s.dA.size() / 4; ++i) dA[i] += g[size_t(o[0]) + i];
    for (size_t i = 0; i < s.dB.size() / 4; ++i) dB[i] += g[size_t(o[1]) + i];
  });
  each_moe_slot([&](MoeLoraSlot& s, const std::array<int64_t, 2>& o) {
    for (int64_t i = 0; i < s.a_n(); ++i) s.dA.as<float>()[i] += g[size_t(o[0] + i)];
    for (int64_t i = 0; i < s.b_n(); ++i) s.dB.as<float>()[i] += g[size_t(o[1] + i)];
  });
}

}  // namespace qlft
