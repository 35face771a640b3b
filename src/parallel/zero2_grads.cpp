#include "parallel/zero2_grads.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "parallel/data_parallel.h"

namespace qlft::dist {

Zero2Grads::Zero2Grads(LoraAdapter& lora, Communicator& comm, std::vector<int> owner_a,
                       std::vector<int> owner_b, MemoryTracker* tracker)
    : lora_(lora), comm_(comm), rank_(comm.rank()) {
  const size_t n = static_cast<size_t>(lora.n_layers()) * kProjCount;
  QLFT_CHECK_ARG(owner_a.size() == n && owner_b.size() == n,
                 "ZeRO-2 gradients: %zu / %zu owners for %zu projections", owner_a.size(),
                 owner_b.size(), n);
  projs_.resize(n);
  int64_t largest = 0;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int q = 0; q < kProjCount; ++q) {
      const Proj p = static_cast<Proj>(q);
      if (!lora.active(l, p)) continue;
      const size_t i = static_cast<size_t>(l) * kProjCount + q;
      Proj_& e = projs_[i];
      e.a = lora.a_size(l, p);
      e.b = lora.b_size(l, p);
      e.owner_a = owner_a[i];
      e.owner_b = owner_b[i];
      // The shard is the adapter's own dA / dB of the owned tensors (const access: no host-write
      // count; the buffers never move).
      const LoraSlot& s = static_cast<const LoraAdapter&>(lora).slot(l, p);
      QLFT_CHECK_ARG(s.dA.empty() != (e.owner_a == rank_) && s.dB.empty() != (e.owner_b == rank_),
                     "ZeRO-2 gradients: layer %d %s: the adapter's gradients are not this rank's "
                     "share",
                     l, proj_peft_name(p));
      if (e.owner_a == rank_) e.shard_a = const_cast<float*>(s.dA.as<float>());
      if (e.owner_b == rank_) e.shard_b = const_cast<float*>(s.dB.as<float>());
      largest = std::max(largest, e.a + e.b);
    }
  if (largest > 0)
    bucket_ = Buffer(tracker, MemCategory::Communication, static_cast<size_t>(largest) * 4,
                     "ZeRO-2 gradient reduce bucket", BufferInit::Uninit);
}

LoraGradTarget Zero2Grads::begin(int layer, Proj p) {
  const Proj_& e = at(layer, p);
  float* f = bucket_.as<float>();
  std::memset(f, 0, static_cast<size_t>(e.a + e.b) * 4);
  return {f, f + e.a};
}

void Zero2Grads::end(int layer, Proj p) {
  const Proj_& e = at(layer, p);
  float* f = bucket_.as<float>();
  // To the owners only: one reduce when one rank owns A and B, else one per tensor. (The
  // others' bucket is left unspecified; they do not read it.)
  if (comm_.world() > 1 && e.owner_a == e.owner_b) {
    comm_.reduce(f, static_cast<size_t>(e.a + e.b), e.owner_a, ReduceOp::Sum);
  } else if (comm_.world() > 1) {
    comm_.reduce(f, static_cast<size_t>(e.a), e.owner_a, ReduceOp::Sum);
    comm_.reduce(f + e.a, static_cast<size_t>(e.b), e.owner_b, ReduceOp::Sum);
  }
  if (e.shard_a)
    for (int64_t i = 0; i < e.a; ++i) e.shard_a[i] += f[i];
  if (e.shard_b)
    for (int64_t i = 0; i < e.b; ++i) e.shard_b[i] += f[e.a + i];
}

void Zero2Grads::replay_layer(int layer) {
  for (Proj p : kBackwardProjOrder) {
    if (!lora_.active(layer, p)) continue;
    begin(layer, p);
    end(layer, p);
  }
}

void Zero2Grads::replay_pass() {
  for (int l = lora_.n_layers() - 1; l >= 0; --l) replay_layer(l);
}

std::unique_ptr<Zero2Grads> allocate_lora_gradients(LoraAdapter& lora, DataParallel& dp, bool shard,
                                                    MemoryTracker* tracker) {
  const int L = lora.n_layers();
  std::vector<int> owner_a(static_cast<size_t>(L) * kProjCount, -1), owner_b = owner_a;
  size_t i = 0;
  for (int l = 0; l < L; ++l)
    for (int p = 0; p < kProjCount; ++p) {
      if (!lora.active(l, static_cast<Proj>(p))) continue;
      QLFT_CHECK_ARG(i + 1 < dp.params().size(), "ZeRO gradients: more LoRA tensors than params");
      const Proj first = lora.module(static_cast<Proj>(p)).first;  // a fused module's A: once
      owner_a[static_cast<size_t>(l) * kProjCount + p] =
          first != static_cast<Proj>(p)
              ? owner_a[static_cast<size_t>(l) * kProjCount + static_cast<size_t>(first)]
              : dp.owner(i++);
      owner_b[static_cast<size_t>(l) * kProjCount + p] = dp.owner(i++);
      if (lora.config().use_dora) {  // (DoRA's magnitude: one rank, unsharded, with B)
        QLFT_CHECK_ARG(!shard, "ZeRO gradients: DoRA's magnitude is not sharded");
        ++i;
      }
    }
  const size_t moe_first = i;  // an MoE layer's expert / router LoRA after the projections'
  for (int l = 0; l < L; ++l)
    for (int p = 0; p < kMoePartCount; ++p)
      if (lora.moe_active(l, MoePart(p))) i += 2;
  QLFT_CHECK_ARG(i == dp.params().size(), "ZeRO gradients: %zu LoRA tensors, %zu params", i,
                 dp.params().size());
  QLFT_CHECK_ARG(!shard || moe_first == i,
                 "ZeRO-2/3 sharded gradients do not carry the experts' / router's LoRA "
                 "(lora.target_modules w1 / w2 / w3 / gate): use dist.zero_stage 0 or 1");
  const int me = dp.rank();
  lora.allocate_gradients([&](int l, Proj p, bool b) {
    const size_t k = static_cast<size_t>(l) * kProjCount + static_cast<size_t>(p);
    return !shard || (b ? owner_b : owner_a)[k] == me;
  });
  i = 0;
  const LoraAdapter& cl = lora;  // (const: reading the slots is no host write)
  for (int l = 0; l < L; ++l)
    for (int p = 0; p < kProjCount; ++p) {
      if (!cl.active(l, static_cast<Proj>(p))) continue;
      const LoraSlot& s = cl.slot(l, static_cast<Proj>(p));
      if (!s.shares_a)
        dp.set_grad(i++, s.dA.empty() ? nullptr : const_cast<float*>(s.dA.as<float>()));
      dp.set_grad(i++, s.dB.empty() ? nullptr : const_cast<float*>(s.dB.as<float>()));
      if (cl.config().use_dora) dp.set_grad(i++, const_cast<float*>(s.dM.as<float>()));
    }
  for (int l = 0; l < L; ++l)
    for (int p = 0; p < kMoePartCount; ++p) {
      if (!cl.moe_active(l, MoePart(p))) continue;
      const MoeLoraSlot& s = cl.moe_slot(l, MoePart(p));
      dp.set_grad(i++, const_cast<float*>(s.dA.as<float>()));
      dp.set_grad(i++, const_cast<float*>(s.dB.as<float>()));
    }
  if (!shard) return nullptr;
  return std::make_unique<Zero2Grads>(lora, dp.comm(), std::move(owner_a), std::move(owner_b),
                                      tracker);
}

}  // namespace qlft::dist
