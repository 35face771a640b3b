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

namespace qlft {

namespace {

// Runner tensors live in the backend's memory (device memory on a GPU). Uninitialized: each is
// written whole before it is read (an op's output, or zeroed right before an accumulation);
// the test suite poisons such memory with NaN (QLFT_POISON_UNINIT), so a read before the write
// fails the oracle tests. Zeroing them cost ~5% of a CPU step and a launch per tensor on a GPU.
Buffer make(const Backend& be, MemCategory c, int64_t floats, const char* what) {
  return be.alloc(c, static_cast<size_t>(floats) * sizeof(float), what, BufferInit::Uninit);
}
MatF mat(Buffer& b, int64_t rows, int64_t cols) {
  return MatF(b.as<float>(), rows, cols);
}
CMatF cmat(const Buffer& b, int64_t rows, int64_t cols) {
  return CMatF(b.as<float>(), rows, cols);
}
void zero(Buffer& b) {
  b.zero();
}

// Bytes the tracker counts for a buffer of n elements of `bytes` each (Buffer rounds to 64).
uint64_t counted(int64_t n, int64_t bytes = sizeof(float)) {
  return (static_cast<uint64_t>(n) * static_cast<uint64_t>(bytes) + 63) / 64 * 64;
}

// Which of layer_act_counts' buffers stay fp32 with 16-bit storage: the norm statistics, the
// softmax log-sum-exp and the residual x_mid (torch autocast keeps these fp32 as well).
// In order: xn1, rstd1, q, k, v, att, lse, x_mid, xn2, rstd2, gate, up, hact.
constexpr bool kActFp32[13] = {false, true,  false, false, false, false, true,
                               true,  false, true,  false, false, false};

// Element counts of LayerActs' buffers in declaration order (xn1 .. hact); each xa is rows * r.
std::array<int64_t, 13> layer_act_counts(const ModelConfig& c, int64_t R) {
  const int64_t qd = static_cast<int64_t>(c.n_heads) * c.head_dim,
                kvd = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  return {R * c.dim, R,         R * qd, R * kvd,       R * kvd,       R * qd,       R * c.n_heads,
          R * c.dim, R * c.dim, R,      R * c.ffn_dim, R * c.ffn_dim, R * c.ffn_dim};
}

// Element counts of the backward temporaries: G, dxn, datt, dq, dk, dv, dh, dgate, dup.
std::array<int64_t, 9> grad_counts(const ModelConfig& c, int64_t R) {
  const int64_t qd = static_cast<int64_t>(c.n_heads) * c.head_dim,
                kvd = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  return {R * c.dim, R * c.dim,     R * qd,        R * qd,       R * kvd,
          R * kvd,   R * c.ffn_dim, R * c.ffn_dim, R * c.ffn_dim};
}

// Per (step, layer, projection) seed so every adapter draws its own dropout mask.
uint64_t proj_seed(uint64_t step_seed, int layer, Proj p) {
  return mix64(step_seed ^ mix64((static_cast<uint64_t>(layer) << 8) | static_cast<uint64_t>(p)));
}

}  // namespace

DType activation_dtype(const std::string& precision) {
  if (precision == "bf16") return DType::BF16;
  if (precision == "fp16") return DType::F16;
  return DType::F32;
}

// Everything one layer's backward reads. xa[p] holds drop(x) A^T of projection p.
// half: the tensors of halves() hold 16-bit values (a packed stored layer), the rest fp32.
struct LlamaRunner::LayerActs {
  Buffer xn1, rstd1, q, k, v, att, lse, x_mid, xn2, rstd2, gate, up, hact;
  Buffer xa[kProjCount];
  bool half = false;

  // The tensors 16-bit storage keeps in 16 bits (xa entries may be empty), and the fp32 ones.
  std::array<Buffer*, 9 + kProjCount> halves() {
    std::array<Buffer*, 9 + kProjCount> h = {&xn1, &q, &k, &v, &att, &xn2, &gate, &up, &hact};
    for (int p = 0; p < kProjCount; ++p) h[9 + p] = &xa[p];
    return h;
  }
  std::array<Buffer*, 4> fulls() { return {&rstd1, &lse, &x_mid, &rstd2}; }
};

namespace {
// Lends a packed layer's fp32 tensors to the fp32 scratch set while a layer runs there (the
// Buffers change owners, nothing is copied or allocated), and gives them back.
class LendFulls {
 public:
  LendFulls(std::array<Buffer*, 4> a, std::array<Buffer*, 4> b) : a_(a), b_(b) { swap(); }
  ~LendFulls() { swap(); }
  LendFulls(const LendFulls&) = delete;
  LendFulls& operator=(const LendFulls&) = delete;

 private:
  void swap() {
    for (size_t i = 0; i < a_.size(); ++i) std::swap(*a_[i], *b_[i]);
  }
  std::array<Buffer*, 4> a_, b_;
};
}  // namespace

// Backward temporaries (workspace).
struct LlamaRunner::Grads {
  Buffer G, dxn, datt, dq, dk, dv, dh, dgate, dup;
};

RunnerFootprint LlamaRunner::footprint(const ModelConfig& c, int lora_r, int lora_projs,
                                       int64_t rows, bool training, bool doc_ids, DType acts,
                                       uint64_t (*round)(uint64_t)) {
  const int64_t R = rows;
  // A device allocator rounds each buffer further (size classes): per buffer, not per total.
  auto counted = [round](int64_t n, int64_t bytes = sizeof(float)) {
    const uint64_t b = qlft::counted(n, bytes);
    return round ? round(b) : b;
  };
  const int64_t es = acts == DType::F32 ? 4 : 2;  // bytes of a 16-bit-storable element
  RunnerFootprint f;
  const std::array<int64_t, 13> n = layer_act_counts(c, R);
  for (size_t i = 0; i < n.size(); ++i) {
    f.layer_acts += counted(n[i]);
    f.layer_store += counted(n[i], kActFp32[i] ? 4 : es);
  }
  f.layer_acts += static_cast<uint64_t>(lora_projs) * counted(R * lora_r);
  f.layer_store += static_cast<uint64_t>(lora_projs) * counted(R * lora_r, es);
  f.scratch_always = acts != DType::F32;
  // As prepare() allocates: tokens, positions, targets (and doc ids) of 4-byte ints, the
  // residual stream, the final norm output and rstd, and its gradient when training.
  f.stream = 3 * counted(R) + (doc_ids ? counted(R) : 0) +
             static_cast<uint64_t>(c.n_layers + 1) * counted(R * c.dim) + counted(R * c.dim) +
             counted(R) + (training ? counted(R * c.dim) : 0);
  for (int64_t n : grad_counts(c, R)) f.backward_ws += counted(n);
  f.recompute_ws = counted(R * c.dim);
  return f;
}

LlamaRunner::LlamaRunner(const Model& model, Backend& backend, LoraAdapter* lora)
    : model_(model), be_(backend), lora_(lora), ckpt_(model.cfg.n_layers, false) {
  if (lora) {
    const ModelConfig& a = lora->model_config();
    const ModelConfig& m = model.cfg;
    QLFT_CHECK_ARG(a.n_layers == m.n_layers && a.dim == m.dim && a.ffn_dim == m.ffn_dim &&
                       a.n_heads == m.n_heads && a.n_kv_heads == m.n_kv_heads &&
                       a.head_dim == m.head_dim && a.rope_adjacent == m.rope_adjacent,
                   "the LoRA adapter was made for a model of another shape");
  }
}

LlamaRunner::~LlamaRunner() = default;

void LlamaRunner::set_checkpoint(int layer, bool on) {
  QLFT_CHECK_ARG(layer >= 0 && layer < model_.cfg.n_layers, "layer %d is out of range", layer);
  ckpt_[layer] = on;
  stored_.clear();
  have_forward_ = false;
}
void LlamaRunner::set_checkpoint_all(bool on) {
  for (int l = 0; l < model_.cfg.n_layers; ++l) ckpt_[l] = on;
  stored_.clear();
  have_forward_ = false;
}

void LlamaRunner::set_activation_dtype(DType t) {
  QLFT_CHECK_ARG(t == DType::F32 || t == DType::BF16 || t == DType::F16,
                 "activations are stored as F32, BF16 or F16, not %s", dtype_name(t));
  act_dtype_ = t;
  stored_.clear();
  have_forward_ = false;
}

void LlamaRunner::release() {
  stored_.clear();
  scratch_.reset();
  grads_.reset();
  resid_.clear();
  xnf_.reset();
  rstdf_.reset();
  dxnf_.reset();
  pos_.reset();
  docs_.reset();
  targets_.reset();
  tokens_.reset();
  pos_host_.clear();
  rows_ = 0;
  have_forward_ = false;
}

LoraRef LlamaRunner::lora_ref(int l, Proj p, bool* has) const {
  *has = lora_ && lora_->active(l, p);
  if (!*has) return LoraRef{};
  LoraRef r;
  if (!lora_w_.empty()) {  // the device copy (no host access: it may be stale)
    const std::array<int64_t, 2>& o = lora_off_[static_cast<size_t>(l * kProjCount + int(p))];
    r.A = lora_w_.as<float>() + o[0];
    r.B = lora_w_.as<float>() + o[1];
    r.r = lora_->config().r;
    r.scale = lora_->config().scale();
    r.dropout_p = lora_->config().dropout;
    r.dropout_seed = proj_seed(dropout_seed_, l, p);
  } else {
    r = lora_->ref(l, p, proj_seed(dropout_seed_, l, p));
  }
  if (!training_) r.dropout_p = 0.f;  // inference: dropout is the identity
  return r;
}

void LlamaRunner::keep_lora_on_device() {
  if (!lora_ || !be_.device_memory()) return;
  lora_resident_ = true;
  lora_to_device();
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
      host.insert(host.end(), s.A.as<float>(), s.A.as<float>() + s.A.size() / 4);
      o[1] = static_cast<int64_t>(host.size());
      host.insert(host.end(), s.B.as<float>(), s.B.as<float>() + s.B.size() / 4);
    }
  if (host.empty()) return;
  const size_t bytes = host.size() * 4;
  if (lora_w_.size() != bytes) {
    lora_w_ = be_.alloc(MemCategory::Adapter, bytes, "lora A/B (device copy)", BufferInit::Uninit);
    lora_g_ = be_.alloc(MemCategory::Gradients, bytes, "lora dA/dB (device)");
  }
  lora_w_.copy_from_host(host.data(), bytes);
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
    for (size_t i = 0; i < s.dA.size() / 4; ++i) dA[i] += g[size_t(o[0]) + i];
    for (size_t i = 0; i < s.dB.size() / 4; ++i) dB[i] += g[size_t(o[1]) + i];
  });
}

LlamaRunner::LayerActs& LlamaRunner::acts_for(int layer, bool store) {
  const ModelConfig& c = model_.cfg;
  std::unique_ptr<LayerActs>* slot;
  const bool stored = store && !ckpt_[layer];
  if (stored) {
    if (stored_.size() != static_cast<size_t>(c.n_layers)) stored_.resize(c.n_layers);
    slot = &stored_[layer];
  } else {
    slot = &scratch_;
  }
  if (*slot) return **slot;
  const MemCategory A = MemCategory::Activations;
  const int64_t R = rows_;
  const std::array<int64_t, 13> n = layer_act_counts(c, R);
  auto a = std::make_unique<LayerActs>();
  // A stored layer under 16-bit storage keeps its halves() in 2 bytes an element; the fp32
  // scratch set holds every layer while it runs.
  a->half = stored && act_dtype_ != DType::F32;
  const size_t es = a->half ? 2 : 4;
  auto make16 = [&](int64_t count, const char* what) {
    return be_.alloc(A, static_cast<size_t>(count) * es, what, BufferInit::Uninit);
  };
  a->xn1 = make16(n[0], "attn norm out");
  a->rstd1 = make(be_, A, n[1], "attn norm rstd");
  a->q = make16(n[2], "q");
  a->k = make16(n[3], "k");
  a->v = make16(n[4], "v");
  a->att = make16(n[5], "attention out");
  a->lse = make(be_, A, n[6], "attention lse");
  a->x_mid = make(be_, A, n[7], "residual mid");
  a->xn2 = make16(n[8], "ffn norm out");
  a->rstd2 = make(be_, A, n[9], "ffn norm rstd");
  a->gate = make16(n[10], "gate");
  a->up = make16(n[11], "up");
  a->hact = make16(n[12], "swiglu out");
  if (lora_)
    for (int p = 0; p < kProjCount; ++p)
      if (lora_->active(layer, static_cast<Proj>(p)))
        a->xa[p] = make16(R * lora_->config().r, "lora xa");
  *slot = std::move(a);
  return **slot;
}

LlamaRunner::LayerActs& LlamaRunner::scratch() {
  // Any layer index gives the same scratch shape (the LoRA targets are the same in every layer).
  return acts_for(0, false);
}

// halves() written by layer_fwd itself when direct16(): all but the LoRA xa; and those
// layer_bwd reads in 16 bits (GEMM inputs, attention_inputs_16, attention_out_16,
// swiglu_bwd_16): all but xa.
constexpr bool kHalfWrittenDirect[9] = {true, true, true, true, true, true, true, true, true};
constexpr bool kHalfReadDirect[9] = {true, true, true, true, true, true, true, true, true};

bool LlamaRunner::direct16() const {
  // LoRA dropout reads the fp32 input (its scaled values round differently).
  return act_dtype_ != DType::F32 && be_.takes_input_16(act_dtype_) &&
         !(lora_ && training_ && lora_->config().dropout > 0.f);
}

void LlamaRunner::pack(LayerActs& from, LayerActs& to, bool direct) {
  auto src = from.halves();
  auto dst = to.halves();
  for (size_t i = 0; i < dst.size(); ++i)
    if (!dst[i]->empty() && !(direct && i < 9 && kHalfWrittenDirect[i]))
      be_.to_16(act_dtype_, src[i]->as<float>(), dst[i]->as<uint16_t>(),
                static_cast<int64_t>(dst[i]->size() / 2));
}

void LlamaRunner::unpack(LayerActs& from, LayerActs& to, bool direct) {
  auto src = from.halves();
  auto dst = to.halves();
  for (size_t i = 0; i < src.size(); ++i)
    if (!src[i]->empty() && !(direct && i < 9 && kHalfReadDirect[i]))
      be_.from_16(act_dtype_, src[i]->as<uint16_t>(), dst[i]->as<float>(),
                  static_cast<int64_t>(src[i]->size() / 2));
}

// A checkpointed layer recomputed into the scratch: the same 16-bit values a stored layer's
// backward would unpack, so checkpointing does not change the arithmetic.
void LlamaRunner::round_stored(LayerActs& a) {
  for (Buffer* b : a.halves())
    if (!b->empty()) be_.round_16(act_dtype_, b->as<float>(), static_cast<int64_t>(b->size() / 4));
}

void LlamaRunner::prepare(const TokenBatch& b, bool training) {
  const ModelConfig& c = model_.cfg;
  QLFT_CHECK_ARG(b.batch > 0 && b.seq > 0 && b.tokens, "empty token batch (%d x %d)", b.batch,
                 b.seq);
  const int64_t R = b.rows();
  if (R != rows_) {
    release();
    rows_ = R;
  }
  // The batch is checked here, on the host (a device backend cannot check what it never sees),
  // and copied into the backend's memory: tokens and targets every time, positions when they
  // change (the same for every batch of one shape unless packing supplies them).
  const MemCategory A = MemCategory::Activations;
  if (pos_.empty()) {
    pos_ = be_.alloc(A, R * 4, "positions", BufferInit::Uninit);
    targets_ = be_.alloc(A, R * 4, "targets", BufferInit::Uninit);
    tokens_ = be_.alloc(A, R * 4, "tokens", BufferInit::Uninit);
  }
  for (int64_t r = 0; r < R; ++r)
    QLFT_CHECK_ARG(b.tokens[r] >= 0 && b.tokens[r] < c.vocab,
                   "token id %d at position %lld is outside the vocabulary of %d tokens",
                   b.tokens[r], static_cast<long long>(r), c.vocab);
  tokens_.copy_from_host(b.tokens, R * 4);
  std::vector<int32_t> pos(static_cast<size_t>(R));
  int32_t max_pos = 0;
  for (int64_t r = 0; r < R; ++r) {
    int32_t p = b.positions ? b.positions[r] : static_cast<int32_t>(r % b.seq);
    QLFT_CHECK_ARG(p >= 0, "position %d of row %lld is negative", p, static_cast<long long>(r));
    pos[static_cast<size_t>(r)] = p;
    max_pos = std::max(max_pos, p);
  }
  // As transformers: dynamic NTK takes its length from max(position_ids) + 1 of the batch.
  rope_ = rope_freqs(c, int64_t(max_pos) + 1);
  if (pos != pos_host_) {
    pos_.copy_from_host(pos.data(), R * 4);
    pos_host_ = std::move(pos);
  }
  if (b.doc_ids) {
    if (docs_.empty()) docs_ = be_.alloc(A, R * 4, "doc ids", BufferInit::Uninit);
    docs_.copy_from_host(b.doc_ids, R * 4);
  }
  if (b.targets) {
    for (int64_t r = 0; r < R; ++r) {
      int32_t v = b.targets[r];
      QLFT_CHECK_ARG(v == kIgnoreIndex || (v >= 0 && v < c.vocab),
                     "target %d at row %lld is outside the vocabulary (0..%d) and not %d", v,
                     static_cast<long long>(r), c.vocab - 1, kIgnoreIndex);
    }
    targets_.copy_from_host(b.targets, R * 4);
  }
  shape_.batch = b.batch;
  shape_.seq = b.seq;
  shape_.n_heads = c.n_heads;
  shape_.n_kv_heads = c.n_kv_heads;
  shape_.head_dim = c.head_dim;
  shape_.doc_ids = b.doc_ids ? docs_.as<int32_t>() : nullptr;
  if (resid_.empty()) {
    resid_.resize(c.n_layers + 1);
    for (Buffer& x : resid_) x = make(be_, A, R * c.dim, "residual");
    xnf_ = make(be_, A, R * c.dim, "final norm out");
    rstdf_ = make(be_, A, R, "final norm rstd");
  }
  if (training && dxnf_.empty()) dxnf_ = make(be_, A, R * c.dim, "d final norm");
}

const float* LlamaRunner::frozen(const Buffer& host) {
  if (!be_.device_memory() || host.empty() || host.on_device()) return host.as<float>();
  // Keyed by the model's Buffer (one per norm / bias). Streamed weights (ZeRO-3 over MPI, NVMe
  // offload) get new bytes, possibly at a freed unit's old address, at every acquire: copied
  // again each time.
  auto it = frozen_.find(&host);
  if (it == frozen_.end() || it->second.size() != host.size()) {
    Buffer d = be_.alloc(MemCategory::Weights, host.size(), "norm weight / bias (device copy)",
                         BufferInit::Uninit);
    d.copy_from_host(host.data(), host.size());
    it = frozen_.insert_or_assign(&host, std::move(d)).first;
  } else if (model_.stream) {
    it->second.copy_from_host(host.data(), host.size());
  }
  return it->second.as<float>();
}

void LlamaRunner::layer_fwd(int l, LayerActs& a, const float* x_in, float* x_out, LayerActs* st) {
  const ModelConfig& c = model_.cfg;
  const LayerWeights& L = model_.layers[l];
  const int64_t R = rows_, qd = static_cast<int64_t>(c.n_heads) * c.head_dim,
                kvd = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  const int32_t* pos = pos_.as<int32_t>();
  CMatF xin(x_in, R, c.dim);
  const DType t16 = act_dtype_;
  // The stored 16-bit copy of a tensor the ops write directly (nullptr: none).
  auto h16 = [st](Buffer& b) { return st ? b.as<uint16_t>() : nullptr; };

  // With st the fp32 norm outputs, the rounded gate / up and the SwiGLU output are not written:
  // the GEMMs take the 16-bit copies (Backend::takes_input_16).
  if (st)
    be_.rmsnorm_fwd_16(xin, frozen(L.attn_norm), c.rms_eps, MatF(nullptr, R, c.dim),
                       a.rstd1.as<float>(), t16, st->xn1.as<uint16_t>());
  else
    be_.rmsnorm_fwd(xin, frozen(L.attn_norm), c.rms_eps, mat(a.xn1, R, c.dim), a.rstd1.as<float>());
  Buffer* outs[3] = {&a.q, &a.k, &a.v};
  const int64_t widths[3] = {qd, kvd, kvd};
  {
    SharedInput shared(be_, cmat(a.xn1, R, c.dim), t16, st ? h16(st->xn1) : nullptr);
    for (int j = 0; j < 3; ++j) {
      Proj p = static_cast<Proj>(j);
      bool has;
      LoraRef ref = lora_ref(l, p, &has);
      const float* bias = L.bias[j].empty() ? nullptr : frozen(L.bias[j]);
      be_.linear_fwd(L.proj[j], bias, has ? &ref : nullptr, cmat(a.xn1, R, c.dim),
                     mat(*outs[j], R, widths[j]), has ? a.xa[j].as<float>() : nullptr);
    }
  }
  if (st) {  // stored as they are, and attention's GEMMs take them (attention_inputs_16); the
             // fp32 q and k are not rotated (nothing reads them)
    be_.rope_to_16(mat(a.q, R, qd), pos, c.n_heads, c.head_dim, rope_, c.rope_adjacent, t16,
                   st->q.as<uint16_t>());
    be_.rope_to_16(mat(a.k, R, kvd), pos, c.n_kv_heads, c.head_dim, rope_, c.rope_adjacent, t16,
                   st->k.as<uint16_t>());
    be_.to_16(t16, a.v.as<float>(), st->v.as<uint16_t>(), R * kvd);
    be_.attention_inputs_16(t16, st->q.as<uint16_t>(), st->k.as<uint16_t>(), st->v.as<uint16_t>());
  } else {
    be_.rope(mat(a.q, R, qd), pos, c.n_heads, c.head_dim, rope_, c.rope_adjacent, false);
    be_.rope(mat(a.k, R, kvd), pos, c.n_kv_heads, c.head_dim, rope_, c.rope_adjacent, false);
  }
  if (st)  // the output rounded into the stored layer (no fp32 copy: backward reads that one)
    be_.attention_fwd_to_16(shape_, cmat(a.q, R, qd), cmat(a.k, R, kvd), cmat(a.v, R, kvd),
                            mat(a.att, R, qd), a.lse.as<float>(), t16, st->att.as<uint16_t>());
  else
    be_.attention_fwd(shape_, cmat(a.q, R, qd), cmat(a.k, R, kvd), cmat(a.v, R, kvd),
                      mat(a.att, R, qd), a.lse.as<float>());
  {
    SharedInput shared(be_, cmat(a.att, R, qd), t16, st ? h16(st->att) : nullptr);
    bool has;
    LoraRef ref = lora_ref(l, Proj::O, &has);
    const int o = static_cast<int>(Proj::O);
    be_.linear_fwd(L.proj[o], nullptr, has ? &ref : nullptr, cmat(a.att, R, qd),
                   mat(a.x_mid, R, c.dim), has ? a.xa[o].as<float>() : nullptr);
  }
  if (st) {  // the residual add and the norm in one pass
    be_.add_rmsnorm_fwd_16(mat(a.x_mid, R, c.dim), x_in, frozen(L.ffn_norm), c.rms_eps,
                           a.rstd2.as<float>(), t16, st->xn2.as<uint16_t>());
  } else {
    be_.add(a.x_mid.as<float>(), x_in, R * c.dim);
    be_.rmsnorm_fwd(cmat(a.x_mid, R, c.dim), frozen(L.ffn_norm), c.rms_eps, mat(a.xn2, R, c.dim),
                    a.rstd2.as<float>());
  }
  Buffer* ffn_outs[2] = {&a.gate, &a.up};
  {
    SharedInput shared(be_, cmat(a.xn2, R, c.dim), t16, st ? h16(st->xn2) : nullptr);
    for (int j = 0; j < 2; ++j) {
      const int p = static_cast<int>(Proj::Gate) + j;
      bool has;
      LoraRef ref = lora_ref(l, static_cast<Proj>(p), &has);
      // 16-bit storage keeps gate and up in 16 bits: SwiGLU's forward takes those values too
      // (autocast's matmul outputs), so forward and backward agree. With st they are written
      // rounded into the stored layer (linear_fwd_to_16: by the GEMM itself where it can).
      Buffer* st_out = st ? (j == 0 ? &st->gate : &st->up) : nullptr;
      if (st_out) {
        be_.linear_fwd_to_16(L.proj[p], nullptr, has ? &ref : nullptr, cmat(a.xn2, R, c.dim),
                             mat(*ffn_outs[j], R, c.ffn_dim), has ? a.xa[p].as<float>() : nullptr,
                             t16, st_out->as<uint16_t>());
        continue;
      }
      be_.linear_fwd(L.proj[p], nullptr, has ? &ref : nullptr, cmat(a.xn2, R, c.dim),
                     mat(*ffn_outs[j], R, c.ffn_dim), has ? a.xa[p].as<float>() : nullptr);
      if (act_dtype_ != DType::F32)
        be_.round_16(act_dtype_, ffn_outs[j]->as<float>(), R * c.ffn_dim);
    }
  }
  if (st)
    be_.swiglu_fwd_from_16(t16, st->gate.as<uint16_t>(), st->up.as<uint16_t>(),
                           st->hact.as<uint16_t>(), R, c.ffn_dim);
  else
    be_.swiglu_fwd(cmat(a.gate, R, c.ffn_dim), cmat(a.up, R, c.ffn_dim), mat(a.hact, R, c.ffn_dim));
  {
    SharedInput shared(be_, cmat(a.hact, R, c.ffn_dim), t16, st ? h16(st->hact) : nullptr);
    bool has;
    LoraRef ref = lora_ref(l, Proj::Down, &has);
    const int d = static_cast<int>(Proj::Down);
    be_.linear_fwd(L.proj[d], nullptr, has ? &ref : nullptr, cmat(a.hact, R, c.ffn_dim),
                   MatF(x_out, R, c.dim), has ? a.xa[d].as<float>() : nullptr);
  }
  be_.add(x_out, a.x_mid.as<float>(), R * c.dim);
}

LossResult LlamaRunner::run_forward(const TokenBatch& b, bool training, float grad_scale,
                                    MatF logits) {
  const ModelConfig& c = model_.cfg;
  training_ = training;
  have_forward_ = false;
  prepare(b, training);
  lora_to_device();
  const int64_t R = rows_;
  // Units in the order they are used (model/weight_stream.h); each one names the next.
  WeightStream* ws = model_.stream.get();
  {
    UnitUse use(ws, kEmbeddingUnit, layer_unit(0));
    if (ws && ws->rows_sharded())  // host memory (a host backend)
      ws->lookup_rows(tokens_.as<int32_t>(), R, resid_[0].as<float>());
    else
      be_.embedding_fwd(model_.tok_embd, tokens_.as<int32_t>(), mat(resid_[0], R, c.dim));
  }
  for (int l = 0; l < c.n_layers; ++l) {
    UnitUse use(ws, layer_unit(l), l + 1 < c.n_layers ? layer_unit(l + 1) : head_unit(c.n_layers));
    LayerActs& a = acts_for(l, training);
    if (!a.half) {
      layer_fwd(l, a, resid_[l].as<float>(), resid_[l + 1].as<float>());
      continue;
    }
    // 16-bit storage: run in the fp32 scratch (with this layer's own fp32 tensors), then pack.
    LayerActs& s = scratch();
    LendFulls lend(a.fulls(), s.fulls());
    const bool direct = direct16();
    layer_fwd(l, s, resid_[l].as<float>(), resid_[l + 1].as<float>(), direct ? &a : nullptr);
    pack(s, a, direct);
  }
  // Training comes back to the head first in backward (for the final norm).
  UnitUse head_use(ws, head_unit(c.n_layers), training ? head_unit(c.n_layers) : kNoUnit);
  be_.rmsnorm_fwd(cmat(resid_[c.n_layers], R, c.dim), frozen(model_.output_norm), c.rms_eps,
                  mat(xnf_, R, c.dim), rstdf_.as<float>());
  const bool sliced = ws && ws->rows_sharded();
  if (logits.data && sliced)
    ws->each_head_slice([&](const QWeight& slice, int64_t row0) {
      Buffer part = make(be_, MemCategory::Workspace, R * slice.rows, "logits of a head slice");
      be_.head_logits(slice, cmat(xnf_, R, c.dim), mat(part, R, slice.rows));
      for (int64_t r = 0; r < R; ++r)
        std::copy_n(part.as<float>() + r * slice.rows, slice.rows, logits.row(r) + row0);
    });
  else if (logits.data)
    be_.head_logits(model_.head(), cmat(xnf_, R, c.dim), logits);

  LossResult res;
  if (!b.targets) return res;
  int64_t count = 0;
  for (int64_t r = 0; r < R; ++r) count += b.targets[r] != kIgnoreIndex;
  const int32_t* tg = targets_.as<int32_t>();
  MatF dh;
  if (training) {
    zero(dxnf_);
    dh = mat(dxnf_, R, c.dim);
    if (grad_scale == 0.f) grad_scale = count ? 1.f / static_cast<float>(count) : 0.f;
  }
  int64_t got = 0;
  if (sliced)
    res.loss_sum = cross_entropy_by_slices(*ws, tg, grad_scale, dh, &got);
  else
    res.loss_sum = be_.linear_cross_entropy(model_.head(), cmat(xnf_, R, c.dim), tg, kIgnoreIndex,
                                            grad_scale, dh, &got);
  res.count = got;
  have_forward_ = training;
  return res;
}

double LlamaRunner::cross_entropy_by_slices(WeightStream& ws, const int32_t* targets,
                                            float grad_scale, MatF dh, int64_t* count) {
  // The head's rows come a slice at a time (a row-sharded ZeRO-3 head): both passes walk them,
  // the per-row state of pass 1 and the log-sum-exp of every row held between them.
  const int64_t R = rows_, V = model_.cfg.vocab;
  const CMatF h = cmat(xnf_, R, model_.cfg.dim);
  Buffer state(be_.tracker(), MemCategory::Workspace, size_t(R) * sizeof(CrossEntropyRow),
               "cross-entropy row stats");
  Buffer lse(be_.tracker(), MemCategory::Workspace, size_t(R) * 4, "cross-entropy row lse");
  auto* st = state.as<CrossEntropyRow>();
  std::fill(st, st + R, CrossEntropyRow{});
  if (dh.data && be_.cross_entropy_walks() == 1) {
    // One walk: pass 1 and the dh accumulators together (Backend::cross_entropy_walk).
    Buffer acc(be_.tracker(), MemCategory::Workspace, size_t(R * h.cols) * 4,
               "cross-entropy dh accumulators");
    ws.each_head_slice([&](const QWeight& slice, int64_t row0) {
      be_.cross_entropy_walk(slice, row0, V, h, targets, kIgnoreIndex, grad_scale, st,
                             acc.as<float>(), dh);
    });
    cross_entropy_walk_end(st, targets, kIgnoreIndex, grad_scale, acc.as<float>(), dh);
    return cross_entropy_finish(st, targets, R, kIgnoreIndex, lse.as<float>(), count);
  }
  ws.each_head_slice([&](const QWeight& slice, int64_t row0) {
    be_.cross_entropy_stats(slice, row0, V, h, targets, kIgnoreIndex, st);
  });
  const double loss = cross_entropy_finish(st, targets, R, kIgnoreIndex, lse.as<float>(), count);
  if (dh.data)
    ws.each_head_slice([&](const QWeight& slice, int64_t row0) {
      be_.cross_entropy_grad(slice, row0, V, h, targets, kIgnoreIndex, lse.as<float>(), grad_scale,
                             dh);
    });
  return loss;
}

LossResult LlamaRunner::forward(const TokenBatch& b, float grad_scale, uint64_t dropout_seed) {
  QLFT_CHECK_ARG(b.targets, "forward for training needs targets");
  dropout_seed_ = dropout_seed;
  be_.tracker()->set_phase("forward");
  return run_forward(b, true, grad_scale, MatF());
}

LossResult LlamaRunner::logits(const TokenBatch& b, MatF out) {
  QLFT_CHECK_ARG(out.data && out.rows == b.rows() && out.cols == model_.cfg.vocab,
                 "logits: output must be [%lld, %d]", static_cast<long long>(b.rows()),
                 model_.cfg.vocab);
  return run_forward(b, false, 0.f, out);
}

LossResult LlamaRunner::eval_loss(const TokenBatch& b) {
  QLFT_CHECK_ARG(b.targets, "eval_loss needs targets");
  return run_forward(b, false, 0.f, MatF());
}

void LlamaRunner::layer_bwd(int l, LayerActs& a, const float* x_in, bool need_dx, LayerActs* st) {
  const ModelConfig& c = model_.cfg;
  const LayerWeights& L = model_.layers[l];
  const int64_t R = rows_, qd = static_cast<int64_t>(c.n_heads) * c.head_dim,
                kvd = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  Grads& g = *grads_;
  const int32_t* pos = pos_.as<int32_t>();
  MatF G = mat(g.G, R, c.dim);

  // dy16: dy's bf16 copy for the backend (Backend::next_dy_16), handed over right before the
  // linear_bwd that takes it.
  auto lin_bwd = [&](Proj p, CMatF x, CMatF dy, MatF dx, View2<uint16_t> dy16 = {}) {
    const int pi = static_cast<int>(p);
    bool has;
    LoraRef ref = lora_ref(l, p, &has);
    float *dA = nullptr, *dB = nullptr;
    if (has && sink_) {  // (host backends only: set_grad_sink)
      const LoraGradTarget t = sink_->begin(l, p);
      dA = t.dA;
      dB = t.dB;
    } else if (has && !lora_g_.empty()) {  // the device copies (see lora_grads_to_host)
      const std::array<int64_t, 2>& o = lora_off_[static_cast<size_t>(l * kProjCount + pi)];
      dA = lora_g_.as<float>() + o[0];
      dB = lora_g_.as<float>() + o[1];
    } else if (has) {
      dA = lora_->slot(l, p).dA.as<float>();
      dB = lora_->slot(l, p).dB.as<float>();
    }
    if (dy16.data) be_.next_dy_16(act_dtype_, dy16);
    be_.linear_bwd(L.proj[pi], has ? &ref : nullptr, x, has ? a.xa[pi].as<float>() : nullptr, dy,
                   dx, dA, dB);
    if (has && sink_) sink_->end(l, p);
  };

  // The projections' backward runs in kBackwardProjOrder (model/lora_grad_sink.h).
  // FFN branch: G is d(loss)/d(x_out) = d/d(x_mid) through the residual, plus the branch.
  const DType t16 = act_dtype_;
  auto h16 = [st](Buffer& b) -> const uint16_t* { return st ? b.as<uint16_t>() : nullptr; };
  // The first linear_bwd into each dx buffer may overwrite it instead (Backend::defer_zero).
  auto zero_dx = [&](Buffer& b, int64_t n) {
    if (!be_.defer_zero(b.as<float>(), n)) zero(b);
  };
  zero_dx(g.dh, R * c.ffn_dim);
  {
    SharedInput shared(be_, cmat(a.hact, R, c.ffn_dim), t16, st ? h16(st->hact) : nullptr);
    lin_bwd(Proj::Down, cmat(a.hact, R, c.ffn_dim), G.as_const(), mat(g.dh, R, c.ffn_dim));
  }
  // With st (direct16()): the gradients that only enter linear_bwd as its dy (dgate, dup, dq,
  // dk, dv) are written in 16 bits into their fp32 buffers' memory (Backend::next_dy_16), at
  // the row stride the backend asks for (it fits: at most twice the columns).
  auto dy16 = [&](Proj p, Buffer& b, int64_t cols) {
    bool has;
    const LoraRef ref = lora_ref(l, p, &has);
    int64_t ld = be_.grad_16_stride(L.proj[static_cast<int>(p)], has ? &ref : nullptr);
    if (ld < cols || ld > 2 * cols) ld = cols;
    return View2<uint16_t>(b.as<uint16_t>(), R, cols, ld);
  };
  auto lin_bwd16 = [&](Proj p, CMatF x, View2<uint16_t> d16, Buffer& dfp, MatF dx) {
    lin_bwd(p, x, cmat(dfp, R, d16.cols), dx, st ? d16 : View2<uint16_t>());
  };
  View2<uint16_t> dgate16, dup16;
  if (st) {
    dgate16 = dy16(Proj::Gate, g.dgate, c.ffn_dim);
    dup16 = dy16(Proj::Up, g.dup, c.ffn_dim);
    be_.swiglu_bwd_to_16(t16, st->gate.as<uint16_t>(), st->up.as<uint16_t>(),
                         cmat(g.dh, R, c.ffn_dim), dgate16, dup16);
  } else {
    be_.swiglu_bwd(cmat(a.gate, R, c.ffn_dim), cmat(a.up, R, c.ffn_dim), cmat(g.dh, R, c.ffn_dim),
                   mat(g.dgate, R, c.ffn_dim), mat(g.dup, R, c.ffn_dim));
    dgate16 = dup16 = View2<uint16_t>(nullptr, R, c.ffn_dim);
  }
  zero_dx(g.dxn, R * c.dim);
  {
    SharedInput shared(be_, cmat(a.xn2, R, c.dim), t16, st ? h16(st->xn2) : nullptr);
    lin_bwd16(Proj::Gate, cmat(a.xn2, R, c.dim), dgate16, g.dgate, mat(g.dxn, R, c.dim));
    lin_bwd16(Proj::Up, cmat(a.xn2, R, c.dim), dup16, g.dup, mat(g.dxn, R, c.dim));
  }
  be_.rmsnorm_bwd(cmat(a.x_mid, R, c.dim), frozen(L.ffn_norm), a.rstd2.as<float>(),
                  cmat(g.dxn, R, c.dim), G);

  // Attention branch: G is now d/d(x_mid). With st, datt may come rounded into its buffer's
  // memory from the o projection's dx GEMM (Backend::next_dx_16), for attention to take as is.
  zero_dx(g.datt, R * qd);
  const uint16_t* datt16 = nullptr;
  {
    SharedInput shared(be_, cmat(a.att, R, qd), t16, st ? h16(st->att) : nullptr);
    bool has;
    const LoraRef ref = lora_ref(l, Proj::O, &has);
    if (st && be_.next_dx_16(t16, g.datt.as<uint16_t>(), L.proj[static_cast<int>(Proj::O)],
                             has ? &ref : nullptr))
      datt16 = g.datt.as<uint16_t>();
    lin_bwd(Proj::O, cmat(a.att, R, qd), G.as_const(), mat(g.datt, R, qd));
  }
  View2<uint16_t> dq16(nullptr, R, qd), dk16(nullptr, R, kvd), dv16(nullptr, R, kvd);
  if (st) {  // q, k, v and the output are not unpacked: attention reads the stored ones
    be_.attention_inputs_16(t16, st->q.as<uint16_t>(), st->k.as<uint16_t>(), st->v.as<uint16_t>());
    be_.attention_out_16(t16, st->att.as<uint16_t>(), datt16);
    dq16 = dy16(Proj::Q, g.dq, qd);
    dk16 = dy16(Proj::K, g.dk, kvd);
    dv16 = dy16(Proj::V, g.dv, kvd);
    RopeArgs ra;
    ra.pos = pos;
    ra.freqs = &rope_;
    ra.adjacent = c.rope_adjacent;
    be_.attention_bwd_16(shape_, cmat(a.q, R, qd), cmat(a.k, R, kvd), cmat(a.v, R, kvd),
                         cmat(a.att, R, qd), a.lse.as<float>(), cmat(g.datt, R, qd), ra, t16, dq16,
                         dk16, dv16);
  } else {
    zero(g.dq);
    zero(g.dk);
    zero(g.dv);
    be_.attention_bwd(shape_, cmat(a.q, R, qd), cmat(a.k, R, kvd), cmat(a.v, R, kvd),
                      cmat(a.att, R, qd), a.lse.as<float>(), cmat(g.datt, R, qd), mat(g.dq, R, qd),
                      mat(g.dk, R, kvd), mat(g.dv, R, kvd));
    be_.rope(mat(g.dq, R, qd), pos, c.n_heads, c.head_dim, rope_, c.rope_adjacent, true);
    be_.rope(mat(g.dk, R, kvd), pos, c.n_kv_heads, c.head_dim, rope_, c.rope_adjacent, true);
  }
  zero_dx(g.dxn, R * c.dim);
  {
    SharedInput shared(be_, cmat(a.xn1, R, c.dim), t16, st ? h16(st->xn1) : nullptr);
    lin_bwd16(Proj::Q, cmat(a.xn1, R, c.dim), dq16, g.dq, mat(g.dxn, R, c.dim));
    lin_bwd16(Proj::K, cmat(a.xn1, R, c.dim), dk16, g.dk, mat(g.dxn, R, c.dim));
    lin_bwd16(Proj::V, cmat(a.xn1, R, c.dim), dv16, g.dv, mat(g.dxn, R, c.dim));
  }
  if (need_dx)
    be_.rmsnorm_bwd(CMatF(x_in, R, c.dim), frozen(L.attn_norm), a.rstd1.as<float>(),
                    cmat(g.dxn, R, c.dim), G);
}

void LlamaRunner::backward() {
  QLFT_CHECK_ARG(have_forward_, "backward() needs a training forward() first");
  // Copies in: a backward that threw may have left partial sums (resident ones are zeroed by
  // zero_lora_grads at the step's start).
  if (!lora_resident_ && !lora_g_.empty()) lora_g_.zero();
  be_.tracker()->set_phase("backward");
  const ModelConfig& c = model_.cfg;
  const int64_t R = rows_;
  if (!grads_) {
    const Backend& t = be_;
    const MemCategory W = MemCategory::Workspace;
    const std::array<int64_t, 9> n = grad_counts(c, R);
    auto g = std::make_unique<Grads>();
    g->G = make(t, W, n[0], "d residual");
    g->dxn = make(t, W, n[1], "d norm out");
    g->datt = make(t, W, n[2], "d attention out");
    g->dq = make(t, W, n[3], "dq");
    g->dk = make(t, W, n[4], "dk");
    g->dv = make(t, W, n[5], "dv");
    g->dh = make(t, W, n[6], "d swiglu out");
    g->dgate = make(t, W, n[7], "d gate");
    g->dup = make(t, W, n[8], "d up");
    grads_ = std::move(g);
  }
  zero(grads_->G);
  WeightStream* ws = model_.stream.get();
  {
    UnitUse use(ws, head_unit(c.n_layers), layer_unit(c.n_layers - 1));
    be_.rmsnorm_bwd(cmat(resid_[c.n_layers], R, c.dim), frozen(model_.output_norm),
                    rstdf_.as<float>(), cmat(dxnf_, R, c.dim), mat(grads_->G, R, c.dim));
  }
  for (int l = c.n_layers - 1; l >= 0; --l) {
    UnitUse use(ws, layer_unit(l), l > 0 ? layer_unit(l - 1) : kNoUnit);
    if (ckpt_[l]) {
      // Recompute this layer's activations from its saved input (same dropout masks).
      LayerActs& a = acts_for(l, true);
      {
        Buffer tmp = make(be_, MemCategory::Workspace, R * c.dim, "recompute out");
        layer_fwd(l, a, resid_[l].as<float>(), tmp.as<float>());
      }
      if (act_dtype_ != DType::F32) round_stored(a);
      layer_bwd(l, a, resid_[l].as<float>(), l > 0);
    } else if (stored_[l]->half) {
      LayerActs& s = scratch();
      LendFulls lend(stored_[l]->fulls(), s.fulls());
      const bool direct = direct16();
      unpack(*stored_[l], s, direct);
      layer_bwd(l, s, resid_[l].as<float>(), l > 0, direct ? stored_[l].get() : nullptr);
    } else {
      layer_bwd(l, *stored_[l], resid_[l].as<float>(), l > 0);
    }
  }
  lora_grads_to_host();
  have_forward_ = false;
}

// ---- non-finite diagnosis ----------------------------------------------------------------------

namespace {
bool has_nonfinite(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return true;
  return false;
}
// A host copy of a buffer's elements wherever it lives (the diagnosis reads every tensor).
template <class T>
std::vector<T> host_values(const Buffer& b) {
  std::vector<T> v(b.size() / sizeof(T));
  b.copy_to_host(v.data(), v.size() * sizeof(T));
  return v;
}
bool has_nonfinite(const Buffer& b) {
  const std::vector<float> v = host_values<float>(b);
  return has_nonfinite(v.data(), static_cast<int64_t>(v.size()));
}
// A 16-bit buffer: all exponent bits set is inf or NaN.
bool has_nonfinite16(const Buffer& b, DType t) {
  const uint16_t mask = t == DType::BF16 ? 0x7f80 : 0x7c00;
  for (uint16_t x : host_values<uint16_t>(b))
    if ((x & mask) == mask) return true;
  return false;
}
}  // namespace

std::string LlamaRunner::locate_nonfinite(const TokenBatch& b, float grad_scale,
                                          uint64_t dropout_seed) {
  const ModelConfig& c = model_.cfg;
  const std::vector<bool> saved_ckpt = ckpt_;
  auto restore = [&] {
    release();
    ckpt_ = saved_ckpt;
  };
  std::string where;
  try {
    // Every layer stores its activations, so each can be inspected after one plain forward:
    // each tensor is computed from earlier ones, so the first non-finite one in computation
    // order is where the value appeared.
    for (int l = 0; l < c.n_layers; ++l) ckpt_[l] = false;
    stored_.clear();
    zero_lora_grads();
    dropout_seed_ = dropout_seed;
    LossResult res = run_forward(b, true, grad_scale, MatF());
    auto fwd = [&]() -> std::string {
      if (has_nonfinite(resid_[0])) return "token embedding output (forward)";
      for (int l = 0; l < c.n_layers; ++l) {
        LayerActs& a = *stored_[l];
        auto halves = a.halves();
        auto nonfinite = [&](const Buffer* b) {
          const bool half = a.half && std::find(halves.begin(), halves.end(), b) != halves.end();
          return half ? has_nonfinite16(*b, act_dtype_) : has_nonfinite(*b);
        };
        const std::pair<const Buffer*, const char*> order[] = {
            {&a.xn1, "input_layernorm output"},
            {&a.q, "self_attn q_proj output"},
            {&a.k, "self_attn k_proj output"},
            {&a.v, "self_attn v_proj output"},
            {&a.att, "self_attn attention output"},
            {&a.x_mid, "self_attn o_proj output (after the residual add)"},
            {&a.xn2, "post_attention_layernorm output"},
            {&a.gate, "mlp gate_proj output"},
            {&a.up, "mlp up_proj output"},
            {&a.hact, "mlp SwiGLU output"},
            {&resid_[l + 1], "mlp down_proj output (after the residual add)"}};
        for (const auto& [buf, name] : order)
          if (nonfinite(buf)) return strf("layer %d %s (forward)", l, name);
      }
      if (has_nonfinite(xnf_)) return "final norm output (forward)";
      if (!std::isfinite(res.loss_sum)) return "cross-entropy loss of the output head";
      if (has_nonfinite(dxnf_)) return "loss gradient at the output head (backward)";
      return "";
    };
    where = fwd();
    if (where.empty() && lora_) {
      backward();
      // Backward runs from the last layer down and a non-finite gradient spreads to every
      // earlier layer, so the highest layer with one is where it appeared; inside a layer the
      // projections' gradients are computed down, gate, up, o, then q, k, v.
      const Proj order[] = {Proj::Down, Proj::Gate, Proj::Up, Proj::O, Proj::Q, Proj::K, Proj::V};
      for (int l = c.n_layers - 1; l >= 0 && where.empty(); --l)
        for (Proj p : order) {
          const LoraSlot& s = lora_->slot(l, p);
          if (!s.active()) continue;
          const char* group = static_cast<int>(p) < 4 ? "self_attn" : "mlp";
          const char* part = has_nonfinite(s.dB) ? "lora_B" : has_nonfinite(s.dA) ? "lora_A" : "";
          if (*part) {
            where =
                strf("layer %d %s %s %s gradient (backward)", l, group, proj_peft_name(p), part);
            break;
          }
        }
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return where;
}

}  // namespace qlft
