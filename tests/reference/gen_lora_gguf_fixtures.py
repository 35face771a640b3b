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

--moe: the expert / router LoRA of fixtures/moe_lora/syn_mixtral.moe_lora.safetensors (PEFT 0.21's
target_parameters on transformers 5's fused experts: gate_up A [E r, dim] shared by gate and up,
B [2 ffn, r E] with expert e at columns j E + e; down likewise; the router gate.weight a plain
LoRA). convert_lora_to_gguf.py cannot map those keys (mlp.experts.lora_A.weight names no base
tensor); it converts the per-expert adapter they equal (expert e's w1: A_e with B_e's gate rows,
w3: A_e with its up rows, w2: down's A_e / B_e), which its base converter stacks
(LoraTorchTensor's torch.stack) into blk.N.ffn_{gate,up,down}_exps.weight.lora_a [E, r, in] /
lora_b [E, out, r] (3-D, llama.cpp's build_lora_mm_id), the router as
blk.N.ffn_gate_inp.weight.lora_a / _b. llama.cpp scales each tensor by adapter.lora.alpha /
lora_b's rank, so a part whose PEFT scale (alpha_pattern / rank_pattern) differs from
lora_alpha / its rank has lora_b multiplied by scale * rank / lora_alpha.
Writes fixtures/lora_gguf/syn_mixtral.moe_lora.gguf.
"""
import json
import os
import re

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
    # Gemma3ForConditionalGeneration: the converter's Gemma3Model; LoraModel.modify_tensors
    # strips model.language_model. to model. (the vision tower holds no LoRA here)
    "gemma3_vlm": (gguf.MODEL_ARCH.GEMMA3, False),
}
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")


def convert(family, lora_file, out_file):
    arch, permuted = ARCH[family]
    with open(os.path.join(FAM, "syn_" + family, "config.json")) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)
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


def convert_moe():
    path = os.path.join(HERE, "fixtures", "moe_lora", "syn_mixtral.moe_lora.safetensors")
    with open(os.path.join(FAM, "syn_mixtral", "config.json")) as f:
        cfg = json.load(f)
    E, F = cfg["num_local_experts"], cfg["intermediate_size"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    src = safe_open(path, "np")
    meta = src.metadata()
    peft_cfg = json.loads(meta["adapter_config"])
    alpha, r = float(peft_cfg["lora_alpha"]), peft_cfg["r"]

    def scale_of(param):  # PEFT's alpha_pattern / rank_pattern over the parameter's name
        ra, rr = alpha, r
        for pat, v in peft_cfg.get("alpha_pattern", {}).items():
            if re.fullmatch(pat, "model.layers.0.mlp.experts." + param):
                ra = float(v)
        for pat, v in peft_cfg.get("rank_pattern", {}).items():
            if re.fullmatch(pat, "model.layers.0.mlp.experts." + param):
                rr = v
        return ra / rr, rr

    w = gguf.GGUFWriter(os.path.join(OUT, "syn_mixtral.moe_lora.gguf"), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for layer in range(cfg["num_hidden_layers"]):
        blk = "blk.%d." % layer
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            k = "l%d.%s." % (layer, proj)
            if k + "A" not in src.keys():
                continue
            b = src.get_tensor(k + "B").astype(np.float32)
            if proj in ("q_proj", "k_proj"):
                heads = cfg["num_attention_heads"] if proj == "q_proj" else cfg[
                    "num_key_value_heads"]
                b = permute_hf_to_gguf(b, heads)
            name = names.get_name("model.layers.%d.self_attn.%s.weight" % (layer, proj),
                                  try_suffixes=(".weight",))
            w.add_tensor(name + ".lora_a", src.get_tensor(k + "A").astype(np.float32))
            w.add_tensor(name + ".lora_b", np.ascontiguousarray(b))
        for part, param, outs in (("gate_up", "gate_up_proj", ("ffn_gate_exps", "ffn_up_exps")),
                                  ("down", "down_proj", ("ffn_down_exps",))):
            k = "l%d.%s." % (layer, part)
            if k + "A" not in src.keys():
                continue
            s, rp = scale_of(param)
            a = src.get_tensor(k + "A").astype(np.float32)  # [E r, in]
            b = src.get_tensor(k + "B").astype(np.float32)  # [out, r E]
            a = a.reshape(E, rp, a.shape[1])
            b = b.reshape(b.shape[0], rp, E).transpose(2, 0, 1) * np.float32(s * rp / alpha)
            rows = b.shape[1] // len(outs)
            for i, o in enumerate(outs):  # gate's rows, then up's
                w.add_tensor(blk + o + ".weight.lora_a", np.ascontiguousarray(a))
                w.add_tensor(blk + o + ".weight.lora_b",
                             np.ascontiguousarray(b[:, i * rows:(i + 1) * rows, :]))
        k = "l%d.router." % layer
        if k + "A" in src.keys():
            s, rp = scale_of("gate.weight")
            w.add_tensor(blk + "ffn_gate_inp.weight.lora_a", src.get_tensor(k + "A"))
            w.add_tensor(blk + "ffn_gate_inp.weight.lora_b",
                         src.get_tensor(k + "B") * np.float32(s * rp / alpha))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    check_moe_against_peft(os.path.join(OUT, "syn_mixtral.moe_lora.gguf"), path)
    return path


def check_moe_against_peft(path, lora_path):
    """The written GGUF applied as llama.cpp applies a LoRA (each expert's delta
    alpha / rank(lora_b) * lora_b @ lora_a) gives PEFT's merge_and_unload deltas of the experts'
    gate_up / down and the router (PEFT's own ParamWrapper get_delta_weight, not this script's
    reshapes)."""
    import torch
    from gen_moe_lora_fixtures import (ALPHA, R, TARGETS, LoraConfig, get_peft_model, load,
                                       lora_modules)
    src = safe_open(lora_path, "pt")
    pm = get_peft_model(load(), LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS,
                                           lora_dropout=0.0, bias="none")).float().eval()
    with torch.no_grad():
        for key, mod in lora_modules(pm):
            mod.lora_A["default"].weight.copy_(src.get_tensor(key + "A"))
            mod.lora_B["default"].weight.copy_(src.get_tensor(key + "B"))
    base, merged = load(), pm.merge_and_unload()
    r = gguf.GGUFReader(path)
    alpha = float(r.fields[gguf.Keys.Adapter.LORA_ALPHA].parts[-1][0])
    t = {x.name: np.array(x.data) for x in r.tensors}
    worst = 0.0
    for l, (bl, ml) in enumerate(zip(base.model.layers, merged.model.layers)):
        def delta(name):
            k = "blk.%d.%s.weight.lora_" % (l, name)
            a, b = t[k + "a"], t[k + "b"]
            return alpha / b.shape[-1] * (b @ a)
        pairs = ((np.concatenate([delta("ffn_gate_exps"), delta("ffn_up_exps")], axis=1),
                  ml.mlp.experts.gate_up_proj - bl.mlp.experts.gate_up_proj),
                 (delta("ffn_down_exps"), ml.mlp.experts.down_proj - bl.mlp.experts.down_proj),
                 (delta("ffn_gate_inp"), ml.mlp.gate.weight - bl.mlp.gate.weight))
        for got, want in pairs:
            want = want.detach().numpy()
            assert got.shape == want.shape, (got.shape, want.shape)
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    print("syn_mixtral.moe_lora.gguf as llama.cpp applies it vs PEFT's merge_and_unload:", worst)
    assert worst < 1e-5


def main():
    os.makedirs(OUT, exist_ok=True)
    inputs = []
    for family in ARCH:
        convert(family, "syn_%s.lora.safetensors" % family, "syn_%s.lora.gguf" % family)
        inputs.append(os.path.join(FAM, "syn_%s.lora.safetensors" % family))
    convert("phi3", "syn_phi3.fused_lora.safetensors", "syn_phi3.fused.lora.gguf")
    inputs.append(os.path.join(FAM, "syn_phi3.fused_lora.safetensors"))
    inputs.append(convert_moe())
    fixture_versions.write(OUT, __file__, inputs=inputs)


if __name__ == "__main__":
    main()
