// qlft_model: loading a base model and describing it.
#include <cstring>

#include "api/handles.h"
#include "arch/deltas.h"
#include "arch/families.h"
#include "core/error.h"
#include "core/threads.h"
#include "train/trainer.h"

using qlft::guard;

namespace qlft {
void attach_tokenizer(qlft_model& m);
}

namespace {
void copy_str(char* dst, size_t cap, const std::string& s) {
  size_t n = s.size() < cap - 1 ? s.size() : cap - 1;
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}
}  // namespace

extern "C" {

int32_t qlft_model_load(qlft_runtime* runtime, const char* path, const qlft_config* config,
                        qlft_model** out) {
  return guard([&] {
    QLFT_CHECK_ARG(out, "qlft_model_load: out is NULL");
    *out = nullptr;
    QLFT_CHECK_ARG(runtime, "qlft_model_load: runtime is NULL");
    QLFT_CHECK_ARG(path && *path, "qlft_model_load: path is NULL or empty");
    const qlft::RunSpec spec = qlft::parse_run_spec(qlft::config_or_default(config));
    qlft::ThreadScope threads(runtime->threads);  // quantizing runs the runtime's kernels
    qlft::LoadOptions opt = qlft::load_options(spec.quant);
    QLFT_CHECK_ARG((opt.blocksize & (opt.blocksize - 1)) == 0,
                   "quant.blocksize must be a power of two, got %d", opt.blocksize);
    // Under a launcher with ZeRO-3 over MPI each rank reads only what it keeps (a trainer with
    // the same settings shards it from the file).
    opt.deferred = qlft::load_into_shards(spec);
    auto m = std::make_unique<qlft_model>();
    m->runtime = runtime;
    m->model = qlft::load_model(&runtime->tracker, path, opt);
    qlft::attach_tokenizer(*m);
    *out = m.release();
  });
}

void qlft_model_free(qlft_model* model) {
  delete model;
}

int32_t qlft_model_info(const qlft_model* model, qlft_model_details* out) {
  return guard([&] {
    QLFT_CHECK_ARG(model && out, "qlft_model_info: model and out must not be NULL");
    QLFT_CHECK_ARG(out->struct_size >= sizeof(uint32_t),
                   "qlft_model_info: set out->struct_size = sizeof(qlft_model_details)");
    const qlft::Model& m = *model->model;
    qlft_model_details d{};
    d.struct_size = sizeof(d);
    copy_str(d.architecture, sizeof d.architecture, m.cfg.arch);
    copy_str(d.quant_type, sizeof d.quant_type, m.quant_summary);
    copy_str(d.source_format, sizeof d.source_format, m.source_format);
    d.n_layers = m.cfg.n_layers;
    d.dim = m.cfg.dim;
    d.n_heads = m.cfg.n_heads;
    d.n_kv_heads = m.cfg.n_kv_heads;
    d.head_dim = m.cfg.head_dim;
    d.ffn_dim = m.cfg.ffn_dim;
    d.vocab_size = m.cfg.vocab;
    d.context_length = m.cfg.context_length;
    d.rope_theta = m.cfg.rope_theta;
    d.rms_norm_eps = m.cfg.rms_eps;
    d.tied_embeddings = m.cfg.tied_embeddings;
    d.rope_adjacent_pairs = m.cfg.rope_adjacent;
    d.n_params = m.n_params();
    d.weight_bytes = m.weight_bytes();
    qlft::copy_out(d, out);
  });
}

int32_t qlft_model_describe(const qlft_model* model, int32_t what, char* buf, size_t buf_size,
                            size_t* needed) {
  return guard([&] {
    QLFT_CHECK_ARG(model, "qlft_model_describe: model is NULL");
    const qlft::Model& m = *model->model;
    std::string s;
    if (what == QLFT_DESCRIBE_HF_CLASS) {
      const qlft::ArchFamily* f = qlft::find_family(m.cfg.arch);
      s = m.cfg.image_text ? "Gemma3ForConditionalGeneration" : f ? f->hf_class : "";
    } else {
      QLFT_CHECK_ARG(what == QLFT_DESCRIBE_DELTAS,
                     "qlft_model_describe: what is %d, not QLFT_DESCRIBE_HF_CLASS (0) or "
                     "QLFT_DESCRIBE_DELTAS (1)",
                     what);
      s = qlft::describe_deltas(m.cfg, m.shapes);
    }
    if (needed) *needed = s.size() + 1;
    if (!buf && buf_size == 0) return;
    QLFT_CHECK_ARG(buf && buf_size > s.size(),
                   "qlft_model_describe: %zu bytes do not fit the buffer of %zu", s.size() + 1,
                   buf_size);
    std::memcpy(buf, s.c_str(), s.size() + 1);
  });
}

}  // extern "C"
