#!/usr/bin/env python3
"""llama.cpp LoRA GGUFs of the family fixtures' PEFT adapters, as convert_lora_to_gguf.py writes
them (issue 48): the reference for qlft's save_gguf_lora_adapter (tests/unit/test_lora_gguf.cpp).

For each family llama.cpp supports, the adapter factors of
fixtures/families/syn_<family>.lora.safetensors (l<layer>.<proj>.A [r, in] / .B [out, r], PEFT's
lora_A / lora_B of model.layers.<layer>.{self_attn,mlp}.<proj>) go through what
convert_lora_to_gguf.py does with a PEFT adapter:
 - the base name (PEFT's key without base_model.model. and .lora_A / .lora_B) is mapped by the
   base model's converter class: gguf-py's tensor name map for the architecture
   (ModelBase.map_tensor_name), so blk.N.attn_q.weight, ... and Phi-3's fused qkv_proj /
   gate_up_proj as blk.N.attn_qkv.weight / blk.N.ffn_up.weight;
 - LlamaModel.modify_tensors (llama, mistral, mixtral: general.architecture "llama") permutes
   q_proj's and k_proj's rows (LlamaModel.permute); on a LoraTorchTensor that reshape /
   swapaxes moves lora_B's rows only; the other families' converters change no LoRA'd tensor
   (their norm edits touch no LoRA'd matrix);
 - each becomes <name>.lora_a (lora_A as is: numpy [r, in], ggml ne [in, r]) and <name>.lora_b
   (lora_B: [out, r], ne [r, out]), F32 with the default --outtype f32;
 - the keys: general.architecture (the converter's model_arch), general.type "adapter",
   adapter.type "lora", adapter.lora.alpha (adapter_config.json's lora_alpha).
Writes fixtures/lora_gguf/syn_<family>[.fused].lora.gguf.
"""
import json
import os

import gguf
import numpy as np
from safetensors import safe_open

import fixture_versions
from gen_model_fixtures import permute_hf_to_gguf

HERE = os.path.dirname(os.path.abspath(__file__))
FAM = os.path.join(HERE, "fixtures", "families")
OUT = os.path.join(HERE, "fixtures", "lora_gguf")

# family -> (the converter's model_arch, q/k permuted by LlamaModel.modify_tensors)
ARCH = {
    "qwen3": (gguf.MODEL_ARCH.QWEN3, False),
    "gemma2": (gguf.MODEL_ARCH.GEMMA2, False),
    "gemma3": (gguf.MODEL_ARCH.GEMMA3, False),
    "phi3": (gguf.MODEL_ARCH.PHI3, False),
    "mistral": (gguf.MODEL_ARCH.LLAMA, True),
    "mixtral": (gguf.MODEL_ARCH.LLAMA, True),
    "qwen3_moe": (gguf.MODEL_ARCH.QWEN3MOE, False),
}
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")


def convert(family, lora_file, out_file):
    arch, permuted = ARCH[family]
    with open(os.path.join(FAM, "syn_" + family, "config.json")) as f:
        cfg = json.load(f)
    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    src = safe_open(os.path.join(FAM, lora_file), "np")
    meta = src.metadata()
    assert meta["use_rslora"] == "false"  # the converter writes lora_alpha as is
    w = gguf.GGUFWriter(os.path.join(OUT, out_file), gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(meta["alpha"]))
    for key in sorted(k for k in src.keys() if k.endswith(".A")):
        layer, proj = key[1:-2].split(".")
        base = "model.layers.%s.%s.%s.weight" % (layer, "self_attn" if proj in ATTN else "mlp",
                                                proj)
        name = names.get_name(base, try_suffixes=(".weight",))
        assert name, base
        a = src.get_tensor(key).astype(np.float32)
        b = src.get_tensor(key[:-2] + ".B").astype(np.float32)
        if permuted and proj in ("q_proj", "k_proj"):
            heads = cfg["num_attention_heads"] if proj == "q_proj" else cfg["num_key_value_heads"]
            b = permute_hf_to_gguf(b, heads)
        w.add_tensor(name + ".lora_a", np.ascontiguousarray(a))
        w.add_tensor(name + ".lora_b", np.ascontiguousarray(b))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    os.makedirs(OUT, exist_ok=True)
    inputs = []
    for family in ARCH:
        convert(family, "syn_%s.lora.safetensors" % family, "syn_%s.lora.gguf" % family)
        inputs.append(os.path.join(FAM, "syn_%s.lora.safetensors" % family))
    convert("phi3", "syn_phi3.fused_lora.safetensors", "syn_phi3.fused.lora.gguf")
    inputs.append(os.path.join(FAM, "syn_phi3.fused_lora.safetensors"))
    fixture_versions.write(OUT, __file__, inputs=inputs)


if __name__ == "__main__":
    main()
