// qlft_generate: text in, streamed text out, with or without a trainer's adapter.
#include <cstring>

#include "api/handles.h"
#include "backend/backend.h"
#include "core/error.h"
#include "model/generate.h"
#include "tokenizer/stream_decoder.h"
#include "train/trainer.h"

using qlft::guard;

extern "C" {

int32_t qlft_generate(const qlft_model* model, const qlft_trainer* trainer, const char* prompt,
                      const qlft_config* config, qlft_text_fn on_text, void* user_data) {
  return guard([&] {
    QLFT_CHECK_ARG(model && prompt, "qlft_generate: model and prompt must be given");
    QLFT_CHECK_ARG(!trainer || trainer->model == model,
                   "qlft_generate: the trainer belongs to a different model");
    const qlft::Config& c = qlft::config_or_default(config);
    const qlft::Tokenizer& tok = model->need_tokenizer();
    std::vector<int32_t> ids = tok.encode(prompt, /*add_bos=*/true, false, /*parse_special=*/false);
    QLFT_CHECK_ARG(!ids.empty(),
                   "qlft_generate: the prompt is empty and the vocabulary has no BOS token");
    qlft::GenerateOptions opt;
    opt.max_tokens = static_cast<int>(c.get_int("generate.max_tokens"));
    opt.sampler.temperature = static_cast<float>(c.get_float("generate.temperature"));
    opt.sampler.top_k = static_cast<int>(c.get_int("generate.top_k"));
    opt.sampler.top_p = static_cast<float>(c.get_float("generate.top_p"));
    opt.sampler.seed = static_cast<uint64_t>(c.get_int("generate.seed"));
    opt.eos_id = c.get_bool("generate.stop_at_eos") ? tok.eos_id() : -1;
    qlft::MemoryTracker* tracker = &model->runtime->tracker;
    auto backend = qlft::make_cpu_backend(tracker);
    const qlft::LoraAdapter* lora = trainer ? &trainer->trainer->lora() : nullptr;
    const int ctx = model->model->cfg.context_length;
    QLFT_CHECK_ARG(static_cast<int64_t>(ids.size()) < ctx,
                   "qlft_generate: the prompt has %zu tokens, the context holds %d", ids.size(),
                   ctx);
    int max_len =
        static_cast<int>(std::min<int64_t>(ctx, static_cast<int64_t>(ids.size()) + opt.max_tokens));
    qlft::Generator gen(*model->model, *backend, lora, max_len);
    qlft::StreamDecoder dec(tok);
    bool stopped = false;
    gen.generate(ids, opt, [&](int32_t id) {
      if (id == opt.eos_id) return false;
      std::string piece = dec.push(id);
      if (!piece.empty() && on_text && on_text(piece.c_str(), user_data) != 0) stopped = true;
      return !stopped;
    });
    std::string rest = dec.flush();
    if (!stopped && !rest.empty() && on_text) on_text(rest.c_str(), user_data);
  });
}

}  // extern "C"
