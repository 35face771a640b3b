// The weight side of the memory planner (train/planner.h): what a model's base weights hold, from
// a loaded model's buffers or, without loading, from the file's tensor shapes and types with the
// quant.* settings (GGUF header, or config.json + safetensors headers), group by group as the
// weight streams and ZeRO-3 see them, with what a device backend copies of each.
#include "train/planner.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "arch/families.h"
#include "backend/workspace_model.h"
#include "core/error.h"
#include "core/path.h"
#include "parallel/zero3_stream.h"
#include "formats/gguf.h"
#include "formats/json_file.h"
#include "formats/safetensors.h"
#include "quant/ggml_types.h"
#include "quant/nf4.h"

namespace qlft {

namespace {

constexpr auto rb = buffer_bytes;
constexpr auto fl = float_buffer_bytes;

// What qweight_from_f32 allocates for a [rows, cols] matrix of the target kind, and the staging
// it holds meanwhile (the f32 copy is the caller's, counted separately).
// Its buffers' sizes go to *slots (unrounded, as ZeRO-3 flattens them).
uint64_t quantized_bytes(QuantKind k, int64_t rows, int64_t cols, int blocksize, bool dq,
                         uint64_t* staging, std::vector<uint64_t>* slots) {
  const int64_t n = rows * cols;
  *staging = 0;
  std::vector<uint64_t> b;
  switch (k) {
    case QuantKind::NF4: {
      const int64_t nb = nf4_num_blocks(n, blocksize);
      b = {uint64_t(nf4_packed_bytes(n)), 16 * 4};
      if (!dq) {
        b.push_back(uint64_t(nb) * 4);
      } else {
        *staging = fl(nb);  // the float absmax before its second quantization
        b.insert(b.end(), {uint64_t(nb), uint64_t(nf4_num_blocks(nb, 256)) * 4, 256 * 4});
      }
      break;
    }
    case QuantKind::INT8:
      b = {uint64_t(n), uint64_t(rows) * 4};
      break;
    default:
      b = {uint64_t(n) * 4};
  }
  uint64_t total = 0;
  for (uint64_t x : b) total += rb(x);
  slots->insert(slots->end(), b.begin(), b.end());
  return total;
}

// A buffer of `bytes` in group g of the footprint (kept: the file's bytes unchanged).
void add_slot(WeightFootprint& w, size_t g, uint64_t bytes, bool kept = false) {
  if (bytes == 0) return;
  w.bytes += rb(bytes);
  w.groups[g].push_back(bytes);
  if (kept) {
    w.kept.resize(w.groups.size());
    w.kept[g].resize(w.groups[g].size(), 0);
    w.kept[g].back() = 1;
  }
}

// A block a device backend makes of a weight (its resident copy).
void add_device(WeightFootprint& w, uint64_t bytes) {
  if (bytes) w.device_slots.push_back(bytes);
}

// The resident copy of a [rows, cols] matrix of kind k: its data and its scales (INT8 one float
// per row; NF4 one float per block, or double-quantized (dq) as the host keeps it: one block of
// the 8-bit codes, a float per 256 of them and the 256-entry code book, each 16-aligned, as
// CudaBackend::resident uploads it).
void add_device_matrix(WeightFootprint& w, QuantKind k, int64_t rows, int64_t cols, int blocksize,
                       uint64_t data_bytes, bool dq) {
  add_device(w, data_bytes);
  const uint64_t nb = uint64_t(nf4_num_blocks(rows * cols, blocksize));
  auto a16 = [](uint64_t b) { return (b + 15) / 16 * 16; };
  if (k == QuantKind::NF4)
    add_device(
        w, dq ? a16(nb) + a16(uint64_t(nf4_num_blocks(int64_t(nb), 256)) * 4) + 256 * 4 : nb * 4);
  if (k == QuantKind::INT8) add_device(w, uint64_t(rows) * 4);
}

// A buffer of `bytes` in group g that a device backend also copies as it is (f32 norms, biases,
// embedding and head).
void add_slot_dev(WeightFootprint& w, size_t g, uint64_t bytes, bool kept = false) {
  add_slot(w, g, bytes, kept);
  add_device(w, bytes);
}

// One linear weight of a file: kept (its own storage) or quantized at load (f32 staging).
void add_linear(WeightFootprint& w, size_t g, const LoadOptions& o, int64_t rows, int64_t cols,
                uint64_t kept_bytes, bool kept_as_stored = false) {
  if (o.quant_type == QuantType::Keep) {
    add_slot(w, g, kept_bytes, kept_as_stored);
    add_device(w, kept_bytes);
    return;
  }
  const QuantKind k = quantized_kind(o.quant_type);
  add_device_matrix(
      w, k, rows, cols, o.blocksize,
      k == QuantKind::NF4 ? uint64_t(nf4_packed_bytes(rows * cols)) : uint64_t(rows * cols),
      o.double_quant);
  uint64_t inner = 0;
  w.bytes += quantized_bytes(quantized_kind(o.quant_type), rows, cols, o.blocksize, o.double_quant,
                             &inner, &w.groups[g]);
  w.load_staging = std::max(w.load_staging, fl(rows * cols) + inner);
}

// The fixed buffers of a model file's footprint: embedding, norms, untied head (all f32).
void add_fixed(WeightFootprint& w, const ModelConfig& c) {
  w.groups.assign(static_cast<size_t>(c.n_layers) + 2, {});
  w.tied = c.tied_embeddings;
  const size_t head = static_cast<size_t>(c.n_layers) + 1;
  w.device_f32_tables.push_back(w.device_slots.size());
  add_slot_dev(w, 0, uint64_t(c.vocab) * c.dim * 4);
  add_slot_dev(w, head, uint64_t(c.dim) * 4);
  if (!c.tied_embeddings) {
    w.device_f32_tables.push_back(w.device_slots.size());
    add_slot_dev(w, head, uint64_t(c.vocab) * c.dim * 4);
  }
  w.f32_rows = c.vocab;
  w.row_bytes = uint64_t(c.dim) * 4;
}

// A mixture-of-experts layer's router (f32, as the HF loader keeps it) and its experts, each
// w1, w3, w2 one linear weight stored with es bytes an element: all experts resident.
void add_experts(WeightFootprint& w, size_t g, const LoadOptions& o, const LayerShapes& ls,
                 uint64_t es) {
  if (!ls.moe()) return;
  add_slot_dev(w, g, uint64_t(ls.n_experts) * uint64_t(ls.norm) * 4);
  const int64_t f = ls.expert_ffn, d = ls.norm;
  for (int e = 0; e < ls.n_experts; ++e)
    for (const auto& [rows, cols] : {std::pair{f, d}, std::pair{f, d}, std::pair{d, f}})
      add_linear(w, g, o, rows, cols, uint64_t(rows * cols) * es);
}

// kept[j]: bias j is the file's bytes unchanged.
void add_biases(WeightFootprint& w, size_t g, const LayerShapes& ls, const bool kept[3] = nullptr) {
  for (int j = 0; j < 3; ++j) add_slot_dev(w, g, uint64_t(ls.proj[j].out) * 4, kept && kept[j]);
}
// The per-head q / k norms (qwen3), f32 [qk_norm] each, after the biases as the model lists
// them (for_each_weight_buffer); kept[j]: norm j is the file's bytes unchanged.
// Then gemma's post-attention / post-feedforward norms, f32 [post_norm] each (kept[2..3]).
void add_qk_norms(WeightFootprint& w, size_t g, const LayerShapes& ls,
                  const bool kept[4] = nullptr) {
  for (int j = 0; j < 2 && ls.qk_norm; ++j)
    add_slot_dev(w, g, uint64_t(ls.qk_norm) * 4, kept && kept[j]);
  for (int j = 2; j < 4 && ls.post_norm; ++j)
    add_slot_dev(w, g, uint64_t(ls.post_norm) * 4, kept && kept[j]);
}

// The file's tensor holding projection p of layer l (GGUF or HF name) and its row count: the
// projection's own, or (ArchFamily::fused: phi3) the q / k / v or gate / up matrix it is a row
// block of, which the loaders split (kept as f32 from GGUF, as stored from safetensors).
// hf_prefix: ModelConfig::hf_prefix; empty for GGUF.
std::pair<std::string, int64_t> proj_tensor(const ModelShapes& sh, int l, Proj p,
                                            const std::string& hf_prefix) {
  const ArchFamily* fam = find_family(sh.arch);
  const bool gguf = hf_prefix.empty();
  const std::string b = (gguf ? "blk." : hf_prefix + "layers.") + std::to_string(l) + ".";
  if (fam && fam->fused && p != Proj::O && p != Proj::Down) {
    if (p <= Proj::V)
      return {b + (gguf ? "attn_qkv" : "self_attn.qkv_proj") + ".weight",
              sh.proj(l, Proj::Q).out + sh.proj(l, Proj::K).out + sh.proj(l, Proj::V).out};
    return {b + (gguf ? "ffn_up" : "mlp.gate_up_proj") + ".weight", 2 * sh.proj(l, p).out};
  }
  if (gguf) return {b + proj_gguf_name(p) + ".weight", sh.proj(l, p).out};
  return {b + (p <= Proj::O ? "self_attn." : "mlp.") + proj_peft_name(p) + ".weight",
          sh.proj(l, p).out};
}
bool fused_part(const ModelShapes& sh, Proj p) {
  const ArchFamily* fam = find_family(sh.arch);
  return fam && fam->fused && p != Proj::O && p != Proj::Down;
}

WeightFootprint gguf_footprint(const std::string& path, const LoadOptions& o, ModelConfig* cfg) {
  auto g = GgufFile::open(path);
  // The loader's reading and checks (model.h): estimate refuses what load refuses.
  ModelConfig& c = *cfg;
  c = read_gguf_config(*g);
  const ModelShapes sh = model_shapes(c);
  const GgufTensorInfo* emb = g->find_tensor("token_embd.weight");

  WeightFootprint w;
  add_fixed(w, c);  // f32 embedding, output norm (and head)
  // Which buffers a load holds as the file's bytes (model/model.h gguf_kept_as_stored).
  auto kept = [&](const std::string& name, bool linear) {
    const GgufTensorInfo* t = g->find_tensor(name);
    return t && gguf_kept_as_stored(*t, linear, o);
  };
  const size_t last = static_cast<size_t>(c.n_layers) + 1;
  w.kept.assign(w.groups.size(), {});
  w.kept[0] = {uint8_t(kept("token_embd.weight", false))};
  w.kept[last] = {uint8_t(kept("output_norm.weight", false))};
  if (!c.tied_embeddings) w.kept[last].push_back(uint8_t(kept("output.weight", false)));
  // The embedding and an untied head as the file keeps them.
  auto stored_row = [&](const GgufTensorInfo* t) {
    QWeight stored;
    stored.cols = c.dim;
    if (t->type != 0 /* F32 */) {
      stored.kind = QuantKind::GGML;
      stored.ggml_type = t->type;
    }
    return stored_row_bytes(stored);
  };
  w.emb_stored_row_bytes = stored_row(emb);
  if (const GgufTensorInfo* head = g->find_tensor("output.weight"))
    w.head_stored_row_bytes = stored_row(head);
  for (int l = 0; l < c.n_layers; ++l) {
    const size_t gi = static_cast<size_t>(l) + 1;
    const std::string b = "blk." + std::to_string(l) + ".";
    add_slot_dev(w, gi, uint64_t(c.dim) * 4, kept(b + "attn_norm.weight", false));
    add_slot_dev(w, gi, uint64_t(c.dim) * 4, kept(b + "ffn_norm.weight", false));
    for (int p = 0; p < kProjCount; ++p) {
      if (!sh.proj(l, static_cast<Proj>(p)).out) continue;  // an MoE layer's dense MLP
      const auto [n, file_rows] = proj_tensor(sh, l, static_cast<Proj>(p), "");
      const GgufTensorInfo* t = g->find_tensor(n);
      QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", path.c_str(), n.c_str());
      const GgmlTypeTraits* tr = ggml_type_traits(t->type);
      QLFT_CHECK_FORMAT(tr, "%s: tensor '%s' has an unknown type", path.c_str(), n.c_str());
      const int64_t rows = sh.proj(l, static_cast<Proj>(p)).out,
                    cols = sh.proj(l, static_cast<Proj>(p)).in;
      QLFT_CHECK_FORMAT(t->ne[0] == cols && t->ne[1] == file_rows && t->ne[2] == 1 && t->ne[3] == 1,
                        "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
                        path.c_str(), n.c_str(), static_cast<long long>(t->ne[0]),
                        static_cast<long long>(t->ne[1]), static_cast<long long>(cols),
                        static_cast<long long>(file_rows));
      const bool fused = fused_part(sh, static_cast<Proj>(p));  // a row block, kept as f32
      const uint64_t kept_bytes = t->type == 0 /* F32 */ || fused
                                      ? uint64_t(rows * cols) * 4
                                      : uint64_t(rows * cols) / tr->block * tr->bytes;
      add_linear(w, gi, o, rows, cols, kept_bytes, !fused && gguf_kept_as_stored(*t, true, o));
    }
    if (c.qkv_bias) {
      const bool kb[3] = {kept(b + "attn_q.bias", false), kept(b + "attn_k.bias", false),
                          kept(b + "attn_v.bias", false)};
      add_biases(w, gi, sh.layers[size_t(l)], kb);
    }
    const bool kn[4] = {
        kept(b + "attn_q_norm.weight", false), kept(b + "attn_k_norm.weight", false),
        kept(b + "post_attention_norm.weight", false), kept(b + "post_ffw_norm.weight", false)};
    add_qk_norms(w, gi, sh.layers[size_t(l)], kn);
    // llama.cpp's experts, after the rest as the model lists them: the router, then each
    // expert's w1 / w3 / w2, a block of rows of ffn_{gate,up,down}_exps.
    const LayerShapes& ls = sh.layers[size_t(l)];
    if (!ls.moe()) continue;
    add_slot_dev(w, gi, uint64_t(ls.n_experts) * uint64_t(ls.norm) * 4,
                 kept(b + "ffn_gate_inp.weight", false));
    for (int e = 0; e < ls.n_experts; ++e)
      for (const char* n : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}) {
        const GgufTensorInfo* t = g->find_tensor(b + n);
        QLFT_CHECK_FORMAT(t && ggml_type_traits(t->type), "%s: tensor '%s' is missing",
                          path.c_str(), (b + n).c_str());
        const GgmlTypeTraits* tr = ggml_type_traits(t->type);
        const bool down = n[4] == 'd';
        const int64_t rows = down ? ls.norm : ls.expert_ffn, cols = down ? ls.expert_ffn : ls.norm;
        const uint64_t kept_bytes = t->type == 0 /* F32 */
                                        ? uint64_t(rows * cols) * 4
                                        : uint64_t(rows * cols) / tr->block * tr->bytes;
        add_linear(w, gi, o, rows, cols, kept_bytes, gguf_kept_as_stored(*t, true, o));
      }
  }
  return w;
}

// The bytes per element config.json says the checkpoint stores (transformers 5 writes "dtype",
// earlier versions "torch_dtype"); bf16 when it says nothing, as published checkpoints are.
int stored_element_bytes(const JsonFile& cj) {
  const std::string key = cj.has("dtype") ? "dtype" : "torch_dtype";
  const std::string t = cj.get_string(key.c_str(), "bfloat16");
  if (t == "bfloat16" || t == "float16") return 2;
  if (t == "float32") return 4;
  throw_error(QLFT_ERR_FORMAT, "%s: %s '%s' is not bfloat16, float16 or float32", cj.path().c_str(),
              key.c_str(), t.c_str());
}

// Planning from config.json alone (a directory without safetensors: "does it fit" before the
// download): every tensor as config.json's dtype stores it, projections quantized on load by
// the quant.* settings, or bitsandbytes 4-bit / 8-bit pre-quantized when its
// quantization_config says so (packed as the bnb loader keeps them).
WeightFootprint config_only_footprint(const JsonFile& cj, const LoadOptions& o,
                                      const ModelConfig& c) {
  const ModelShapes sh = model_shapes(c);
  const uint64_t es = uint64_t(stored_element_bytes(cj));
  QuantKind bnb = QuantKind::F32;  // F32: not pre-quantized
  bool bnb_dq = false;             // its 4-bit absmax double-quantized
  if (cj.root().contains("quantization_config")) {
    const auto& q = cj.root()["quantization_config"];
    if (q.is_object() && q.value("quant_method", "") == "bitsandbytes")
      bnb = q.value("load_in_4bit", false)   ? QuantKind::NF4
            : q.value("load_in_8bit", false) ? QuantKind::INT8
                                             : QuantKind::F32;
    bnb_dq = q.is_object() && q.value("bnb_4bit_use_double_quant", false);
  }
  WeightFootprint w;
  add_fixed(w, c);
  w.emb_stored_row_bytes = uint64_t(c.dim) * es;
  if (!c.tied_embeddings) w.head_stored_row_bytes = uint64_t(c.dim) * es;
  for (int l = 0; l < c.n_layers; ++l) {
    const size_t g = static_cast<size_t>(l) + 1;
    add_slot_dev(w, g, uint64_t(c.dim) * 4);
    add_slot_dev(w, g, uint64_t(c.dim) * 4);
    for (int p = 0; p < kProjCount; ++p) {
      const int64_t rows = sh.proj(l, static_cast<Proj>(p)).out,
                    cols = sh.proj(l, static_cast<Proj>(p)).in;
      if (!rows) continue;  // (an MoE layer's dense MLP: add_experts)
      if (bnb != QuantKind::F32) {
        const uint64_t packed =
            bnb == QuantKind::NF4 ? uint64_t(rows * cols + 1) / 2 : uint64_t(rows * cols);
        add_slot(w, g, packed);
        add_slot(w, g, bnb == QuantKind::INT8 ? uint64_t(rows) * 4 : 16 * 4);
        add_device_matrix(w, bnb, rows, cols, o.blocksize, packed, bnb_dq);
        continue;
      }
      add_linear(w, g, o, rows, cols, uint64_t(rows * cols) * es);
    }
    add_experts(w, g, o, sh.layers[size_t(l)], es);
    if (c.qkv_bias) add_biases(w, g, sh.layers[size_t(l)]);
    add_qk_norms(w, g, sh.layers[size_t(l)]);
  }
  return w;
}

WeightFootprint hf_footprint(const std::string& path, const LoadOptions& o, ModelConfig* cfg) {
  const std::string dir = is_dir(path) ? path : dirname_of(path);
  JsonFile cj = JsonFile::load(dir + "/config.json");
  ModelConfig& c = *cfg;
  if (is_dir(path) && !path_exists(dir + "/model.safetensors") &&
      !path_exists(dir + "/model.safetensors.index.json")) {
    c = read_hf_config(cj, dir, nullptr);
    return config_only_footprint(cj, o, c);
  }
  std::unique_ptr<SafetensorsSet> st;
  c = read_hf_config(cj, is_dir(path) ? dir : path, &st);
  const ModelShapes sh = model_shapes(c);
  WeightFootprint w;
  add_fixed(w, c);
  auto stored_row = [&](const SafeTensorInfo* t) {  // f64 is kept as f32
    return uint64_t(c.dim) * (t->dtype == DType::F16 || t->dtype == DType::BF16 ? 2 : 4);
  };
  if (const SafeTensorInfo* e = st->find(c.hf_prefix + "embed_tokens.weight"))
    w.emb_stored_row_bytes = stored_row(e);
  if (const SafeTensorInfo* h = st->find(c.hf_head)) w.head_stored_row_bytes = stored_row(h);
  for (int l = 0; l < c.n_layers; ++l) {
    const size_t g = static_cast<size_t>(l) + 1;
    add_slot_dev(w, g, uint64_t(c.dim) * 4);
    add_slot_dev(w, g, uint64_t(c.dim) * 4);
    for (int p = 0; p < kProjCount; ++p) {
      if (!sh.proj(l, static_cast<Proj>(p)).out) continue;  // (an MoE layer: add_experts)
      const auto [n, file_rows] = proj_tensor(sh, l, static_cast<Proj>(p), c.hf_prefix);
      const SafeTensorInfo* t = st->find(n);
      QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", dir.c_str(), n.c_str());
      const int64_t rows = sh.proj(l, static_cast<Proj>(p)).out,
                    cols = sh.proj(l, static_cast<Proj>(p)).in;
      if (t->dtype == DType::U8 || t->dtype == DType::I8) {
        // bitsandbytes pre-quantized: stored as in the file (plus small quant state).
        add_slot(w, g, t->nbytes);
        add_slot(w, g, t->dtype == DType::I8 ? uint64_t(rows) * 4 : 16 * 4);
        add_device_matrix(w, t->dtype == DType::I8 ? QuantKind::INT8 : QuantKind::NF4, rows, cols,
                          o.blocksize, t->nbytes, st->find(n + ".nested_absmax") != nullptr);
        continue;
      }
      QLFT_CHECK_FORMAT(t->shape.size() == 2 && t->shape[0] == file_rows && t->shape[1] == cols,
                        "%s: tensor '%s' is not [%lld, %lld] as config.json implies", dir.c_str(),
                        n.c_str(), static_cast<long long>(file_rows), static_cast<long long>(cols));
      const bool half = t->dtype == DType::F16 || t->dtype == DType::BF16;
      add_linear(w, g, o, rows, cols, uint64_t(rows * cols) * (half ? 2 : 4));
    }
    if (c.qkv_bias) add_biases(w, g, sh.layers[size_t(l)]);
    if (sh.layers[size_t(l)].moe()) {  // the experts as their first one is stored
      const std::string n = hf_moe_tensor(c, l, 0, 1);
      const SafeTensorInfo* t = st->find(n);
      QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", dir.c_str(), n.c_str());
      add_experts(w, g, o, sh.layers[size_t(l)],
                  t->dtype == DType::F16 || t->dtype == DType::BF16 ? 2 : 4);
    }
    add_qk_norms(w, g, sh.layers[size_t(l)]);
  }
  return w;
}

}  // namespace

WeightFootprint weight_footprint(const Model& m) {
  WeightFootprint w;
  const size_t L = m.layers.size();
  w.groups.assign(L + 2, {});
  w.tied = m.output.rows == 0;
  if (dist::row_shardable(m.tok_embd) && (w.tied || dist::row_shardable(m.output))) {
    w.f32_rows = m.tok_embd.rows;
    w.row_bytes = uint64_t(m.tok_embd.cols) * 4;
  }
  // Every buffer as loaded; the device copies of those the runner reads (an empty untied head
  // has none).
  auto buf = [&](size_t g, const Buffer& b) { add_slot_dev(w, g, b.size()); };
  auto qw = [&](size_t g, const QWeight& q) {
    for (const Buffer* b : {&q.data, &q.absmax, &q.nested_absmax, &q.code, &q.nested_code, &q.scb})
      add_slot(w, g, b->size());
    if (q.rows > 0)
      add_device_matrix(w, q.kind, q.rows, q.cols, q.blocksize, std::max<size_t>(q.data.size(), 1),
                        q.double_quant);
  };
  // The embedding and head as plain f32 tables (CudaBackend::resident16 at 16-bit tiles).
  auto table = [&](size_t g, const QWeight& q) {
    if (q.rows > 0 && (q.kind == QuantKind::F32 ||
                       (q.kind == QuantKind::GGML && q.ggml_type == uint32_t(GgmlType::F32))))
      w.device_f32_tables.push_back(w.device_slots.size());
    qw(g, q);
  };
  table(0, m.tok_embd);
  buf(L + 1, m.output_norm);
  table(L + 1, m.output);
  for (size_t i = 0; i < L; ++i) {
    const LayerWeights& l = m.layers[i];
    buf(i + 1, l.attn_norm);
    buf(i + 1, l.ffn_norm);
    for (const QWeight& q : l.proj) {
      qw(i + 1, q);
      if (q.kind == QuantKind::NF4 || q.kind == QuantKind::INT8) {
        const int64_t nb = nf4_num_blocks(q.numel(), q.blocksize);
        w.load_staging =
            std::max(w.load_staging,
                     fl(q.numel()) + (q.kind == QuantKind::NF4 && q.double_quant ? fl(nb) : 0));
      }
    }
    for (const Buffer& b : l.bias) buf(i + 1, b);
    buf(i + 1, l.q_norm);
    buf(i + 1, l.k_norm);
    buf(i + 1, l.post_attn_norm);
    buf(i + 1, l.post_ffn_norm);
  }
  return w;
}

WeightFootprint weight_footprint_of_file(const std::string& path, const LoadOptions& opt,
                                         ModelConfig* cfg) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw_error(QLFT_ERR_IO, "%s: no such file or directory", path.c_str());
  const bool gguf = ends_with(path, ".gguf");
  return gguf ? gguf_footprint(path, opt, cfg) : hf_footprint(path, opt, cfg);
}

WeightFootprint weight_footprint_for_plan(const Model& m, const QuantSpec& q) {
  if (!m.stream) return weight_footprint(m);
  ModelConfig from_file;
  return weight_footprint_of_file(m.path, load_options(q), &from_file);
}

}  // namespace qlft
