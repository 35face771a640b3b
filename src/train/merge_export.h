// Merged model export: every base weight dequantized to fp32 plus the LoRA delta scale * B A,
// written as a standalone model that needs no adapter.
//  - "safetensors": a Hugging Face directory (model.safetensors in F32 with llama/qwen2 tensor
//    names and HF rotate-half q/k row order, config.json; tokenizer files copied when the source
//    is an HF directory).
//  - "gguf-f16" / "gguf-bf16": one GGUF file with llama.cpp tensor names and q/k order (adjacent
//    pairs for llama/mistral, rotate-half for qwen2), 2-D weights in F16/BF16, norms and biases in
//    F32, and the source GGUF's tokenizer.* metadata copied when the source is a GGUF.
// Files are written atomically.
#pragma once

#include <string>
#include <vector>

#include "model/lora.h"
#include "model/model.h"

namespace qlft {

// The merged [out, in] weight of one projection in the model's own row order (lora may be
// nullptr or not target p: the dequantized base weight).
std::vector<float> merged_weight(const Model& model, const LoraAdapter* lora, int layer, Proj p);

// format: "safetensors" (path is a directory) | "gguf-f16" | "gguf-bf16" (path is a file).
// Throws QLFT_ERR_INVALID_ARGUMENT for another format or an adapter of another model shape.
void export_merged(const Model& model, const LoraAdapter* lora, const std::string& path,
                   const std::string& format);

}  // namespace qlft
