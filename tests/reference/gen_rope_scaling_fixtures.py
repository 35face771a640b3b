#!/usr/bin/env python3
"""Reference fixtures for RoPE scaling (issue 43): llama3, linear, dynamic NTK and yarn.

Runs transformers in fp32 on the CPU and writes tests/reference/fixtures/rope_scaling/:

  model.safetensors      one tiny random Llama (hidden 64, 2 layers, 4 heads, 2 KV heads,
                         head_dim 16, vocab 256, tied embeddings; fp16-exact weights stored F16)
                         shared by every variant.
  config_<variant>.json  its config.json per variant: linear and dynamic with
                         max_position_embeddings 32, llama3 and yarn with
                         original_max_position_embeddings 32 (and max_position_embeddings 128), so
                         that the 72-token sequences are scaled: llama3 and yarn as transformers 5 writes them (rope_parameters),
                         linear and dynamic in the legacy v4 form (rope_scaling with "type",
                         rope_theta beside it); transformers loads each back here.
  reference.safetensors  per variant v: v.inv_freq (the rotary module's inv_freq after a forward of
                         the 72 tokens: dynamic's rescaled base), v.attention_scaling, v.logits at
                         the positions in `positions` of that forward, and v.greedy: 24 greedy
                         tokens after the 40-token prompt (model.generate with its KV cache, a
                         fresh model: dynamic NTK's cached length is state), and shared tokens.
  llama3.gguf            the llama3 variant as llama.cpp's converter writes it: q/k rows permuted
                         into adjacent pairs and the scaling as the tensor rope_freqs.weight (one
                         divisor per frequency, convert_hf_to_gguf.py's formula), no
                         rope.scaling.type key.

  peft_adapter/          a LoRA (r=4, alpha=8, all 7 targets) qlft trained on the llama3 variant
                         (6 AdamW steps on the 72 tokens): written by OUR code, the C++ test
                         `QLFT_WRITE_ROPE_FIXTURES=1 test_rope_scaling --gtest_filter=*WriteFixtures*`.
  longrope.safetensors, config_longrope.json
                         (--longrope) Phi-3's LongRoPE as transformers' Phi3RotaryEmbedding computes
                         it (original 32, max 128, head_dim 16): inv_freq of a 32-token call
                         (short_factor) and of a 72-token call (long_factor), attention_scaling and
                         the last position's cos of each.
  longrope_phi3.safetensors, config_longrope_phi3.json
                         (--longrope) the synthetic Phi-3 of fixtures/families/syn_phi3 with
                         LongRoPE (original 32, max 128): tokens [1, 72], transformers' logits of
                         the 72-token call (long_logits) and of its first 24 tokens (short_logits).
  longrope_phi3.gguf     (--longrope) that model as llama.cpp's converter writes it: fused attn_qkv /
                         ffn_up, the factors as tensors rope_factors_long / rope_factors_short.weight,
                         phi3.rope.scaling.original_context_length and .attn_factor.
  peft.safetensors       (--peft) base_logits and peft_logits: the llama3 model's logits over the
                         72 tokens (at `positions`) without and with
                         PeftModel.from_pretrained(peft_adapter/).

Run (the reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it):
  /opt/qlft-ref/bin/python tests/reference/gen_rope_scaling_fixtures.py
  QLFT_WRITE_ROPE_FIXTURES=1 <build>/tests/test_rope_scaling --gtest_filter=*WriteFixtures*
  /opt/qlft-ref/bin/python tests/reference/gen_rope_scaling_fixtures.py --peft
"""
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixture_versions  # noqa: E402
import gen_model_fixtures as gm  # noqa: E402  (random weights, q/k permutation)

import gguf  # noqa: E402

OUT = os.path.join(HERE, "fixtures", "rope_scaling")
BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, rms_norm_eps=1e-5,
            max_position_embeddings=32, tie_word_embeddings=True, bos_token_id=1,
            eos_token_id=2, attention_bias=False)
THETA = 10000.0
VARIANTS = {
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "linear": {"type": "linear", "factor": 2.0},
    "dynamic": {"type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
             "beta_fast": 32.0, "beta_slow": 1.0},
}
SEQ, PROMPT, NEW = 72, 40, 24
POSITIONS = list(range(0, SEQ, 6)) + [SEQ - 1]

torch.set_num_threads(2)


def config_json(name):
    cfg = dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               torch_dtype="float32")
    rs = dict(VARIANTS[name])
    if "original_max_position_embeddings" in rs:  # the extended length, as real configs have it
        cfg["max_position_embeddings"] = 128
    if "type" in rs:  # legacy (transformers 4) form
        cfg["rope_theta"] = THETA
        cfg["rope_scaling"] = rs
    else:
        cfg["rope_parameters"] = dict(rs, rope_theta=THETA)
    return cfg


def load(name):
    """A fresh model of the variant, read back from its written config.json."""
    d = os.path.join(OUT, "_hf_" + name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config_json(name), f, indent=1, sort_keys=True)
    os.link(os.path.join(OUT, "model.safetensors"), os.path.join(d, "model.safetensors"))
    m = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32)
    m.config._attn_implementation = "eager"
    for fn in os.listdir(d):
        os.unlink(os.path.join(d, fn))
    os.rmdir(d)
    return m.eval()


def llama3_rope_freqs(rs, dim):
    """convert_hf_to_gguf.py (LlamaModel): the per-frequency divisors llama.cpp applies."""
    freqs = 1.0 / (THETA ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    out = []
    for f in freqs.tolist():
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_llama3_gguf(path, sd):
    c = BASE
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("qlft rope scaling llama3")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(128)
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("rope_freqs.weight", llama3_rope_freqs(VARIANTS["llama3"], c["head_dim"]))
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy().astype(np.float16))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy().astype(np.float32))
    for i in range(c["num_hidden_layers"]):
        h, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", sd[h + "input_layernorm.weight"].numpy())
        w.add_tensor(b + "ffn_norm.weight", sd[h + "post_attention_layernorm.weight"].numpy())
        for p in gm.PROJS:
            sub = "self_attn." if p in gm.PROJS[:4] else "mlp."
            a = sd[h + sub + p + ".weight"].numpy().astype(np.float32)
            if p == "q_proj":
                a = gm.permute_hf_to_gguf(a, nh)
            elif p == "k_proj":
                a = gm.permute_hf_to_gguf(a, nkv)
            w.add_tensor(b + gm.GGUF_PROJ[p] + ".weight", a.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def peft_stage():
    """PEFT's logits with the adapter qlft trained (peft_adapter/, see the module docstring)."""
    from peft import PeftModel
    tok = torch.tensor([load_file(os.path.join(OUT, "reference.safetensors"))["tokens"].tolist()])
    base = load("llama3")
    with torch.no_grad():
        base_logits = base(input_ids=tok).logits[0].clone()
    pm = PeftModel.from_pretrained(load("llama3"), os.path.join(OUT, "peft_adapter")).eval()
    with torch.no_grad():
        peft_logits = pm(input_ids=tok).logits[0].clone()
    d = float((peft_logits - base_logits).abs().max() / peft_logits.abs().max())
    print(f"peft: the adapter changes the logits by {d:.3g} (relative)")
    assert d > 1e-2, d
    save_file({"base_logits": base_logits[POSITIONS].clone(),
               "peft_logits": peft_logits[POSITIONS].clone()},
              os.path.join(OUT, "peft.safetensors"))


# Phi-3's LongRoPE (Phi3ForCausalLM, rope_type "longrope"): per-pair divisors short_factor up to
# original_max_position_embeddings, long_factor past it, cos / sin scaled by
# sqrt(1 + ln(max / original) / ln(original)).
LONGROPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=128,
                original_max_position_embeddings=32, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "longrope", "rope_theta": THETA,
                                 "short_factor": [1.0, 1.05, 1.1, 1.3, 1.7, 2.2, 2.9, 3.5],
                                 "long_factor": [1.0, 1.2, 1.9, 3.1, 5.3, 8.0, 11.5, 16.0]})


def longrope():
    """longrope.safetensors: transformers' Phi3 rotary table for a 32-token and a 72-token call
    (short.inv_freq / long.inv_freq, attention_scaling, and the cos of the last position), and
    config_longrope.json (the Phi-3 config.json qlft reads)."""
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
    cfg = Phi3Config(**LONGROPE)
    d = cfg.to_dict()
    d["architectures"] = ["Phi3ForCausalLM"]
    with open(os.path.join(OUT, "config_longrope.json"), "w") as f:
        json.dump(d, f, indent=1, sort_keys=True, default=str)
    out = {}
    for name, n in (("short", 32), ("long", SEQ)):
        rot = Phi3RotaryEmbedding(cfg)  # a fresh module per call length
        x = torch.zeros(1, n, 16)
        cos, _ = rot(x, torch.arange(n)[None])
        out[name + ".inv_freq"] = rot.inv_freq.float().clone()
        out[name + ".cos_last"] = cos[0, -1].float().clone()
        out[name + ".attention_scaling"] = torch.tensor([float(rot.attention_scaling)])
    save_file(out, os.path.join(OUT, "longrope.safetensors"))
    print("longrope attention_scaling", float(out["long.attention_scaling"]))
    longrope_phi3()


def longrope_phi3():
    """longrope_phi3.safetensors + config_longrope_phi3.json: the committed synthetic Phi-3
    (fixtures/families/syn_phi3, head_dim 8) with LongRoPE (original 32, max 128): tokens [1, 72]
    and transformers' logits of the 72-token call (long factors) and of its first 24 tokens
    (short factors)."""
    from transformers import Phi3Config, Phi3ForCausalLM
    src = os.path.join(HERE, "fixtures", "families", "syn_phi3")
    with open(os.path.join(src, "config.json")) as f:
        d = json.load(f)
    d.update(max_position_embeddings=128, original_max_position_embeddings=32,
             rope_parameters={"rope_type": "longrope", "rope_theta": THETA,
                              "short_factor": [1.0, 1.4, 2.3, 3.0],
                              "long_factor": [1.0, 2.5, 6.0, 12.0]})
    with open(os.path.join(OUT, "config_longrope_phi3.json"), "w") as f:
        json.dump(d, f, indent=1, sort_keys=True)
    cfg = Phi3Config(**{k: v for k, v in d.items() if k != "architectures"})
    cfg._attn_implementation = "eager"
    m = Phi3ForCausalLM(cfg).float().eval()
    sd = load_file(os.path.join(src, "model.safetensors"))
    m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    gen = torch.Generator().manual_seed(4870)
    tok = torch.randint(3, 160, (1, SEQ), generator=gen)
    out = {"tokens": tok.to(torch.int32)}
    with torch.no_grad():
        out["long_logits"] = m(input_ids=tok).logits[0].clone()
        out["short_logits"] = _same(m, cfg, sd)(input_ids=tok[:, :24]).logits[0].clone()
    save_file(out, os.path.join(OUT, "longrope_phi3.safetensors"))
    print("longrope_phi3 logits", tuple(out["long_logits"].shape), tuple(out["short_logits"].shape))
    # The same model as llama.cpp's converter writes it (Phi3MiniModel: rope_factors_long /
    # rope_factors_short, rope.scaling.original_context_length and attn_factor).
    import gen_family_fixtures as gf
    gf.write_gguf(os.path.join(OUT, "longrope_phi3.gguf"), "phi3", d,
                  {k: v.float() for k, v in sd.items()})


def _same(m, cfg, sd):
    """A fresh model with the same weights (the rotary module keeps the table it switched to)."""
    from transformers import Phi3ForCausalLM
    f = Phi3ForCausalLM(cfg).float().eval()
    f.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return f


def main():
    if sys.argv[1:] == ["--longrope"]:
        longrope()
        fixture_versions.write(OUT, __file__, inputs=[])
        return
    if sys.argv[1:] == ["--peft"]:
        peft_stage()
        fixture_versions.write(OUT, __file__, inputs=[])
        return
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(4343)
    gen = torch.Generator().manual_seed(4343)
    proto = gm.hf_model("llama", dict(BASE, rope_parameters={"rope_type": "default",
                                                             "rope_theta": THETA}))
    sd = gm.random_state(proto, gen)
    st = {k: v.to(torch.float16).contiguous() for k, v in sd.items() if k != "lm_head.weight"}
    save_file(st, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})

    tok = torch.randint(3, BASE["vocab_size"], (1, SEQ), generator=gen)
    tok[0, 0] = 1
    out = {"tokens": tok[0].to(torch.int32),
           "positions": torch.tensor(POSITIONS, dtype=torch.int32)}
    plain = None
    for name in VARIANTS:
        with open(os.path.join(OUT, f"config_{name}.json"), "w") as f:
            json.dump(config_json(name), f, indent=1, sort_keys=True)
        m = load(name)
        with torch.no_grad():
            lg = m(input_ids=tok).logits[0]
        rot = m.model.rotary_emb
        out[name + ".inv_freq"] = rot.inv_freq.detach().float().clone()
        out[name + ".attention_scaling"] = torch.tensor([float(rot.attention_scaling)])
        out[name + ".logits"] = lg[POSITIONS].clone()
        m = load(name)  # fresh: dynamic NTK keeps the longest length it has seen
        with torch.no_grad():
            g = m.generate(tok[:, :PROMPT], max_new_tokens=NEW, min_new_tokens=NEW,
                           do_sample=False, eos_token_id=None, pad_token_id=0,
                           output_scores=True, return_dict_in_generate=True)
        out[name + ".greedy"] = g.sequences[0, PROMPT:].to(torch.int32).clone()
        # Each step's top-2 margin: a tie would make the greedy comparison a coin toss.
        margin = min(float(t[0] - t[1]) for t in
                     (torch.topk(s[0].float(), 2).values for s in g.scores))
        assert margin > 1e-3, (name, margin)
        # The scaling must matter at these lengths, or the comparison proves nothing.
        if plain is None:
            pm = gm.hf_model("llama", dict(BASE, rope_parameters={"rope_type": "default",
                                                                  "rope_theta": THETA}))
            pm.load_state_dict(sd, strict=False)
            pm.tie_weights()
            with torch.no_grad():
                plain = pm(input_ids=tok).logits[0][POSITIONS]
        d = float((lg[POSITIONS] - plain).abs().max() / plain.abs().max())
        print(f"{name}: attention_scaling {float(rot.attention_scaling):.6f}, rel change vs "
              f"unscaled {d:.3g}, greedy {out[name + '.greedy'].tolist()} (min margin "
              f"{margin:.3g})")
        assert d > 1e-3, name
    save_file(out, os.path.join(OUT, "reference.safetensors"))
    write_llama3_gguf(os.path.join(OUT, "llama3.gguf"), sd)
    fixture_versions.write(OUT, __file__, inputs=[])


if __name__ == "__main__":
    main()
