// qlft_generate (text callback) and qlft_generation_* (one token per call): text in, tokens
// out, with or without a trainer's adapter. Both step the same TokenStream.
#include <atomic>
#include <cstring>
#include <memory>

#include "api/handles.h"
#include "backend/backend.h"
#include "backend/backend_select.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/model_template.h"
#include "data/tokenizer_encoder.h"
#include "model/generate.h"
#include "tokenizer/stream_decoder.h"
#include "train/trainer.h"

using qlft::guard;

namespace {

// The prompt's ids, the options and the KV cache length of one generation.
struct Prepared {
  std::vector<int32_t> ids;
  qlft::GenerateOptions opt;
  int max_len = 0;
  qlft::BackendSpec backend;  // what the layer ops run on (generation_backend)
};

Prepared prepare(const qlft_model* model, const qlft_trainer* trainer, const char* prompt,
                 const qlft_config* config, const char* fn) {
  QLFT_CHECK_ARG(model && prompt, "%s: model and prompt must be given", fn);
  QLFT_CHECK_ARG(!trainer || trainer->model == model,
                 "%s: the trainer belongs to a different model", fn);
  const qlft::Config& c = qlft::config_or_default(config);
  const qlft::RunSpec spec = qlft::parse_run_spec(c);
  const qlft::GenerateSpec& gs = spec.generate;
  const qlft::Tokenizer& tok = model->need_tokenizer();
  Prepared p;
  if (gs.chat) {
    // A chat: the prompt as the user turn training renders, up to the assistant's header.
    const qlft::data::TokenizerEncoder enc(tok, qlft::data::model_chat_template(*model->model));
    const qlft::data::ChatTemplate t =
        qlft::data::resolve_template(spec.data.chat_template, enc, nullptr);
    p.ids = qlft::data::generation_prompt(prompt, t, enc);
  } else {
    // BOS/EOS as the model's tokenizer adds them (SmolLM2's adds none); an empty prompt still
    // starts from BOS when the vocabulary has one.
    p.ids = tok.encode_as_model(prompt, /*parse_special=*/false);
  }
  if (p.ids.empty() && tok.bos_id() >= 0) p.ids.push_back(tok.bos_id());
  QLFT_CHECK_ARG(!p.ids.empty(), "%s: the prompt is empty and the vocabulary has no BOS token", fn);
  p.opt.max_tokens = gs.max_tokens;
  p.opt.sampler.temperature = gs.temperature;
  p.opt.sampler.top_k = gs.top_k;
  p.opt.sampler.top_p = gs.top_p;
  p.opt.sampler.seed = gs.seed;
  p.opt.eos_id = gs.stop_at_eos ? tok.eos_id() : -1;
  const int ctx = qlft::rope_context_length(model->model->cfg);
  QLFT_CHECK_ARG(static_cast<int64_t>(p.ids.size()) < ctx,
                 "%s: the prompt has %zu tokens, the context holds %d", fn, p.ids.size(), ctx);
  p.max_len = static_cast<int>(
      std::min<int64_t>(ctx, static_cast<int64_t>(p.ids.size()) + p.opt.max_tokens));
  // The runtime's backend, or the one the call's config names. Always plain fp32 (no TF32):
  // train.precision and cuda.tf32 are the trainer's.
  p.backend = model->runtime->backend;
  if (c.is_set("backend")) p.backend.kind = spec.backend.kind;
  p.backend.precision = qlft::Precision::FP32;
  p.backend.tf32 = false;
  return p;
}

// Generation runs fp32 GEMMs on either backend, its activations and KV cache in the backend's
// memory (model/generate.h: on cuda a greedy step moves one id in and one out).
// Each generation makes its own (from the runtime's BackendSpec): distinct handles may generate
// from several threads at once, and a device backend keeps the weights it uploaded for its life.
std::unique_ptr<qlft::Backend> generation_backend(const qlft_model* model, const Prepared& p) {
  return qlft::make_backend(p.backend, &model->runtime->tracker);
}

const qlft::LoraAdapter* lora_of(const qlft_trainer* trainer) {
  if (!trainer) return nullptr;
  // Generation is one process's loop: it cannot gather the other ranks' LoRA tensors.
  QLFT_CHECK_ARG(!trainer->trainer->adapter_sharded(),
                 "generation with a trainer whose adapter is sharded across ranks "
                 "(dist.zero3_shard_adapter) is not supported: save the adapter (every rank "
                 "calls qlft_trainer_save_adapter) and generate with it");
  return &trainer->trainer->lora();
}

}  // namespace

struct qlft_generation {
  std::unique_ptr<qlft::Backend> backend;
  std::unique_ptr<qlft::Generator> gen;
  std::unique_ptr<qlft::TokenStream> stream;
  std::unique_ptr<qlft::StreamDecoder> dec;
  int threads = 0;  // the model's runtime's (core/threads.h), for every qlft_generation_next
  int32_t eos_id = -1;
  std::vector<std::string> stops;
  std::string held;   // decoded text not delivered yet: it may begin a stop string
  std::string piece;  // the text of the last event (what qlft_generated_token::text points at)
  std::atomic<bool> cancelled{false};
  int32_t finish = QLFT_FINISH_NONE;
  uint32_t index = 0;

  // Moves the part of `held` that cannot begin a stop string into `piece`; if a stop string
  // occurs in `held`, the text before its first occurrence instead, and returns true.
  bool release_text() {
    size_t first = std::string::npos;
    for (const std::string& s : stops) first = std::min(first, held.find(s));
    if (first != std::string::npos) {
      piece = held.substr(0, first);
      held.clear();
      return true;
    }
    // The longest suffix of held that is a proper prefix of some stop string stays held.
    size_t keep = 0;
    for (const std::string& s : stops)
      for (size_t n = std::min(held.size(), s.size() - 1); n > keep; --n)
        if (held.compare(held.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
    piece = held.substr(0, held.size() - keep);
    held.erase(0, held.size() - keep);
    return false;
  }

  // Ends the generation: what is still held back follows the text already in `piece`.
  void end(int32_t reason) {
    finish = reason;
    piece += held + dec->flush();
    held.clear();
  }
};

namespace {

void fill(const qlft_generation* g, int32_t id, uint32_t index, qlft_generated_token* out) {
  qlft_generated_token full{};
  full.struct_size = sizeof(full);
  full.id = id;
  full.index = index;
  full.finish_reason = g->finish;
  full.text = g->piece.c_str();
  full.text_len = g->piece.size();
  qlft::copy_out(full, out);
}

}  // namespace

extern "C" {

int32_t qlft_generate(const qlft_model* model, const qlft_trainer* trainer, const char* prompt,
                      const qlft_config* config, qlft_text_fn on_text, void* user_data) {
  return guard([&] {
    Prepared p = prepare(model, trainer, prompt, config, "qlft_generate");
    qlft::ThreadScope threads(model->runtime->threads);
    auto backend = generation_backend(model, p);
    qlft::Generator gen(*model->model, *backend, lora_of(trainer), p.max_len);
    qlft::StreamDecoder dec(model->need_tokenizer());
    bool stopped = false;
    gen.generate(p.ids, p.opt, [&](int32_t id) {
      if (id == p.opt.eos_id) return false;
      std::string piece = dec.push(id);
      if (!piece.empty() && on_text && on_text(piece.c_str(), user_data) != 0) stopped = true;
      return !stopped;
    });
    std::string rest = dec.flush();
    if (!stopped && !rest.empty() && on_text) on_text(rest.c_str(), user_data);
  });
}

int32_t qlft_generation_create(const qlft_model* model, const qlft_trainer* trainer,
                               const char* prompt, const qlft_config* config,
                               const char* const* stop, size_t n_stop, qlft_generation** out) {
  return guard([&] {
    QLFT_CHECK_ARG(out, "qlft_generation_create: out is NULL");
    *out = nullptr;
    QLFT_CHECK_ARG(stop || n_stop == 0, "qlft_generation_create: stop is NULL but n_stop is %zu",
                   n_stop);
    Prepared p = prepare(model, trainer, prompt, config, "qlft_generation_create");
    auto g = std::make_unique<qlft_generation>();
    for (size_t i = 0; i < n_stop; ++i) {
      QLFT_CHECK_ARG(stop[i] && *stop[i],
                     "qlft_generation_create: stop string %zu is NULL or empty", i);
      g->stops.emplace_back(stop[i]);
    }
    g->backend = generation_backend(model, p);
    g->gen =
        std::make_unique<qlft::Generator>(*model->model, *g->backend, lora_of(trainer), p.max_len);
    g->stream = std::make_unique<qlft::TokenStream>(*g->gen, std::move(p.ids), p.opt);
    g->dec = std::make_unique<qlft::StreamDecoder>(model->need_tokenizer());
    g->eos_id = p.opt.eos_id;
    g->threads = model->runtime->threads;
    *out = g.release();
  });
}

int32_t qlft_generation_next(qlft_generation* g, qlft_generated_token* out) {
  return guard([&] {
    QLFT_CHECK_ARG(g, "qlft_generation_next: generation is NULL");
    QLFT_CHECK_ARG(out && out->struct_size >= sizeof(uint32_t),
                   "qlft_generation_next: out is NULL or out->struct_size is not set (use "
                   "sizeof(qlft_generated_token))");
    qlft::ThreadScope threads(g->threads);
    if (g->finish != QLFT_FINISH_NONE) {  // ended: the end again, without token or text
      g->piece.clear();
      return fill(g, -1, g->index, out);
    }
    int32_t id = g->cancelled.load() ? -1 : g->stream->next();
    // A cancel that arrived while the token was computed discards it.
    if (g->cancelled.load()) {
      g->piece.clear();
      g->end(QLFT_FINISH_CANCELLED);
      return fill(g, -1, g->index, out);
    }
    if (id < 0)
      qlft::throw_error(QLFT_ERR_INTERNAL, "qlft_generation_next: the stream ended early");
    const uint32_t index = g->index++;
    if (id != g->eos_id) g->held += g->dec->push(id);
    if (g->release_text()) {
      g->finish = QLFT_FINISH_STOP;
    } else if (g->stream->end() != qlft::TokenStream::End::None) {
      g->end(g->stream->end() == qlft::TokenStream::End::Eos ? QLFT_FINISH_EOS
                                                             : QLFT_FINISH_LENGTH);
    }
    fill(g, id, index, out);
  });
}

void qlft_generation_cancel(qlft_generation* generation) {
  if (generation) generation->cancelled.store(true);
}

void qlft_generation_free(qlft_generation* generation) {
  delete generation;
}

}  // extern "C"
