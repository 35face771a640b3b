#include "model/lora.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "arch/families.h"
#include "backend/dropout.h"
#include "core/error.h"

namespace qlft {

float LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r);
}

namespace {

// PEFT 0.21's names for an MoE layer's experts and router (transformers 5 fuses the experts into
// 3-D parameters, which PEFT adapts through target_parameters and ParamWrapper; its
// _MOE_TARGET_MODULE_MAPPING turns Mixtral's w1 / w3 into experts.gate_up_proj with rank 2r and
// alpha 2 alpha, w2 into experts.down_proj and gate into the router's gate.weight; Qwen2/3-MoE's
// gate_proj / up_proj / down_proj likewise), and those parameters' own names: the projection they
// stand for (on an MoE layer gate / up / down are the experts'), Proj count for the router.
int moe_target(const std::string& item) {
  std::string leaf = item;
  for (const char* prefix : {"mlp.", "block_sparse_moe."})
    if (leaf.rfind(prefix, 0) == 0) leaf = leaf.substr(std::strlen(prefix));
  if (leaf == "w1") return static_cast<int>(Proj::Gate);
  if (leaf == "w3") return static_cast<int>(Proj::Up);
  if (leaf == "w2" || leaf == "experts.down_proj") return static_cast<int>(Proj::Down);
  if (leaf == "gate" || leaf == "gate.weight") return kProjCount;
  if (leaf == "experts.gate_up_proj") return kProjCount + 1;  // gate and up
  return -1;
}

}  // namespace

void LoraConfig::set_targets(const std::string& list) {
  bool t[kProjCount] = {}, rt = false;
  std::stringstream ss(list);
  std::string item;
  bool any = false;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    item = item.substr(b, e - b + 1);
    bool found = false;
    if (const int m = moe_target(item); m >= 0) {
      found = true;
      if (m == kProjCount) rt = true;
      if (m < kProjCount) t[m] = true;
      if (m == kProjCount + 1) t[int(Proj::Gate)] = t[int(Proj::Up)] = true;
    }
    for (int p = 0; p < kProjCount; ++p)
      if (item == proj_peft_name(static_cast<Proj>(p)) ||
          item == proj_gguf_name(static_cast<Proj>(p)))
        found = t[p] = true;
    for (Proj first : {Proj::Q, Proj::Gate})  // a fused family's module names
      if (const LoraModule m = lora_module(true, first); item == m.peft)
        for (Proj part : m.parts) found = t[static_cast<int>(part)] = true;
    QLFT_CHECK_ARG(found,
                   "lora.target_modules: '%s' is not one of q_proj, k_proj, v_proj, o_proj, "
                   "gate_proj, up_proj, down_proj (or a fused model's qkv_proj, gate_up_proj)",
                   item.c_str());
    any = true;
  }
  QLFT_CHECK_ARG(any, "lora.target_modules must name at least one projection");
  std::memcpy(targets, t, sizeof(t));
  router = rt;
}

std::string LoraConfig::targets_string() const {
  std::string s;
  for (int p = 0; p < kProjCount; ++p)
    if (targets[p]) s += std::string(s.empty() ? "" : ",") + proj_peft_name(static_cast<Proj>(p));
  if (router) s += std::string(s.empty() ? "" : ",") + "gate";
  return s;
}

LoraModule lora_module(bool fused, Proj p) {
  if (fused && (p == Proj::Q || p == Proj::K || p == Proj::V))
    return {Proj::Q, {Proj::Q, Proj::K, Proj::V}, "qkv_proj", "attn_qkv"};
  // llama.cpp's phi3 ffn_up holds gate's rows, then up's (as gate_up_proj).
  if (fused && (p == Proj::Gate || p == Proj::Up))
    return {Proj::Gate, {Proj::Gate, Proj::Up}, "gate_up_proj", "ffn_up"};
  return {p, {p}, proj_peft_name(p), proj_gguf_name(p)};
}

LoraConfig lora_config_from(const LoraSpec& s) {
  LoraConfig l;
  static_cast<LoraHyperparams&>(l) = s;
  std::string list;
  for (const std::string& t : s.target_modules) list += t + ",";
  l.set_targets(list);
  l.init_seed = s.seed;
  return l;
}

namespace {
// The buffers of one kind a slot holds: its values (A, B and DoRA's magnitude M, the adapter's
// memory) or their gradients (dA, dB, dM).
struct SlotKind {
  Buffer LoraSlot::*a;
  Buffer LoraSlot::*b;
  Buffer LoraSlot::*m;
  MemCategory category;
  const char *a_name, *b_name, *m_name;
  const char* what;  // "values" / "gradients" (allocate_values / allocate_gradients)
};
const SlotKind kValues{&LoraSlot::A, &LoraSlot::B, &LoraSlot::M,     MemCategory::Adapter,
                       "lora A",     "lora B",     "dora magnitude", "values"};
const SlotKind kGradients{&LoraSlot::dA, &LoraSlot::dB, &LoraSlot::dM, MemCategory::Gradients,
                          "lora dA",     "lora dB",     "dora dM",     "gradients"};

// Makes s's buffers of kind k: the A side where a_side holds, B (and M with DoRA) where b_side.
void allocate_kind(MemoryTracker* tracker, LoraSlot& s, const SlotKind& k, bool dora, bool a_side,
                   bool b_side) {
  if (a_side) s.*k.a = Buffer(tracker, k.category, s.a_bytes(), k.a_name);
  if (!b_side) return;
  s.*k.b = Buffer(tracker, k.category, s.b_bytes(), k.b_name);
  if (dora) s.*k.m = Buffer(tracker, k.category, s.m_bytes(), k.m_name);
}

// Within each head, HF row i*(hd/2) + j (half i, pair j) is GGUF row 2j + i; to_adjacent says
// which of the two orders src is in.
void permute_rows(const float* src, float* dst, int n_heads, int head_dim, int64_t cols,
                  bool to_adjacent) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < half; ++j) {
        const int64_t hf = static_cast<int64_t>(h) * head_dim + i * half + j;
        const int64_t adj = static_cast<int64_t>(h) * head_dim + 2 * j + i;
        std::memcpy(dst + (to_adjacent ? adj : hf) * cols, src + (to_adjacent ? hf : adj) * cols,
                    cols * sizeof(float));
      }
}
}  // namespace

void permute_rows_hf_to_adjacent(const float* src, float* dst, int n_heads, int head_dim,
                                 int64_t cols) {
  permute_rows(src, dst, n_heads, head_dim, cols, true);
}

void permute_rows_adjacent_to_hf(const float* src, float* dst, int n_heads, int head_dim,
                                 int64_t cols) {
  permute_rows(src, dst, n_heads, head_dim, cols, false);
}

void check_lora_targets(const ModelShapes& m, const LoraConfig& cfg) {
  // An MoE layer has no dense gate / up / down: those names adapt its experts, gate and up
  // together as PEFT's fused experts.gate_up_proj (PEFT refuses w1 without w3).
  const bool gate = cfg.targets[int(Proj::Gate)], up = cfg.targets[int(Proj::Up)];
  for (int l = 0; l < m.n_layers; ++l)
    QLFT_CHECK_ARG(
        !m.layers[size_t(l)].moe() || gate == up,
        "lora.target_modules: %s on %s's layer %d adapts its %d experts' fused "
        "gate_up_proj (PEFT 0.21's experts.gate_up_proj), which takes gate and up "
        "together: target both (Mixtral's w1 and w3, or gate_proj and up_proj)",
        gate ? "gate_proj (w1) without up_proj (w3)" : "up_proj (w3) without gate_proj (w1)",
        m.arch.c_str(), l, m.layers[size_t(l)].n_experts);
  QLFT_CHECK_ARG(!cfg.router || m.any_moe(),
                 "lora.target_modules: 'gate' names a mixture-of-experts router, which %s has "
                 "not (gate_proj is the MLP's gate projection)",
                 m.arch.c_str());
}

LoraAdapter::LoraAdapter(MemoryTracker* tracker, const ModelShapes& m, const LoraConfig& cfg,
                         bool gradients, bool values)
    : cfg_(cfg), shapes_(m), tracker_(tracker) {
  check_lora_targets(m, cfg);
  QLFT_CHECK_ARG(cfg.r > 0 && cfg.r <= 65536, "lora.r must be in 1..65536, got %d", cfg.r);
  QLFT_CHECK_ARG(cfg.dropout >= 0.f && cfg.dropout < 1.f, "lora.dropout must be in [0, 1), got %g",
                 cfg.dropout);
  // A fused family (phi3) has one module for q / k / v (qkv_proj) and one for gate / up
  // (gate_up_proj): PEFT adapts a whole module or none of it.
  const ArchFamily* fam = find_family(m.arch);
  fused_ = fam && fam->fused;
  if (fused_)
    for (Proj first : {Proj::Q, Proj::Gate}) {
      const LoraModule mod = lora_module(true, first);
      bool any = false, all = true;
      const char* part = nullptr;  // the first targeted part, for the message
      for (Proj p : mod.parts) {
        const bool t = cfg.targets[static_cast<int>(p)];
        if (t && !part) part = proj_peft_name(p);
        any |= t;
        all &= t;
      }
      QLFT_CHECK_ARG(any == all,
                     "lora.target_modules: %s keeps %s in one %s, which LoRA adapts whole as "
                     "PEFT does: target %s (not %s)",
                     m.arch.c_str(), first == Proj::Q ? "q/k/v" : "gate/up", mod.peft, mod.peft,
                     part);
      QLFT_CHECK_ARG(!any || !cfg.use_dora,
                     "lora.use_dora on %s's fused %s is not supported; target o_proj and "
                     "down_proj only",
                     m.arch.c_str(), mod.peft);
    }
  slots_.resize(m.n_layers);
  for (int l = 0; l < m.n_layers; ++l) {
    slots_[l].resize(kProjCount);
    for (int p = 0; p < kProjCount; ++p) {
      if (!lora_adapts(m, cfg, l, static_cast<Proj>(p))) continue;  // (MoE: make_moe_slots)
      LoraSlot& s = slots_[l][p];
      const ProjShape& ps = m.proj(l, static_cast<Proj>(p));
      s.out = static_cast<int>(ps.out);
      s.in = static_cast<int>(ps.in);
      s.r = cfg.r;
      // A fused module's later parts take its A and dA from its first part (made before).
      const Proj first = module(static_cast<Proj>(p)).first;
      s.shares_a = first != static_cast<Proj>(p);
      if (values) allocate_kind(tracker, s, kValues, cfg.use_dora, !s.shares_a, true);
      if (gradients) allocate_kind(tracker, s, kGradients, cfg.use_dora, !s.shares_a, true);
      if (!s.shares_a) continue;
      LoraSlot& f = slots_[l][static_cast<int>(first)];
      if (values) s.A = Buffer::view_of(f.A);
      if (gradients) s.dA = Buffer::view_of(f.dA);
    }
  }
  make_moe_slots(gradients, values);
  init(cfg.init_seed);
}

void LoraAdapter::allocate_where(bool gradients, const std::function<bool(int, Proj, bool)>& keep) {
  const SlotKind& k = gradients ? kGradients : kValues;
  // All checked before any is made: a refused call changes nothing. A fused module's parts
  // share A: only all of every tensor (no sharding) is supported there.
  const bool fused = shares_any_a();
  for (int l = 0; l < n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const LoraSlot& s = slots_[l][p];
      QLFT_CHECK_ARG(!s.active() || ((s.*k.a).empty() && (s.*k.b).empty()),
                     "allocate_%s: the adapter already has its %s", k.what, k.what);
      QLFT_CHECK_ARG(
          !s.active() || !has_moe() ||
              (keep(l, static_cast<Proj>(p), false) && keep(l, static_cast<Proj>(p), true)),
          "sharded LoRA %s (ZeRO) with an MoE layer's expert / router LoRA are not "
          "supported (lora.target_modules w1 / w2 / w3 / gate on %s)",
          k.what, shapes_.arch.c_str());
      QLFT_CHECK_ARG(
          !s.active() || !fused ||
              (keep(l, static_cast<Proj>(p), false) && keep(l, static_cast<Proj>(p), true)),
          "sharded LoRA %s (ZeRO) on %s's fused qkv_proj / gate_up_proj are not "
          "supported",
          k.what, shapes_.arch.c_str());
    }
  for (int l = 0; l < n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      LoraSlot& s = slots_[l][p];
      if (!s.active()) continue;
      allocate_kind(tracker_, s, k, cfg_.use_dora,
                    !s.shares_a && keep(l, static_cast<Proj>(p), false),
                    keep(l, static_cast<Proj>(p), true));
      if (s.shares_a)  // the module's first part's, made before
        s.*k.a =
            Buffer::view_of(slots_[l][static_cast<int>(module(static_cast<Proj>(p)).first)].*k.a);
    }
  for (auto& layer : moe_slots_)  // (whole: checked above)
    for (MoeLoraSlot& s : layer) {
      if (!s.active()) continue;
      Buffer MoeLoraSlot::*a = gradients ? &MoeLoraSlot::dA : &MoeLoraSlot::A;
      Buffer MoeLoraSlot::*b = gradients ? &MoeLoraSlot::dB : &MoeLoraSlot::B;
      QLFT_CHECK_ARG((s.*a).empty(), "allocate_%s: the adapter already has its %s", k.what, k.what);
      s.*a = Buffer(tracker_, k.category, size_t(s.a_n()) * 4, k.a_name);
      s.*b = Buffer(tracker_, k.category, size_t(s.b_n()) * 4, k.b_name);
    }
}

void LoraAdapter::allocate_values(const std::function<bool(int, Proj, bool)>& keep) {
  allocate_where(false, keep);
  init(cfg_.init_seed);
}

void LoraAdapter::allocate_gradients(const std::function<bool(int, Proj, bool)>& keep) {
  refresh();
  ++host_writes_;
  allocate_where(true, keep);
}

namespace {
// PEFT's lora_A init, kaiming_uniform(a = sqrt(5)): U(-bound, bound), bound = 1 / sqrt(in), from
// the counter-based stream.
void kaiming_fill(float* A, int64_t n, float bound, uint64_t stream) {
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = mix64(stream + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
    double u = static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    A[i] = static_cast<float>((2.0 * u - 1.0) * bound);
  }
}
}  // namespace

void LoraAdapter::init(uint64_t seed) {
  refresh();
  ++host_writes_;
  for (int l = 0; l < n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      LoraSlot& s = slots_[l][p];
      if (!s.active()) continue;
      const float bound = 1.f / std::sqrt(static_cast<float>(s.in));
      const uint64_t stream = mix64(seed ^ mix64((static_cast<uint64_t>(l) << 8) | p));
      if (!s.B.empty()) std::memset(s.B.data(), 0, s.B.size());
      // DoRA's magnitude starts at the base rows' norms, which only the model has
      // (dora_init_magnitude, model/lora_dora.h); 1 until then.
      if (!s.M.empty()) std::fill(s.M.as<float>(), s.M.as<float>() + s.out, 1.f);
      // (another rank's: allocate_values, dist/zero3_lora.h; or a fused module's, drawn once)
      if (s.A.empty() || s.shares_a) continue;
      kaiming_fill(s.A.as<float>(), static_cast<int64_t>(cfg_.r) * s.in, bound, stream);
    }
  init_moe(seed);
  zero_grad();
}

void LoraAdapter::zero_grad() {
  refresh();
  ++host_writes_;
  for (auto& layer : slots_)
    for (LoraSlot& s : layer)
      for (Buffer* g : {&s.dA, &s.dB, &s.dM})  // (empty where allocate_gradients left none)
        if (!g->empty()) std::memset(g->data(), 0, g->size());
  for (auto& layer : moe_slots_)
    for (MoeLoraSlot& s : layer)
      for (Buffer* g : {&s.dA, &s.dB})
        if (!g->empty()) std::memset(g->data(), 0, g->size());
}

LoraRef LoraAdapter::ref(int layer, Proj p, uint64_t dropout_seed) const {
  const LoraSlot& s = slot(layer, p);
  LoraRef r;
  if (!s.active()) return r;
  // A ZeRO-3 sharded adapter (dist/zero3_lora.h) holds another rank's tensors only while their
  // layer is in use by the trainer's stream; anything else reading them is refused.
  if (s.A.empty() || s.B.empty())
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "LoRA tensors of layer %d %s are on another rank (dist.zero3_shard_adapter): "
                "save the adapter (every rank calls it) and use the file",
                layer, proj_peft_name(p));
  r.A = s.A.as<float>();
  r.B = s.B.as<float>();
  r.r = cfg_.r;
  r.scale = cfg_.scale();
  r.dropout_p = cfg_.dropout;
  r.dropout_seed = dropout_seed;
  return r;
}

bool LoraAdapter::permuted(Proj p) const {
  return shapes_.qk_adjacent && (p == Proj::Q || p == Proj::K);
}
int LoraAdapter::heads_of(Proj p) const {
  return shapes_.heads_of(p);
}

LoraSlot& LoraAdapter::checked_slot(int layer, Proj p, const float* A, int64_t a_n, int64_t b_n) {
  QLFT_CHECK_ARG(layer >= 0 && layer < n_layers(), "LoRA layer %d is out of range", layer);
  LoraSlot& s = slot(layer, p);
  QLFT_CHECK_ARG(s.active(), "layer %d %s has no LoRA adapter (not in lora.target_modules)", layer,
                 proj_peft_name(p));
  const int64_t a_want = A ? static_cast<int64_t>(cfg_.r) * s.in : 0;
  const int64_t b_want = A ? static_cast<int64_t>(s.out) * cfg_.r : s.out;
  QLFT_CHECK_ARG(a_n == a_want && b_n == b_want,
                 "layer %d %s: LoRA %s have %lld/%lld values, expected %lld/%lld", layer,
                 proj_peft_name(p), A ? "A/B" : "magnitude", static_cast<long long>(a_n),
                 static_cast<long long>(b_n), static_cast<long long>(a_want),
                 static_cast<long long>(b_want));
  return s;
}

void LoraAdapter::put_rows_hf(Proj p, const float* src, Buffer& dst, int64_t cols) const {
  if (permuted(p))
    permute_rows_hf_to_adjacent(src, dst.as<float>(), heads_of(p), shapes_.head_dim, cols);
  else
    std::memcpy(dst.data(), src, dst.size());
}

void LoraAdapter::set_hf(int layer, Proj p, const float* A, int64_t a_n, const float* B,
                         int64_t b_n) {
  LoraSlot& s = checked_slot(layer, p, A, a_n, b_n);
  std::memcpy(s.A.data(), A, a_n * 4);
  put_rows_hf(p, B, s.B, cfg_.r);
}

void LoraAdapter::set_magnitude_hf(int layer, Proj p, const float* m, int64_t n) {
  LoraSlot& s = checked_slot(layer, p, nullptr, 0, n);
  QLFT_CHECK_ARG(!s.M.empty(), "layer %d %s: a DoRA magnitude for an adapter without use_dora",
                 layer, proj_peft_name(p));
  put_rows_hf(p, m, s.M, 1);
}

void LoraAdapter::set_start_hf(int layer, Proj p, const float* A, int64_t a_n, const float* B,
                               int64_t b_n) {
  QLFT_CHECK_ARG(module(p).parts.size() == 1,
                 "a PiSSA / OLoRA start on %s's fused %s is not supported", shapes_.arch.c_str(),
                 module(p).peft);
  LoraSlot& s = checked_slot(layer, p, A, a_n, b_n);
  if (s.A0.empty()) {
    s.A0 = Buffer(tracker_, MemCategory::Adapter, s.a_bytes(), "lora A0 (frozen start)");
    s.B0 = Buffer(tracker_, MemCategory::Adapter, s.b_bytes(), "lora B0 (frozen start)");
  }
  std::memcpy(s.A0.data(), A, a_n * 4);
  put_rows_hf(p, B, s.B0, cfg_.r);
}

bool LoraAdapter::has_start() const {
  for (const auto& layer : slots_)
    for (const LoraSlot& s : layer)
      if (s.has_start()) return true;
  return false;
}

std::unique_ptr<LoraAdapter> LoraAdapter::folded_start(MemoryTracker* tracker) const {
  QLFT_CHECK_ARG(!cfg_.use_dora, "a DoRA adapter has no frozen start to fold");
  refresh();
  LoraConfig c = cfg_;
  c.r = 2 * cfg_.r;
  c.alpha = cfg_.use_rslora ? cfg_.alpha * std::sqrt(2.f) : 2 * cfg_.alpha;
  auto f = std::make_unique<LoraAdapter>(tracker, shapes_, c, /*gradients=*/false);
  const int r = cfg_.r;
  for (int l = 0; l < n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const LoraSlot& s = slots_[l][p];
      if (!s.active()) continue;
      QLFT_CHECK_ARG(s.has_start(), "layer %d %s has no frozen start to fold", l,
                     proj_peft_name(static_cast<Proj>(p)));
      LoraSlot& d = f->slots_[l][p];
      std::memcpy(d.A.data(), s.A.data(), s.A.size());  // rows [0, r): A, [r, 2r): A0
      std::memcpy(d.A.as<float>() + static_cast<size_t>(r) * s.in, s.A0.data(), s.A0.size());
      for (int o = 0; o < s.out; ++o)  // row o: B's r columns, then -B0's
        for (int k = 0; k < r; ++k) {
          d.B.as<float>()[static_cast<size_t>(o) * 2 * r + k] = s.B.as<float>()[o * r + k];
          d.B.as<float>()[static_cast<size_t>(o) * 2 * r + r + k] = -s.B0.as<float>()[o * r + k];
        }
    }
  return f;
}

std::vector<float> LoraAdapter::get_hf(int layer, Proj p, Part part) const {
  QLFT_CHECK_ARG(layer >= 0 && layer < n_layers(), "LoRA layer %d is out of range", layer);
  const LoraSlot& s = slot(layer, p);
  if (!s.active()) return {};
  const Buffer* parts[] = {&s.A, &s.B, &s.dA, &s.dB, &s.M, &s.dM, &s.A0, &s.B0};
  const Buffer& b = *parts[static_cast<int>(part)];
  if (b.empty()) return {};
  std::vector<float> v(b.size() / 4);
  // Columns of a tensor whose rows are the output's (B and B0: r; the magnitude: 1); A's rows
  // are the rank's.
  const bool is_a = part == Part::A || part == Part::dA || part == Part::A0;
  const int64_t cols = part == Part::M || part == Part::dM ? 1 : cfg_.r;
  if (!is_a && permuted(p))
    permute_rows_adjacent_to_hf(b.as<float>(), v.data(), heads_of(p), shapes_.head_dim, cols);
  else
    std::memcpy(v.data(), b.data(), b.size());
  return v;
}

std::vector<float> LoraAdapter::get_module_hf(int layer, Proj first, Part part) const {
  const LoraModule mod = module(first);
  QLFT_CHECK_ARG(mod.first == first, "%s is part of %s: ask for the module by its first part",
                 proj_peft_name(first), mod.peft);
  if (part == Part::A || part == Part::dA) return get_hf(layer, first, part);
  std::vector<float> v;
  for (Proj p : mod.parts) {
    const std::vector<float> rows = get_hf(layer, p, part);
    v.insert(v.end(), rows.begin(), rows.end());
  }
  return v;
}

void LoraAdapter::set_module_hf(int layer, Proj first, const float* A, int64_t a_n, const float* B,
                                int64_t b_n) {
  const LoraModule mod = module(first);
  QLFT_CHECK_ARG(mod.first == first, "%s is part of %s: set the module by its first part",
                 proj_peft_name(first), mod.peft);
  int64_t want = 0;
  for (Proj p : mod.parts) want += b_size(layer, p);
  QLFT_CHECK_ARG(b_n == want, "layer %d %s: LoRA B has %lld values, expected %lld", layer, mod.peft,
                 static_cast<long long>(b_n), static_cast<long long>(want));
  for (Proj p : mod.parts) {  // every part gets the (shared) A and its block of B's rows
    const int64_t n = b_size(layer, p);
    set_hf(layer, p, A, a_n, B, n);
    B += n;
  }
}

const char* moe_part_name(MoePart p) {
  static const char* const names[] = {"experts.gate_up_proj", "experts.down_proj", "gate.weight"};
  return names[static_cast<int>(p)];
}

bool lora_adapts(const ModelShapes& m, const LoraConfig& cfg, int layer, Proj p) {
  const bool mlp = p == Proj::Gate || p == Proj::Up || p == Proj::Down;
  return cfg.targets[int(p)] && m.proj(layer, p).out > 0 && !(mlp && m.any_moe());
}

MoeLoraSlot moe_lora_shape(const ModelShapes& m, const LoraConfig& cfg, int layer, MoePart p) {
  MoeLoraSlot s;
  const LayerShapes& ls = m.layers[size_t(layer)];
  const bool on[kMoePartCount] = {cfg.targets[int(Proj::Gate)], cfg.targets[int(Proj::Down)],
                                  cfg.router};
  const int pi = static_cast<int>(p);
  if (!ls.moe() || !on[pi]) return s;
  // gate_up: PEFT's rank_pattern / alpha_pattern give it 2r and 2 alpha.
  const int64_t in[kMoePartCount] = {ls.norm, ls.expert_ffn, ls.norm};
  const int64_t out[kMoePartCount] = {2 * ls.expert_ffn, ls.norm, ls.n_experts};
  s.in = in[pi];
  s.out = out[pi];
  s.r = p == MoePart::GateUp ? 2 * cfg.r : cfg.r;
  s.experts = p == MoePart::Router ? 1 : ls.n_experts;
  const float alpha = p == MoePart::GateUp ? 2 * cfg.alpha : cfg.alpha;
  s.scale = cfg.use_rslora ? alpha / std::sqrt(float(s.r)) : alpha / float(s.r);
  return s;
}

MoeLoraRanks moe_lora_ranks_of(const ModelShapes& m, const LoraConfig& cfg, int layer) {
  MoeLoraRanks k;
  k.gate_up = moe_lora_shape(m, cfg, layer, MoePart::GateUp).r;
  k.down = moe_lora_shape(m, cfg, layer, MoePart::Down).r;
  k.router = moe_lora_shape(m, cfg, layer, MoePart::Router).r;
  return k;
}

void LoraAdapter::make_moe_slots(bool gradients, bool values) {
  moe_slots_.clear();
  bool any = false;
  for (int l = 0; l < n_layers(); ++l) {
    moe_slots_.emplace_back();
    for (int p = 0; p < kMoePartCount; ++p) {
      moe_slots_.back().push_back(moe_lora_shape(shapes_, cfg_, l, MoePart(p)));
      any |= moe_slots_.back().back().active();
    }
  }
  if (!any) return;
  // As PEFT's ParamWrapper: no dropout, DoRA or bias on these.
  if (cfg_.dropout != 0.f || cfg_.use_dora)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "lora.%s with LoRA on %s's experts / router (lora.target_modules w1 / w2 / w3 / "
                "gate, or an MoE layer's gate_proj / up_proj / down_proj): PEFT's ParamWrapper "
                "refuses it; set it off or target the attention projections only",
                cfg_.use_dora ? "use_dora" : "dropout", shapes_.arch.c_str());
  for (auto& layer : moe_slots_)
    for (int p = 0; p < kMoePartCount; ++p) {
      MoeLoraSlot& s = layer[size_t(p)];
      if (!s.active()) continue;
      const std::string what = std::string("lora ") + moe_part_name(MoePart(p));
      if (values) {
        s.A = Buffer(tracker_, MemCategory::Adapter, size_t(s.a_n()) * 4, (what + " A").c_str());
        s.B = Buffer(tracker_, MemCategory::Adapter, size_t(s.b_n()) * 4, (what + " B").c_str());
      }
      if (gradients) {
        s.dA =
            Buffer(tracker_, MemCategory::Gradients, size_t(s.a_n()) * 4, (what + " dA").c_str());
        s.dB =
            Buffer(tracker_, MemCategory::Gradients, size_t(s.b_n()) * 4, (what + " dB").c_str());
      }
    }
}

void LoraAdapter::init_moe(uint64_t seed) {
  for (int l = 0; l < int(moe_slots_.size()); ++l)
    for (int p = 0; p < kMoePartCount; ++p) {
      MoeLoraSlot& s = moe_slots_[size_t(l)][size_t(p)];
      if (!s.active() || s.A.empty()) continue;
      std::memset(s.B.data(), 0, s.B.size());
      const uint64_t stream = mix64(seed ^ mix64((uint64_t(l) << 8) | uint64_t(kProjCount + p)));
      kaiming_fill(s.A.as<float>(), s.a_n(), 1.f / std::sqrt(float(s.in)), stream);
    }
}

bool LoraAdapter::has_moe() const {
  for (const auto& layer : moe_slots_)
    for (const MoeLoraSlot& s : layer)
      if (s.active()) return true;
  return false;
}

MoeLora LoraAdapter::moe_lora(int layer, bool gradients) const {
  MoeLora v;
  MoeLoraPart* parts[kMoePartCount] = {&v.gate_up, &v.down, &v.router};
  for (int p = 0; p < kMoePartCount; ++p) {
    const MoeLoraSlot& s = moe_slot(layer, MoePart(p));
    if (!s.active()) continue;
    QLFT_CHECK_ARG(!s.A.empty() && !s.B.empty(), "layer %d %s: LoRA tensors not allocated", layer,
                   moe_part_name(MoePart(p)));
    *parts[p] = MoeLoraPart{s.A.as<float>(),
                            s.B.as<float>(),
                            gradients ? const_cast<float*>(s.dA.as<float>()) : nullptr,
                            gradients ? const_cast<float*>(s.dB.as<float>()) : nullptr,
                            s.r,
                            s.scale};
  }
  return v;
}

std::vector<float> LoraAdapter::get_moe_peft(int layer, MoePart p, bool b, bool grad) const {
  const MoeLoraSlot& s = moe_slot(layer, p);
  const Buffer& buf = b ? (grad ? s.dB : s.B) : (grad ? s.dA : s.A);
  if (!s.active() || buf.empty()) return {};
  if (!b) return std::vector<float>(buf.as<float>(), buf.as<float>() + s.a_n());
  return moe_lora_b_to_peft(buf.as<float>(), s.out, s.r, s.experts);
}

void LoraAdapter::set_moe_peft(int layer, MoePart p, const float* A, int64_t a_n, const float* B,
                               int64_t b_n) {
  QLFT_CHECK_ARG(layer >= 0 && layer < n_layers(), "LoRA layer %d is out of range", layer);
  refresh();
  ++host_writes_;
  MoeLoraSlot& s = moe_slots_[size_t(layer)][size_t(p)];
  QLFT_CHECK_ARG(s.active(), "layer %d %s has no LoRA adapter (not in lora.target_modules)", layer,
                 moe_part_name(p));
  QLFT_CHECK_ARG(a_n == s.a_n() && b_n == s.b_n(),
                 "layer %d %s: LoRA A/B have %lld/%lld values, expected %lld/%lld", layer,
                 moe_part_name(p), (long long)a_n, (long long)b_n, (long long)s.a_n(),
                 (long long)s.b_n());
  std::memcpy(s.A.data(), A, size_t(a_n) * 4);
  const std::vector<float> b = moe_lora_b_from_peft(B, s.out, s.r, s.experts);
  std::memcpy(s.B.data(), b.data(), size_t(b_n) * 4);
}

bool LoraAdapter::shares_any_a() const {
  for (const auto& layer : slots_)
    for (const LoraSlot& s : layer)
      if (s.shares_a) return true;
  return false;
}

uint64_t LoraAdapter::n_params() const {
  uint64_t n = 0;  // (sizes only: no refresh)
  for (const auto& layer : slots_)
    for (const LoraSlot& s : layer)
      if (s.active())
        n += ((s.shares_a ? 0 : s.a_bytes()) + s.b_bytes() + (s.M.empty() ? 0 : s.m_bytes())) / 4;
  for (const auto& layer : moe_slots_)
    for (const MoeLoraSlot& s : layer) n += uint64_t(s.a_n() + s.b_n());
  return n;
}

std::vector<LoraAdapter::Param> LoraAdapter::params() {
  refresh();
  ++host_writes_;
  std::vector<Param> v;
  for (auto& layer : slots_)
    for (LoraSlot& s : layer)
      if (s.active()) {
        if (!s.shares_a)  // (a fused module's A once)
          v.push_back({s.A.as<float>(), s.dA.as<float>(), static_cast<int64_t>(s.a_bytes() / 4)});
        v.push_back({s.B.as<float>(), s.dB.as<float>(), static_cast<int64_t>(s.b_bytes() / 4)});
        if (!s.M.empty()) v.push_back({s.M.as<float>(), s.dM.as<float>(), s.out});
      }
  for (auto& layer : moe_slots_)
    for (MoeLoraSlot& s : layer)
      if (s.active()) {
        v.push_back({s.A.as<float>(), s.dA.as<float>(), s.a_n()});
        v.push_back({s.B.as<float>(), s.dB.as<float>(), s.b_n()});
      }
  return v;
}

}  // namespace qlft
