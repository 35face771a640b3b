#!/usr/bin/env python3
"""Reference fixtures for the model families beyond llama/qwen2 (issue 48).

For each family a tiny model with random weights is made by transformers from the family's own
config class (nothing downloaded), run in fp32 on the CPU with PEFT, and written to
tests/reference/fixtures/families/:

  syn_<family>/              config.json + model.safetensors (F16; every weight fp16-exact)
  syn_<family>.gguf          the same model as llama.cpp's converter writes it (its metadata keys
                             and tensor names for the architecture; F16 matrices, F32 vectors)
  syn_<family>.lora.safetensors
                             tokens, targets; with a PEFT LoRA (nonzero B): logits, loss, every
                             LoRA A/B and gradient as l{layer}.{proj}.{A,B,gA,gB} (HF q/k row
                             order); base_logits (no adapter); merged_logits (merge_and_unload);
                             greedy: the base model's greedy continuation of `prompt`.
                             Metadata: r, alpha, use_rslora, targets, peft_keys (the tensor names
                             PEFT's save_pretrained wrote, comma-separated), greedy_min_margin.

Families:
  qwen3     per-head RMSNorm on q and k (q_norm / k_norm [head_dim], before RoPE), no q/k/v
            bias, head_dim (16) wider than hidden / heads (8).
  phi3      fused qkv_proj and gate_up_proj (q / k / v and gate / up are row blocks of one
            matrix; llama.cpp's attn_qkv and ffn_up likewise), LoRA on o_proj and down_proj.
  mistral   sliding-window attention (window 5 over 16-token rows and a 28-token greedy run:
            transformers' mask keeps keys j > i - 5); its GGUF is llama.cpp's "llama" with q/k
            rows permuted and llama.attention.sliding_window.
  gemma2    (1 + w) RMSNorms, four per layer (post-attention and post-feedforward ones), GeGLU
            (gelu_pytorch_tanh), embeddings times sqrt(hidden), attention scaled by
            query_pre_attn_scalar^-0.5 (24, not head_dim 16), attention logits soft-capped at 4
            and final logits at 8 (small caps, so tanh bends the tiny model's values), a window
            of 5 on layers 0 and 2 of 3 (layer_types), tied head. Its GGUF is llama.cpp's
            "gemma2": norms stored as 1 + w, post_attention_norm / post_ffw_norm, rotate-half
            q/k rows and gemma2.{attn,final}_logit_softcapping.
  gemma3    Gemma3ForCausalLM (text): gemma2's block without soft-caps, (1 + w) q / k norms per
            head, RoPE base 10000 on sliding layers and 1e6 with linear scaling (factor 2) on
            full ones (rope_parameters per layer type), window 5 on layers 0 and 1 of 3. Its GGUF
            is llama.cpp's "gemma3": norms (q / k norms too) stored as 1 + w, rope.freq_base the
            full layers' base with rope.scaling linear, the sliding layers' base llama.cpp's fixed
            10000; llama.cpp fixes the pattern at 5 sliding layers then a full one, so this
            3-layer model states its own as gemma3.attention.sliding_window_pattern 3 (gguf-py's
            key) and query_pre_attn_scalar 24 as attention.scale.
  mixtral   (--moe) its GGUF is llama.cpp's "llama" with the experts stacked (ffn_gate_exps /
            ffn_up_exps / ffn_down_exps [n_expert, ...]; w1 / w3 / w2), the router ffn_gate_inp
            in F32, llama.expert_count / expert_used_count.
  qwen3_moe (--moe) its GGUF is llama.cpp's "qwen3moe": stacked experts as mixtral's,
            qwen3moe.expert_feed_forward_length; llama.cpp renormalises the top-k weights, so
            norm_topk_prob false is written as qwen3moe.expert_weights_norm false (gguf-py's
            key), and layer 1 (mlp_only_layers; llama.cpp's qwen3moe has experts on every layer)
            keeps its dense ffn_gate / ffn_up / ffn_down with no ffn_gate_inp.
  (--gguf-from-saved: only these three GGUF files, from the committed syn_<family>/ directories,
  so no other fixture changes.)

  syn_phi3.fused_lora.safetensors
            PEFT's own LoRA targets on phi3, qkv_proj, o_proj, gate_up_proj, down_proj (one A
            and one B over q+k+v / gate+up rows per fused module; r 4, alpha 8, nonzero B) on
            syn_phi3 as saved: tokens, targets, logits, loss, l{layer}.{module}.{A,B,gA,gB},
            merged_logits (merge_and_unload); metadata as above. Its own seed (4850), so the
            other fixtures stay as they are.
  qlft_phi3_fused/, qlft_phi3_trained/ + syn_phi3.qlft_export_logits.safetensors
            (--phi3-exports: the second pass) qlft's PEFT exports of that adapter and of one
            qlft trained 4 steps, written by tests/unit/test_phi3_lora.cpp with
            QLFT_WRITE_FAMILY_FIXTURES=1, and the logits PeftModel.from_pretrained gives with
            each on the fixture's tokens ("logits", "trained_logits").

Run: /opt/qlft-ref/bin/python tests/reference/gen_family_fixtures.py [--phi3-fused-only]
     [--phi3-exports]
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)
"""
import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch

import gguf
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

import fixture_versions
from gen_model_fixtures import (GGUF_PROJ, PROJS, batch, greedy, lora_fixture, permute_hf_to_gguf,
                                random_state)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "families")

torch.set_num_threads(2)

# family -> (config class, model class, gguf arch, q/k rows permuted by llama.cpp's converter)
FAMILIES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, "qwen3", False),
    "mistral": (MistralConfig, MistralForCausalLM, "llama", True),
    "phi3": (Phi3Config, Phi3ForCausalLM, "phi3", False),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, "gemma2", False),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, "gemma3", False),
    "mixtral": (MixtralConfig, MixtralForCausalLM, "llama", True),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, "qwen3moe", False),
}


def hf_model(family, cfg):
    conf_cls, model_cls, _, _ = FAMILIES[family]
    c = conf_cls(**cfg)
    c._attn_implementation = "eager"
    return model_cls(c).float().eval()


def save_hf_dir(model, path):
    os.makedirs(path, exist_ok=True)
    if getattr(model.config, "num_local_experts", 0):
        # transformers' own writer: its experts are fused 3D parameters in memory and
        # save_pretrained writes them back as the checkpoints on the Hub have them
        # (block_sparse_moe.experts.{e}.w1 / w2 / w3), in F16 like the others.
        # (a copy: half() would round the model's own RoPE inv_freq buffer too)
        import copy
        copy.deepcopy(model).half().save_pretrained(path)
        return
    sd = {k: v.to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["architectures"] = [type(model).__name__]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True, default=str)


def write_gguf(path, family, cfg, sd):
    """GGUF with llama.cpp's metadata keys and tensor names for the family's architecture."""
    arch, permuted = FAMILIES[family][2], FAMILIES[family][3]
    w = gguf.GGUFWriter(path, arch)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_name("qlft synthetic " + family)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    rope = cfg["rope_parameters"]
    rope = rope.get("full_attention", rope)  # gemma3: the full layers' (llama.cpp's freq_base)
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if rope.get("rope_type") in ("longrope", "su"):  # llama.cpp's Phi3MiniModel: no scaling type
        orig = cfg["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / orig
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
        for n, t in (("long", gguf.MODEL_TENSOR.ROPE_FACTORS_LONG),
                     ("short", gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT)):
            w.add_tensor(gguf.TENSOR_NAMES[t] + ".weight",
                         np.array(rope[n + "_factor"], dtype=np.float32))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if family == "gemma3":
        types = cfg["layer_types"]
        p = types.index("full_attention") + 1  # llama.cpp's rule: layer i slides unless
        assert all((t == "sliding_attention") == (i % p < p - 1) for i, t in enumerate(types))
        w.add_sliding_window_pattern(p)  # (i + 1) % p == 0
        w.add_attention_scale(cfg["query_pre_attn_scalar"] ** -0.5)
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:  # llama.cpp's TextModel / Qwen2MoeModel keys
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if family == "qwen3_moe":
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
            if not cfg["norm_topk_prob"]:
                w.add_expert_weights_norm(False)
    gemma = family in ("gemma2", "gemma3")
    if family == "gemma2":  # llama.cpp's converter: the caps as metadata, norms stored as 1 + w
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        # llama.cpp scales gemma2's scores by head_dim^-0.5 (the 27B: (hidden / heads)^-0.5);
        # the fixture's query_pre_attn_scalar is neither, so it is written as attention.scale
        # (llama.cpp's key of other architectures; qlft's gemma2 reader takes it).
        w.add_attention_scale(cfg["query_pre_attn_scalar"] ** -0.5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def mat(name, t, qk_heads=None):
        a = t.numpy().astype(np.float32)
        if qk_heads and permuted:
            a = permute_hf_to_gguf(a, qk_heads)
        w.add_tensor(name, a.astype(np.float16))

    def vec(name, t):
        a = t.numpy().astype(np.float32)
        w.add_tensor(name, a + 1 if gemma and name.endswith("norm.weight") else a)

    mat("token_embd.weight", sd["model.embed_tokens.weight"])
    vec("output_norm.weight", sd["model.norm.weight"])
    if not cfg["tie_word_embeddings"]:
        mat("output.weight", sd["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        h, b = f"model.layers.{i}.", f"blk.{i}."
        vec(b + "attn_norm.weight", sd[h + "input_layernorm.weight"])
        if gemma:
            vec(b + "post_attention_norm.weight", sd[h + "post_attention_layernorm.weight"])
            vec(b + "ffn_norm.weight", sd[h + "pre_feedforward_layernorm.weight"])
            vec(b + "post_ffw_norm.weight", sd[h + "post_feedforward_layernorm.weight"])
        else:
            vec(b + "ffn_norm.weight", sd[h + "post_attention_layernorm.weight"])
        for n in ("q_norm", "k_norm"):
            if h + "self_attn." + n + ".weight" in sd:
                vec(b + "attn_" + n + ".weight", sd[h + "self_attn." + n + ".weight"])
        moe = h + "block_sparse_moe.gate.weight" if family == "mixtral" else h + "mlp.gate.weight"
        if moe in sd:  # the router in F32 (llama.cpp's converter keeps ffn_gate_inp so)
            w.add_tensor(b + "ffn_gate_inp.weight", sd[moe].numpy().astype(np.float32))
            e = moe[:-len("gate.weight")] + "experts.{}."
            names = ({"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}
                     if family == "mixtral" else
                     {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                      "down_proj": "ffn_down_exps"})
            for hf, gg in names.items():  # [n_expert, rows, cols], expert-major
                a = np.stack([sd[e.format(x) + hf + ".weight"].numpy().astype(np.float32)
                              for x in range(experts)])
                w.add_tensor(b + gg + ".weight", a.astype(np.float16))
            for p in PROJS[:4]:
                heads = nh if p == "q_proj" else nkv if p == "k_proj" else None
                mat(b + GGUF_PROJ[p] + ".weight", sd[h + "self_attn." + p + ".weight"], heads)
            continue
        if h + "self_attn.qkv_proj.weight" in sd:  # phi3: llama.cpp keeps them fused
            mat(b + "attn_qkv.weight", sd[h + "self_attn.qkv_proj.weight"])
            mat(b + "attn_output.weight", sd[h + "self_attn.o_proj.weight"])
            mat(b + "ffn_up.weight", sd[h + "mlp.gate_up_proj.weight"])
            mat(b + "ffn_down.weight", sd[h + "mlp.down_proj.weight"])
            continue
        for p in PROJS:
            sub = "self_attn." if p in PROJS[:4] else "mlp."
            heads = nh if p == "q_proj" else nkv if p == "k_proj" else None
            mat(b + GGUF_PROJ[p] + ".weight", sd[h + sub + p + ".weight"], heads)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def peft_keys(model, r, alpha, targets, rslora):
    """The tensor names PEFT's save_pretrained writes for this adapter configuration."""
    from peft import LoraConfig, get_peft_model
    lc = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                    use_rslora=rslora)
    pm = get_peft_model(model, lc)
    with tempfile.TemporaryDirectory() as d:
        pm.save_pretrained(d)
        with safe_open(os.path.join(d, "adapter_model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
    pm.unload()
    return keys


def merged_logits(model, out, tok, r, alpha, targets, rslora):
    """PEFT's merge_and_unload of the fixture adapter, run on tok."""
    import copy
    from peft import LoraConfig, get_peft_model
    lc = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                    use_rslora=rslora)
    pm = get_peft_model(copy.deepcopy(model), lc).float().eval()
    with torch.no_grad():
        for name, mod in pm.named_modules():
            if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
                layer = int(name.split(".layers.")[1].split(".")[0])
                key = f"l{layer}.{name.split('.')[-1]}."
                mod.lora_A["default"].weight.copy_(out[key + "A"])
                mod.lora_B["default"].weight.copy_(out[key + "B"])
        merged = pm.merge_and_unload()
        v = model.config.get_text_config().vocab_size
        return merged(input_ids=tok).logits.reshape(-1, v).clone()


def synthetic(family, cfg, r, alpha, targets, rslora, gen, model=None, peft_targets=None):
    """model: the family's own (hf_model) unless given; peft_targets: PEFT's target_modules for
    targets (the names qlft's lora.target_modules takes) where the names alone would reach
    other modules (an image-text model's vision tower)."""
    name = "syn_" + family
    model = model or hf_model(family, cfg)
    sd = random_state(model, gen)
    model.load_state_dict(sd, strict=False)
    if cfg["tie_word_embeddings"]:
        model.tie_weights()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    save_hf_dir(model, os.path.join(OUT, name))
    if family in FAMILIES and FAMILIES[family][2]:
        gguf_from_saved(family)
    prompt = [5, 17, 42, 9]
    ids, margin = greedy(model, prompt, 24)
    tok, tgt = batch(cfg["vocab_size"], gen)
    pt = peft_targets or targets
    keys = peft_keys(model, r, alpha, pt, rslora)
    out, meta = lora_fixture(model, tok, tgt, r, alpha, pt, rslora, gen)
    meta["targets"] = ",".join(targets)
    if peft_targets:
        meta["peft_target_modules"] = peft_targets
    with torch.no_grad():
        out["base_logits"] = model(input_ids=tok).logits.reshape(-1, cfg["vocab_size"]).clone()
    out["merged_logits"] = merged_logits(model, out, tok, r, alpha, pt, rslora)
    out["prompt"] = torch.tensor(prompt, dtype=torch.int32)
    out["greedy"] = torch.tensor(ids, dtype=torch.int32)
    meta["greedy_min_margin"] = "%g" % margin
    meta["peft_keys"] = ",".join(keys)
    save_file(out, os.path.join(OUT, name + ".lora.safetensors"), metadata=meta)
    print(name, "loss", float(out["loss"]), "greedy", ids, "min margin %.3g" % margin)


def gguf_from_saved(family):
    """syn_<family>.gguf from the committed syn_<family>/ (its fp16-exact weights; the experts
    under the names save_pretrained writes)."""
    d = os.path.join(OUT, "syn_" + family)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    sd = {k: v.float() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    write_gguf(d + ".gguf", family, cfg, sd)
    print("syn_" + family + ".gguf", os.path.getsize(d + ".gguf"))


PHI3 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=160, rms_norm_eps=1e-5,
            max_position_embeddings=512, original_max_position_embeddings=512,
            tie_word_embeddings=False, sliding_window=None, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, head_dim=8,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
PHI3_FUSED_TARGETS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


def saved_phi3():
    """syn_phi3 as committed (its fp16-exact weights, in fp32)."""
    model = hf_model("phi3", PHI3)
    sd = load_file(os.path.join(OUT, "syn_phi3", "model.safetensors"))
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return model


def phi3_fused_lora():
    """PEFT's LoRA on phi3's fused modules: syn_phi3.fused_lora.safetensors."""
    gen = torch.Generator().manual_seed(4850)
    model = saved_phi3()
    tok, tgt = batch(PHI3["vocab_size"], gen)
    keys = peft_keys(model, 4, 8, PHI3_FUSED_TARGETS, False)
    out, meta = lora_fixture(model, tok, tgt, 4, 8, PHI3_FUSED_TARGETS, False, gen)
    for k in list(out):
        if ".qkv_proj.B" in k or ".gate_up_proj.B" in k:
            assert out[k].shape[0] in (32 + 2 * 2 * 8, 2 * 64), (k, out[k].shape)
    out["merged_logits"] = merged_logits(model, out, tok, 4, 8, PHI3_FUSED_TARGETS, False)
    meta["peft_keys"] = ",".join(keys)
    save_file(out, os.path.join(OUT, "syn_phi3.fused_lora.safetensors"), metadata=meta)
    print("syn_phi3.fused_lora loss", float(out["loss"]))


def phi3_exports():
    """Second pass: PEFT's logits with qlft's exports of a phi3 fused adapter (the fixture's:
    "logits"; one qlft trained: "trained_logits"), where they exist."""
    from peft import PeftModel
    path = os.path.join(OUT, "syn_phi3.qlft_export_logits.safetensors")
    tok = load_file(os.path.join(OUT, "syn_phi3.fused_lora.safetensors"))["tokens"].long()
    t = {}
    for name, key in [("qlft_phi3_fused", "logits"), ("qlft_phi3_trained", "trained_logits")]:
        d = os.path.join(OUT, name)
        if not os.path.isdir(d):
            continue
        pm = PeftModel.from_pretrained(saved_phi3(), d).float().eval()
        with torch.no_grad():
            t[key] = pm(input_ids=tok).logits.reshape(-1, PHI3["vocab_size"]).clone()
        print(name, "loaded by PEFT")
    if t:
        save_file(t, path)
    elif os.path.exists(path):
        os.remove(path)


def routing_margin(model, tok):
    """The smallest gap, over every MoE layer and row, between the k-th and (k+1)-th router
    probability: routing decisions closer than float rounding would make the fixture fragile."""
    gaps = []
    hooks = [l.mlp.gate.register_forward_hook(
        lambda m, i, o: gaps.append(float(torch.topk(torch.softmax(o[0].float(), -1),
                                                      m.top_k + 1, -1).values.diff(dim=-1)
                                          .abs()[..., -1].min())))
             for l in model.model.layers if hasattr(l.mlp, "experts")]
    with torch.no_grad():
        model(input_ids=tok)
    for h in hooks:
        h.remove()
    return min(gaps)


# Mixtral: 2 layers, 4 experts, top-2, no sliding window; LoRA on the attention projections.
MIXTRAL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, vocab_size=160, rms_norm_eps=1e-5,
               max_position_embeddings=512, tie_word_embeddings=False, sliding_window=None,
               num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
               output_router_logits=False,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


# Qwen3-MoE: qwen3's q / k norms, 3 layers with experts on 0 and 2 (mlp_only_layers [1]: a
# dense MLP of intermediate_size there), 4 experts of moe_intermediate_size 24, top-2 weights
# NOT renormalised (norm_topk_prob false, the config class's default).
QWEN3_MOE = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=24,
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=160, rms_norm_eps=1e-6, max_position_embeddings=512,
                 tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                 decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=False,
                 router_aux_loss_coef=0.001, output_router_logits=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def moe_fixture(family, cfg, seed, targets):
    """syn_<family> (its own seed, so the other fixtures stay as they are)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    synthetic(family, cfg, 4, 8, targets, False, gen)
    # transformers' own reader of the saved files (their per-expert tensors fused again)
    name = "syn_" + family
    model = FAMILIES[family][1].from_pretrained(os.path.join(OUT, name), dtype=torch.float32,
                                                attn_implementation="eager").eval()
    out = load_file(os.path.join(OUT, name + ".lora.safetensors"))
    with safe_open(os.path.join(OUT, name + ".lora.safetensors"), "pt") as f:
        meta = f.metadata()
    tok = out["tokens"].long()
    with torch.no_grad():  # the saved model is the one the fixture ran
        d = (model(input_ids=tok).logits.reshape(-1, 160) - out["base_logits"]).abs().max()
        print("reloaded vs fixture max diff", float(d))
        assert d < 1e-5, d
    meta["routing_min_margin"] = "%g" % routing_margin(model, tok)
    save_file(out, os.path.join(OUT, name + ".lora.safetensors"), metadata=meta)
    print(name, "routing min margin", meta["routing_min_margin"])


def moe_fixtures():
    moe_fixture("mixtral", MIXTRAL, 4860, PROJS[:4])
    # (PEFT 0.21 maps gate_proj / up_proj / down_proj onto the experts' fused parameters
    # (target_parameters), LoRA qlft does not have yet: attention only.)
    moe_fixture("qwen3_moe", QWEN3_MOE, 4861, PROJS[:4])


# PEFT's target_modules for the language model's projections of an image-text model (the names
# alone would reach the vision tower's q_proj / k_proj / v_proj too): a regex, as qlft writes.
GEMMA3_VLM_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def gemma3_vlm(gen):
    """syn_gemma3_vlm: Gemma3ForConditionalGeneration from Gemma3Config, syn_gemma3's text model
    (sliding window 5 on layers 0 and 1, RoPE bases 1e4 / 1e6 with linear x2 on the full layer)
    beside a tiny SigLIP vision tower and projector, saved as transformers 5 names it
    (model.language_model.*, model.vision_tower.*, model.multi_modal_projector.*, head tied);
    the text-only logits, LoRA gradients and greedy ids of the language model."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig
    text = dict(GEMMA3)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, image_size=28, patch_size=14)
    c = Gemma3Config(text_config=Gemma3TextConfig(**text), vision_config=vision,
                     mm_tokens_per_image=1, boi_token_index=150, eoi_token_index=151,
                     image_token_index=152, tie_word_embeddings=True)
    c._attn_implementation = "eager"
    c.text_config._attn_implementation = "eager"
    c.vision_config._attn_implementation = "eager"
    model = Gemma3ForConditionalGeneration(c).float().eval()
    synthetic("gemma3_vlm", text, 4, 8, PROJS, False, gen, model=model,
              peft_targets=GEMMA3_VLM_TARGETS)


GEMMA3 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=160,
              rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=True,
              query_pre_attn_scalar=24, sliding_window=5,
              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
              hidden_activation="gelu_pytorch_tanh", pad_token_id=0, bos_token_id=2,
              eos_token_id=1,
              rope_parameters={
                  "full_attention": {"rope_type": "linear", "factor": 2.0,
                                     "rope_theta": 1000000.0},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemma3-vlm", action="store_true",
                    help="only syn_gemma3_vlm (Gemma3ForConditionalGeneration)")
    ap.add_argument("--phi3-fused-only", action="store_true",
                    help="only syn_phi3.fused_lora.safetensors, from the committed syn_phi3")
    ap.add_argument("--phi3-exports", action="store_true",
                    help="only the second pass on qlft's committed phi3 export")
    ap.add_argument("--moe", action="store_true", help="only the mixture-of-experts fixtures")
    ap.add_argument("--gguf-from-saved", action="store_true",
                    help="only the mixtral, qwen3_moe and gemma3 GGUF files, from their "
                         "committed directories")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if args.gguf_from_saved:
        for family in ("mixtral", "qwen3_moe", "gemma3"):
            gguf_from_saved(family)
        fixture_versions.write(OUT, __file__, inputs=[])
        return
    if args.gemma3_vlm:
        gemma3_vlm(torch.Generator().manual_seed(4849))
        fixture_versions.write(OUT, __file__, inputs=[])
        return
    if args.moe:
        moe_fixtures()
        fixture_versions.write(OUT, __file__, inputs=[])
        return
    if args.phi3_fused_only or args.phi3_exports:
        if args.phi3_fused_only:
            phi3_fused_lora()
        phi3_exports()
        fixture_versions.write(OUT, __file__, inputs=[])
        return
    gen = torch.Generator().manual_seed(4848)
    torch.manual_seed(4848)

    qwen3 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=160, rms_norm_eps=1e-6,
                 max_position_embeddings=512, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    synthetic("qwen3", qwen3, 4, 8, PROJS, False, gen)

    mistral = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=160,
                   rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=False,
                   sliding_window=5,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    synthetic("mistral", mistral, 4, 8, PROJS, False, gen)

    synthetic("phi3", PHI3, 4, 8, ["o_proj", "down_proj"], False, gen)

    gemma2 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=160,
                  rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=True,
                  query_pre_attn_scalar=24, attn_logit_softcapping=4.0,
                  final_logit_softcapping=8.0, sliding_window=5,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                  hidden_activation="gelu_pytorch_tanh", pad_token_id=0, bos_token_id=2,
                  eos_token_id=1,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    synthetic("gemma2", gemma2, 4, 8, PROJS, False, gen)

    synthetic("gemma3", dict(GEMMA3), 4, 8, PROJS, False, gen)
    gemma3_vlm(torch.Generator().manual_seed(4849))

    phi3_fused_lora()
    phi3_exports()
    fixture_versions.write(OUT, __file__, inputs=[])
    for f in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, f)
        print(f, os.path.getsize(p) if os.path.isfile(p) else "dir")


if __name__ == "__main__":
    sys.exit(main())
