// LoRA adapters in and out of the ecosystem's formats:
//  - PEFT: a directory with adapter_model.safetensors (keys
//    base_model.model.model.layers.N.{self_attn,mlp}.<proj>.lora_{A,B}.weight, A [r, in],
//    B [out, r], Hugging Face q/k row order) and adapter_config.json, as
//    PeftModel.from_pretrained loads it.
//  - llama.cpp LoRA GGUF: general.type=adapter, adapter.type=lora, adapter.lora.alpha,
//    blk.N.<tensor>.weight.lora_a (ne [in, r]) and .lora_b (ne [r, out]); q/k rows of B in the
//    order llama.cpp's base model uses (adjacent pairs for llama/mistral, rotate-half for qwen2);
//    rsLoRA folded into alpha (llama.cpp scales by alpha / r only).
// Every file is written atomically.
#pragma once

#include <cstdint>
#include <string>

#include "model/lora.h"

namespace qlft {

// How the base weights were stored while the adapter was trained (quant.* settings), written
// beside a PEFT adapter as kBaseStorageFile so generate/eval/export load the same base by
// default. Empty quant_type: not recorded.
struct BaseStorage {
  std::string quant_type;
  bool double_quant = true;
  int64_t blocksize = 64;
};
// A JSON object of settings ({"quant.type": "keep", ...}); PEFT ignores it.
inline constexpr const char* kBaseStorageFile = "qlft_base_config.json";

// base_model: recorded as base_model_name_or_path. The directory is written whole: the files go
// to <dir>.tmp.<pid>, which then replaces dir in one rename, so a crash leaves the old adapter
// or the new one. Refuses (QLFT_ERR_NUMERICAL) an adapter holding a non-finite value.
void save_peft_adapter(const LoraAdapter& lora, const std::string& dir,
                       const std::string& base_model, const BaseStorage& base = {});
// Loads A and B from a PEFT directory into lora. The file's r, lora_alpha, use_rslora and
// target modules must match lora's configuration (QLFT_ERR_INVALID_ARGUMENT naming the field
// otherwise); tensors are checked for presence and shape (QLFT_ERR_FORMAT naming the tensor).
void load_peft_adapter(LoraAdapter& lora, const std::string& dir);
// Reads only adapter_config.json into a LoraConfig (to build an adapter that fits a directory);
// lora_alpha and lora_dropout are held to the ranges of lora.alpha and lora.dropout.
LoraConfig read_peft_config(const std::string& dir);

// Refuses (QLFT_ERR_NUMERICAL) an adapter holding a non-finite value.
void save_gguf_lora_adapter(const LoraAdapter& lora, const std::string& path);

}  // namespace qlft
