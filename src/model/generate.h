// Incremental decoding with a KV cache, with or without a LoRA adapter.
//
// The cache holds every layer's post-RoPE keys and values for positions [0, length()). Everything
// a feed works in lives in the backend's memory (Backend::alloc: device memory on a device
// backend, host memory on the CPU one), so one code path serves both: the activations, the
// cache, RoPE's positions (Backend::positions), the logits row. Each layer appends its new k / v
// rows to the cache (Backend::copy) and attends over it with Backend::attention_decode (GQA,
// causal from the cached length, sliding window); residuals are Backend::add. On a device
// backend the Generator also copies the norm weights, biases and the adapter's A and B to the
// device once, at construction (the adapter's values as of then), so a step moves no weights.
// A greedy step (temperature <= 0) picks the id on the backend (Backend::argmax, ties to the
// lowest id as the Sampler does): on a device it moves one int32 id in and one out. Sampling
// with temperature > 0 copies the last logits row back for the host Sampler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/lora.h"
#include "model/lora_extras.h"
#include "model/model.h"
#include "model/sampler.h"

namespace qlft {

struct GenerateOptions {
  int max_tokens = 128;
  SamplerConfig sampler;
  // Stop after emitting this id (it is included in the output); -1 never stops early.
  int32_t eos_id = -1;
};

class Generator {
 public:
  // lora may be nullptr. max_len caps prompt + generated tokens (<= 0: the model's context
  // length). A model whose weights are streamed (ZeRO-3 shards) is read through its stream's
  // rank_local() (each unit loaded from the model's file per feed: slow, but no collective, so
  // one rank may generate alone); a stream without one is refused (QLFT_ERR_UNSUPPORTED).
  Generator(const Model& model, Backend& backend, const LoraAdapter* lora, int max_len = 0);
  ~Generator();

  // Appends n tokens to the context. If logits is given it receives [n, vocab] logits of every
  // new position (or only the last one's [vocab] when last_only).
  void feed(const int32_t* tokens, int n, float* logits, bool last_only = true);
  // feed without logits out: returns the greedy id of the last position (Backend::argmax).
  int32_t feed_greedy(const int32_t* tokens, int n);
  void reset() { len_ = 0; }
  int length() const { return len_; }
  int max_length() const { return max_len_; }
  int model_vocab() const { return model_.cfg.vocab; }

  // Feeds the prompt (must be non-empty), then samples up to max_tokens new ids. on_token may
  // return false to stop. Returns the generated ids (prompt excluded). A TokenStream loop.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                const std::function<bool(int32_t)>& on_token = {});

 private:
  // The device copies of one layer's small frozen tensors and adapter (Generator's comment).
  struct LayerCopy {
    Buffer attn_norm, ffn_norm, q_norm, k_norm, bias[3];
    Buffer A[kProjCount], B[kProjCount];
    Buffer moe_A[kMoePartCount], moe_B[kMoePartCount];  // an MoE layer's expert / router LoRA
  };
  Buffer device_copy(const Buffer& host, MemCategory c, const char* what) const;
  void ensure_rows(int n);
  // The n tokens through every layer (the cache grows by n); head: the logits of the last rows.
  void run(const int32_t* tokens, int n);
  void head(int n, int rows);

  const Model& model_;
  std::shared_ptr<WeightStream> ws_;  // rank-local stream of a streamed model, else null
  Backend& be_;
  const LoraAdapter* lora_;
  std::unique_ptr<LoraExtras> extras_;  // DoRA / a frozen start, else null
  int max_len_;
  int len_ = 0;
  std::vector<Buffer> kcache_, vcache_;  // per layer [max_len, kv_dim]
  std::vector<LayerCopy> dev_;           // per layer, on a device backend only
  Buffer out_norm_;                      // the output norm's device copy
  int rows_cap_ = 0;
  Buffer x_, xn_, q_, k_, v_, att_, mid_, gate_, up_, h_, tok_, pos_, logits_;
};

// Sampling one id at a time: the loop of Generator::generate, and what the C ABI's streaming
// generation (qlft_generation_next) steps through. The prompt is fed by the first next(), and
// each later next() feeds the previous id first, so no forward pass runs for an id nobody
// asked for (a cancel between two next() calls costs nothing).
class TokenStream {
 public:
  enum class End { None, Eos, Length };
  // Resets gen; prompt must be non-empty and shorter than gen.max_length().
  TokenStream(Generator& gen, std::vector<int32_t> prompt, const GenerateOptions& opt);
  // The next sampled id, or -1 once the stream has ended (end() says why).
  int32_t next();
  // Why the stream ended: Eos (the last id was opt.eos_id), Length (max_tokens ids, or the
  // context is full), None while it can go on.
  End end() const { return end_; }
  int produced() const { return produced_; }

 private:
  Generator& gen_;
  std::vector<int32_t> prompt_;
  GenerateOptions opt_;
  Sampler sampler_;
  std::vector<float> logits_;
  int produced_ = 0;
  int32_t last_ = -1;
  End end_ = End::None;
};

}  // namespace qlft
