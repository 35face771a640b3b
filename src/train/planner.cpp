#include "train/planner.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/gemm_bf16.h"
#include "backend/softmax_math.h"
#include "config/config.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/json_file.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "optim/adamw8bit.h"
#include "quant/ggml_types.h"
#include "quant/nf4.h"
#include "train/adapter_io.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace qlft {

namespace {

// Bytes the tracker counts for a buffer of n bytes (Buffer rounds up to 64).
uint64_t rb(uint64_t n) {
  return (n + 63) / 64 * 64;
}
uint64_t rb(const Buffer& b) {
  return rb(b.size());
}
uint64_t fl(int64_t floats) {
  return rb(static_cast<uint64_t>(floats) * 4);
}

uint64_t qweight_bytes(const QWeight& w) {
  return rb(w.data) + rb(w.absmax) + rb(w.nested_absmax) + rb(w.code) + rb(w.nested_code) +
         rb(w.scb);
}

// What qweight_from_f32 allocates for a [rows, cols] matrix of the target kind, and the staging
// it holds meanwhile (the f32 copy is the caller's, counted separately).
uint64_t quantized_bytes(QuantKind k, int64_t rows, int64_t cols, int blocksize, bool dq,
                         uint64_t* staging) {
  const int64_t n = rows * cols;
  *staging = 0;
  switch (k) {
    case QuantKind::NF4: {
      const int64_t nb = nf4_num_blocks(n, blocksize);
      uint64_t b = rb(nf4_packed_bytes(n)) + rb(16 * 4);
      if (!dq) return b + fl(nb);
      *staging = fl(nb);  // the float absmax before its second quantization
      return b + rb(nb) + fl(nf4_num_blocks(nb, 256)) + rb(256 * 4);
    }
    case QuantKind::INT8:
      return rb(n) + fl(rows);
    default:
      return fl(n);
  }
}

QuantKind target_kind(const std::string& t) {
  if (t == "nf4") return QuantKind::NF4;
  if (t == "int8") return QuantKind::INT8;
  throw_error(QLFT_ERR_INVALID_ARGUMENT, "quant.type '%s' has no target kind", t.c_str());
}

// The seven projections' [out, in] shapes.
void proj_shapes(const ModelConfig& c, int64_t shapes[kProjCount][2]) {
  const int64_t q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
  const int64_t s[kProjCount][2] = {{q, c.dim},        {kv, c.dim},        {kv, c.dim},
                                    {c.dim, q},        {c.ffn_dim, c.dim}, {c.ffn_dim, c.dim},
                                    {c.dim, c.ffn_dim}};
  std::memcpy(shapes, s, sizeof s);
}

// One linear weight of a file: kept (its own storage) or quantized at load (f32 staging).
void add_linear(WeightFootprint& w, const LoadOptions& o, int64_t rows, int64_t cols,
                uint64_t kept_bytes) {
  if (o.quant_type == "keep") {
    w.bytes += rb(kept_bytes);
    return;
  }
  uint64_t inner = 0;
  w.bytes +=
      quantized_bytes(target_kind(o.quant_type), rows, cols, o.blocksize, o.double_quant, &inner);
  w.load_staging = std::max(w.load_staging, fl(rows * cols) + inner);
}

WeightFootprint gguf_footprint(const std::string& path, const LoadOptions& o, ModelConfig* cfg) {
  auto g = GgufFile::open(path);
  ModelConfig& c = *cfg;
  c.arch = g->get_string("general.architecture");
  const std::string a = c.arch + ".";
  c.n_layers = static_cast<int>(g->get_int_in(a + "block_count", 1, 1024));
  c.dim = static_cast<int>(g->get_int_in(a + "embedding_length", 1, 1 << 20));
  c.ffn_dim = static_cast<int>(g->get_int_in(a + "feed_forward_length", 1, 1 << 20));
  c.n_heads = static_cast<int>(g->get_int_in(a + "attention.head_count", 1, 4096));
  c.n_kv_heads = static_cast<int>(g->get_int_in(a + "attention.head_count_kv", 1, 4096, c.n_heads));
  QLFT_CHECK_FORMAT(c.dim % c.n_heads == 0, "%s: embedding length %d is not a multiple of %d heads",
                    path.c_str(), c.dim, c.n_heads);
  c.head_dim =
      static_cast<int>(g->get_int_in(a + "attention.key_length", 1, 4096, c.dim / c.n_heads));
  c.context_length = static_cast<int>(g->get_int_in(a + "context_length", 1, 1 << 26, 2048));
  const GgufTensorInfo* emb = g->find_tensor("token_embd.weight");
  QLFT_CHECK_FORMAT(emb && emb->ne[0] == c.dim,
                    "%s: tensor 'token_embd.weight' is missing or "
                    "has the wrong width",
                    path.c_str());
  c.vocab = static_cast<int>(emb->ne[1]);
  c.qkv_bias = g->find_tensor("blk.0.attn_q.bias") != nullptr;
  c.tied_embeddings = g->find_tensor("output.weight") == nullptr;

  WeightFootprint w;
  w.bytes += fl(int64_t(c.vocab) * c.dim) + fl(c.dim);  // f32 embedding, output norm
  if (!c.tied_embeddings) w.bytes += fl(int64_t(c.vocab) * c.dim);
  int64_t shapes[kProjCount][2];
  proj_shapes(c, shapes);
  for (int l = 0; l < c.n_layers; ++l) {
    w.bytes += 2 * fl(c.dim);
    const std::string b = "blk." + std::to_string(l) + ".";
    for (int p = 0; p < kProjCount; ++p) {
      const std::string n = b + proj_gguf_name(static_cast<Proj>(p)) + ".weight";
      const GgufTensorInfo* t = g->find_tensor(n);
      QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", path.c_str(), n.c_str());
      const GgmlTypeTraits* tr = ggml_type_traits(t->type);
      QLFT_CHECK_FORMAT(tr, "%s: tensor '%s' has an unknown type", path.c_str(), n.c_str());
      const int64_t rows = shapes[p][0], cols = shapes[p][1];
      const uint64_t kept = t->type == 0 /* F32 */
                                ? uint64_t(rows * cols) * 4
                                : uint64_t(rows * cols) / tr->block * tr->bytes;
      add_linear(w, o, rows, cols, kept);
    }
    if (c.qkv_bias) w.bytes += fl(shapes[0][0]) + 2 * fl(shapes[1][0]);
  }
  return w;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

WeightFootprint hf_footprint(const std::string& path, const LoadOptions& o, ModelConfig* cfg) {
  const std::string dir =
      is_dir(path) ? path
                   : (path.rfind('/') == std::string::npos ? "." : path.substr(0, path.rfind('/')));
  JsonFile cj = JsonFile::load(dir + "/config.json");
  ModelConfig& c = *cfg;
  c.arch = cj.get_string("model_type", "llama");
  c.dim = static_cast<int>(cj.get_int_in("hidden_size", 1, 1 << 20));
  c.ffn_dim = static_cast<int>(cj.get_int_in("intermediate_size", 1, 1 << 20));
  c.n_layers = static_cast<int>(cj.get_int_in("num_hidden_layers", 1, 1024));
  c.n_heads = static_cast<int>(cj.get_int_in("num_attention_heads", 1, 4096));
  c.n_kv_heads = static_cast<int>(cj.get_int_in("num_key_value_heads", 1, 4096, c.n_heads));
  c.vocab = static_cast<int>(cj.get_int_in("vocab_size", 1, 1 << 24));
  QLFT_CHECK_FORMAT(c.dim % c.n_heads == 0, "%s: hidden_size %d is not a multiple of %d heads",
                    dir.c_str(), c.dim, c.n_heads);
  c.head_dim = static_cast<int>(cj.get_int_in("head_dim", 1, 4096, c.dim / c.n_heads));
  auto st = SafetensorsSet::open(is_dir(path) ? dir : path);
  c.tied_embeddings = cj.get_bool("tie_word_embeddings", false) || !st->find("lm_head.weight");
  c.qkv_bias = c.arch == "qwen2" || cj.get_bool("attention_bias", false) ||
               st->find("model.layers.0.self_attn.q_proj.bias") != nullptr;
  WeightFootprint w;
  w.bytes += fl(int64_t(c.vocab) * c.dim) + fl(c.dim);
  if (!c.tied_embeddings) w.bytes += fl(int64_t(c.vocab) * c.dim);
  int64_t shapes[kProjCount][2];
  proj_shapes(c, shapes);
  for (int l = 0; l < c.n_layers; ++l) {
    w.bytes += 2 * fl(c.dim);
    const std::string b = "model.layers." + std::to_string(l) + ".";
    for (int p = 0; p < kProjCount; ++p) {
      const std::string n =
          b + (p < 4 ? "self_attn." : "mlp.") + proj_peft_name(static_cast<Proj>(p)) + ".weight";
      const SafeTensorInfo* t = st->find(n);
      QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", dir.c_str(), n.c_str());
      const int64_t rows = shapes[p][0], cols = shapes[p][1];
      if (t->dtype == DType::U8 || t->dtype == DType::I8) {
        // bitsandbytes pre-quantized: stored as in the file (plus small quant state).
        w.bytes += rb(t->nbytes) + (t->dtype == DType::I8 ? fl(rows) : rb(16 * 4));
        continue;
      }
      const bool half = t->dtype == DType::F16 || t->dtype == DType::BF16;
      add_linear(w, o, rows, cols, uint64_t(rows * cols) * (half ? 2 : 4));
    }
    if (c.qkv_bias) w.bytes += fl(shapes[0][0]) + 2 * fl(shapes[1][0]);
  }
  return w;
}

// ---- workspace of the CPU backend's kernels ----------------------------------------------------

struct WsModel {
  const PlanSettings& s;
  int threads;
  bool autocast;  // fp16 (and bf16 without a native CPU path): rounded fp32 copies of inputs
  bool lp;        // bf16: the CPU backend's own bf16 GEMM operands
  int64_t eb;     // bytes of an lp element: 2 (oneDNN bf16) or 4 (rounded fp32 for sgemm)
  int r;
  bool dropout;

  int64_t panel_rows(int64_t rows, int64_t cols) const {
    int64_t p = s.tune.panel_bytes / std::max<int64_t>(1, cols * 4);
    p = std::clamp<int64_t>(p, std::max<int64_t>(1, s.tune.panel_min_rows),
                            std::max<int64_t>(1, s.tune.panel_max_rows));
    return std::min<int64_t>(p, std::max<int64_t>(rows, 1));
  }
  // As cpu::panel_rows_lp: the same bytes, so bf16 panels hold twice the rows.
  int64_t panel_rows_lp(int64_t rows, int64_t cols) const {
    int64_t p = s.tune.panel_bytes / std::max<int64_t>(1, cols * eb);
    const int64_t lo = std::max<int64_t>(1, s.tune.panel_min_rows);
    const int64_t hi = std::max<int64_t>(1, s.tune.panel_max_rows * (4 / eb));
    p = std::clamp<int64_t>(p, lo, std::max(lo, hi));
    return std::min<int64_t>(p, std::max<int64_t>(rows, 1));
  }
  uint64_t lpm(int64_t elems) const { return rb(uint64_t(elems) * eb); }
  int64_t drop_rows(int64_t M, int64_t K) const {
    return std::min(M, std::max<int64_t>(1, s.tune.drop_chunk_bytes / std::max<int64_t>(1, K * 4)));
  }
  // linear_fwd of W [N, K] on M rows with xa kept by the caller: the weight panel, then (apart
  // from it) the dropout chunk of the LoRA input; autocast holds a rounded copy of x.
  uint64_t lin_fwd(int64_t N, int64_t K, int64_t M, bool lora) const {
    const uint64_t drop = lora && dropout ? fl(drop_rows(M, K) * K) : 0;
    if (lp) {
      // x as lp, with the lp panel; then x widened to fp32 for the LoRA GEMMs (a copy only
      // when lp holds bf16), briefly beside the lp x, then beside the dropout chunk.
      const uint64_t xl = lpm(M * K), xr = lora && eb == 2 ? fl(M * K) : 0;
      const uint64_t lora_part = lora ? std::max(xl + xr, (eb == 2 ? xr : xl) + drop) : 0;
      return std::max(xl + lpm(panel_rows_lp(N, K) * K), lora_part);
    }
    const uint64_t ws = std::max(fl(panel_rows(N, K) * K), drop);
    return ws + (autocast ? fl(M * K) : 0);
  }
  // linear_bwd with dx wanted: the panel; then dy B and the dropout chunks (for dA and dx).
  uint64_t lin_bwd(int64_t N, int64_t K, int64_t M, bool lora) const {
    const uint64_t lora_ws = lora ? fl(M * r) + (dropout ? 2 * fl(drop_rows(M, K) * K) : 0) : 0;
    if (lp) {
      // dy as lp with the lp panel; for LoRA dy widened (a copy when lp is bf16) beside it,
      // then the lp dy goes and x rounded to fp32 joins for the LoRA gradients.
      const uint64_t dyl = lpm(M * N), dyr = eb == 2 ? fl(M * N) : 0;
      const uint64_t lora_part =
          lora ? std::max(dyl + dyr, (eb == 2 ? dyr : dyl) + fl(M * K) + lora_ws) : 0;
      return std::max(dyl + lpm(panel_rows_lp(N, K) * K), lora_part);
    }
    const uint64_t ws = std::max(fl(panel_rows(N, K) * K), lora_ws);
    return ws + (autocast ? fl(M * K) + fl(M * N) : 0);
  }
  // The rope cos/sin table: one row per distinct position (positions 0 .. T-1 here).
  uint64_t rope(const ModelConfig& c, int64_t T) const { return fl(T * (c.head_dim / 2) * 2); }
  uint64_t attn_fwd(const ModelConfig& c, int64_t B, int64_t T) const {
    const int64_t R = B * T, bq = std::max<int64_t>(1, s.tune.attn_block_q);
    const int64_t nqb = (T + bq - 1) / bq;
    const int64_t nt = std::min<int64_t>(threads, B * c.n_heads * nqb);
    const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
    const bool round = autocast || lp;  // attention inputs are rounded copies either way
    return rb(uint64_t(R) * 4) + fl(nt * bq * T) + (round ? fl(R * qd) + 2 * fl(R * kvd) : 0);
  }
  uint64_t attn_bwd(const ModelConfig& c, int64_t B, int64_t T) const {
    const int64_t R = B * T, bq = std::max<int64_t>(1, s.tune.attn_block_q);
    const int64_t nt = std::min<int64_t>(threads, B * c.n_kv_heads);
    const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
    const bool round = autocast || lp;
    return rb(uint64_t(R) * 4) + fl(nt * (2 * bq * T + bq)) +
           (round ? 2 * fl(R * qd) + 2 * fl(R * kvd) : 0);
  }
  // Fused linear + cross-entropy with dh, every target trained (the most rows per chunk).
  uint64_t cross_entropy(const ModelConfig& c, int64_t R) const {
    const int64_t V = c.vocab, H = c.dim, P = lp ? panel_rows_lp(V, H) : panel_rows(V, H);
    int64_t rc = std::min(s.tune.ce_logits_bytes / (P * 4),
                          s.tune.ce_hidden_bytes / std::max<int64_t>(1, H * 4));
    rc = std::clamp<int64_t>(rc, 1, R);
    const int64_t e = lp ? eb : 4;
    return rb(uint64_t(P * H * e)) + fl(rc * P) + rb(uint64_t(rc * H * e)) +
           (lp && eb == 2 ? rb(uint64_t(rc * P) * 2) : 0) + fl(rc * H) +
           rb(uint64_t(rc) * (sizeof(OnlineSoftmax<double>) + 8)) + (autocast ? fl(R * H) : 0);
  }
};

uint64_t optimizer_bytes(const std::string& name, uint64_t numel) {
  if (name == "adamw") return 2 * fl(int64_t(numel));
  const bool paged = name == "paged_adamw8bit";
  QLFT_CHECK_ARG(paged || name == "adamw8bit",
                 "optim.name must be one of adamw|adamw8bit|paged_adamw8bit, got '%s'",
                 name.c_str());
  // The paged store counts exact bytes; the host store rounds like Buffer.
  auto cnt = [&](uint64_t b) { return paged ? b : rb(b); };
  if (static_cast<int64_t>(numel) < kAdam8bitMinElements) return 2 * cnt(numel * 4);
  const uint64_t blocks = (numel + kAdam8bitBlock - 1) / kAdam8bitBlock;
  return 2 * cnt(numel) + 2 * cnt(blocks * 4);
}

}  // namespace

WeightFootprint weight_footprint(const Model& m) {
  WeightFootprint w;
  w.bytes = qweight_bytes(m.tok_embd) + qweight_bytes(m.output) + rb(m.output_norm);
  for (const LayerWeights& l : m.layers) {
    w.bytes += rb(l.attn_norm) + rb(l.ffn_norm);
    for (const QWeight& q : l.proj) {
      w.bytes += qweight_bytes(q);
      if (q.kind == QuantKind::NF4 || q.kind == QuantKind::INT8) {
        const int64_t nb = nf4_num_blocks(q.numel(), q.blocksize);
        w.load_staging =
            std::max(w.load_staging,
                     fl(q.numel()) + (q.kind == QuantKind::NF4 && q.double_quant ? fl(nb) : 0));
      }
    }
    for (const Buffer& b : l.bias) w.bytes += rb(b);
  }
  return w;
}

WeightFootprint weight_footprint_of_file(const std::string& path, const LoadOptions& opt,
                                         ModelConfig* cfg) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw_error(QLFT_ERR_IO, "%s: no such file or directory", path.c_str());
  const bool gguf = path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
  return gguf ? gguf_footprint(path, opt, cfg) : hf_footprint(path, opt, cfg);
}

PlanSettings PlanSettings::from_config(const Config& c) {
  PlanSettings s;
  s.precision = c.get("train.precision");
  s.checkpoint_every = static_cast<int>(c.get_int("train.grad_checkpointing"));
  s.seq_len = static_cast<int>(c.get_int("data.seq_len"));
  const std::string mb = c.get("train.micro_batch");
  s.micro_batch = mb == "auto" ? 1 : static_cast<int>(c.get_int("train.micro_batch"));
  s.accumulation = static_cast<int>(c.get_int("train.accumulation"));
  s.optimizer = c.get("optim.name");
  s.lora = lora_config_from(c);
  const std::string init_from = c.get("lora.init_from");
  if (!init_from.empty()) s.lora = read_peft_config(init_from);
  s.threads = static_cast<int>(c.get_int("threads"));
  return s;
}

MemoryPlan plan_memory(const ModelConfig& c, const WeightFootprint& w, const PlanSettings& s) {
  QLFT_CHECK_ARG(s.micro_batch > 0 && s.seq_len > 0,
                 "memory plan: micro_batch %d and seq_len %d "
                 "must be positive",
                 s.micro_batch, s.seq_len);
  const int64_t B = s.micro_batch, T = s.seq_len, R = B * T;
  const LoraConfig& lc = s.lora;
  int projs = 0;
  for (bool t : lc.targets) projs += t ? 1 : 0;

  MemoryPlan p;
  auto& cat = p.train;
  cat[int(MemCategory::Weights)] = w.bytes;

  // LoRA A [r, in], B [out, r] per targeted projection, their gradients, optimizer state.
  int64_t shapes[kProjCount][2];
  proj_shapes(c, shapes);
  uint64_t adapter = 0, optim = 0;
  for (int q = 0; q < kProjCount; ++q) {
    if (!lc.targets[q]) continue;
    const int64_t a = int64_t(lc.r) * shapes[q][1], b = shapes[q][0] * int64_t(lc.r);
    adapter += fl(a) + fl(b);
    optim += optimizer_bytes(s.optimizer, a) + optimizer_bytes(s.optimizer, b);
  }
  cat[int(MemCategory::Adapter)] = adapter * c.n_layers;
  cat[int(MemCategory::Gradients)] = adapter * c.n_layers;
  cat[int(MemCategory::Optimizer)] = optim * c.n_layers;

  // Activations: the runner's own sizes.
  const RunnerFootprint f = LlamaRunner::footprint(c, lc.r, projs, R, true, /*doc_ids=*/true,
                                                   activation_dtype(s.precision));
  int ckpt = 0;
  if (s.checkpoint_every > 0) ckpt = (c.n_layers + s.checkpoint_every - 1) / s.checkpoint_every;
  const int stored = c.n_layers - ckpt;
  cat[int(MemCategory::Activations)] = f.activations(stored, ckpt);

  // Workspace: the largest set alive at once. Forward holds one kernel's scratch at a time; the
  // head's cross-entropy runs at the end of forward; backward adds its temporaries to one
  // kernel's scratch (or to a checkpointed layer's recompute).
  int threads = s.threads;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_max_threads();
#endif
  if (threads <= 0) threads = 1;
  // bf16 runs the CPU backend's own bf16 GEMMs (as the trainer sets it up); fp16 autocasts.
  const bool bf16 = s.precision == "bf16";
  const int64_t eb = bf16 && cpu::gemm_bf16_native() ? 2 : 4;
  WsModel m{s, threads, s.precision == "fp16", bf16, eb, lc.r, lc.dropout > 0.f};
  uint64_t fwd = std::max(m.attn_fwd(c, B, T), m.rope(c, T));
  uint64_t bwd = std::max(m.attn_bwd(c, B, T), m.rope(c, T));
  for (int q = 0; q < kProjCount; ++q) {
    fwd = std::max(fwd, m.lin_fwd(shapes[q][0], shapes[q][1], R, lc.targets[q]));
    bwd = std::max(bwd, m.lin_bwd(shapes[q][0], shapes[q][1], R, lc.targets[q]));
  }
  // The backward temporaries stay allocated until the step ends: with accumulation, the next
  // micro-batch's forward runs beside them.
  const uint64_t held = s.accumulation > 1 ? f.backward_ws : 0;
  const uint64_t back = std::max(bwd, ckpt > 0 ? f.recompute_ws + fwd : 0);
  cat[int(MemCategory::Workspace)] =
      std::max({held + fwd, held + m.cross_entropy(c, R), f.backward_ws + back});

  for (uint64_t v : cat) p.train_peak += v;
  p.load_peak = w.bytes + w.load_staging;
  p.peak = cat;
  p.peak[int(MemCategory::Workspace)] =
      std::max(p.peak[int(MemCategory::Workspace)], w.load_staging);
  p.total_peak = std::max(p.train_peak, p.load_peak);
  return p;
}

int plan_max_micro_batch(const ModelConfig& mc, const WeightFootprint& w, PlanSettings s,
                         uint64_t budget, int upper) {
  int lo = 0, hi = std::max(upper, 0) + 1;  // lo fits (0: nothing known), hi does not
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    s.micro_batch = mid;
    if (plan_memory(mc, w, s).train_peak <= budget)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace qlft
