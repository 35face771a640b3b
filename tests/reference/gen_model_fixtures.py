#!/usr/bin/env python3
"""Reference fixtures for the Llama-family forward/backward with LoRA (issue 3).

Runs transformers + peft in fp32 on the CPU and writes tests/reference/fixtures/model/:

  stories260k.safetensors   stories260K (read from /work/shared/models/stories260K.gguf, q/k rows
                            un-permuted into HF order) with a PEFT LoRA (r=4, alpha=8, all 7
                            targets): tokens, targets, logits, loss, every LoRA A/B and gradient,
                            and the greedy continuation of BOS (100 tokens) of the base model.
  syn_qwen2/                synthetic qwen2 model (q/k/v biases, tied embeddings, head_dim 8 with
                            hidden 32 so q is wider than the residual) as config.json +
                            model.safetensors (F16), and syn_qwen2.gguf (qwen2 GGUFs keep HF
                            rotate-half order).
  syn_qwen2.lora.safetensors  LoRA fixture for it (rsLoRA, targets q,k,v,o,down).
  syn_llama/ + syn_llama.gguf synthetic llama model (untied head), GGUF rows permuted as
                            llama.cpp's converter does; syn_llama_q8_0.gguf, syn_llama_q4_0.gguf.
  syn_llama.lora.safetensors  LoRA fixture for it (r=8, alpha=16, all targets).
  syn_llama.quant.safetensors logits of the base model whose linear weights were quantized and
                            dequantized: NF4 (bitsandbytes codes, double quant), INT8 (bitsandbytes
                            row-wise), and Q8_0/Q4_0 (gguf package, every 2-D tensor).

LoRA tensors are stored in HF (rotate-half) q/k row order under "l{layer}.{proj}.{A,B,gA,gB}".
All weights are rounded to values exact in fp16 so the F16 files hold the fp32 model exactly.

Run: /opt/qlft-ref/bin/python tests/reference/gen_model_fixtures.py
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import gguf
from gguf import quants
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import fixture_versions

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "model")
SHARED = os.environ.get("QLFT_SHARED_DIR", os.path.join(HERE, "..", "..", "..", "shared"))
PROJS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GGUF_PROJ = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}

torch.set_num_threads(2)


# ---- RoPE row order ---------------------------------------------------------------------------
def permute_hf_to_gguf(w, n_head):
    """llama.cpp convert_hf_to_gguf permute(): rotate-half rows -> adjacent-pair rows."""
    w = np.asarray(w)
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def permute_gguf_to_hf(w, n_head):
    w = np.asarray(w)
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# ---- helpers -----------------------------------------------------------------------------------
def f16_exact(t):
    return t.to(torch.float16).to(torch.float32)


def hf_model(arch, cfg):
    if arch == "qwen2":
        c = Qwen2Config(**cfg)
        m = Qwen2ForCausalLM(c)
    else:
        c = LlamaConfig(**cfg)
        m = LlamaForCausalLM(c)
    c._attn_implementation = "eager"
    return m.float().eval()


def state_from_gguf(path, cfg):
    """stories260K: HF state dict from the GGUF (q/k rows un-permuted)."""
    r = gguf.GGUFReader(path)
    t = {x.name: np.array(x.data, dtype=np.float32) for x in r.tensors}
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    sd = {"model.embed_tokens.weight": t["token_embd.weight"],
          "model.norm.weight": t["output_norm.weight"],
          "lm_head.weight": t["output.weight"]}
    for i in range(cfg["num_hidden_layers"]):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        sd[h + "input_layernorm.weight"] = t[b + "attn_norm.weight"]
        sd[h + "post_attention_layernorm.weight"] = t[b + "ffn_norm.weight"]
        for p in PROJS:
            w = t[b + GGUF_PROJ[p] + ".weight"]
            if p == "q_proj":
                w = permute_gguf_to_hf(w, nh)
            elif p == "k_proj":
                w = permute_gguf_to_hf(w, nkv)
            sub = "self_attn." if p in PROJS[:4] else "mlp."
            sd[h + sub + p + ".weight"] = w
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}


def random_state(model, gen):
    """Random fp16-exact weights with a realistic scale (norm weights around 1)."""
    sd = {}
    for k, v in model.state_dict().items():
        if "norm" in k:
            x = 1.0 + 0.2 * torch.randn(v.shape, generator=gen)
        elif "embed" in k or "lm_head" in k:
            x = 0.5 * torch.randn(v.shape, generator=gen)
        elif k.endswith(".bias"):
            x = 0.2 * torch.randn(v.shape, generator=gen)
        else:
            x = torch.randn(v.shape, generator=gen) / np.sqrt(v.shape[-1])
        sd[k] = f16_exact(x)
    return sd


def batch(vocab, gen, n=2, t=16, bos=None):
    tok = torch.randint(3, vocab, (n, t), generator=gen)
    if bos is not None:
        tok[:, 0] = bos
    tgt = torch.cat([tok[:, 1:], torch.randint(3, vocab, (n, 1), generator=gen)], 1).clone()
    tgt[0, 3] = -100
    tgt[1, 0] = -100
    tgt[1, 9] = -100
    tgt[1, 15] = -100
    return tok, tgt


def lora_fixture(model, tok, tgt, r, alpha, targets, rslora, gen):
    """Wraps model in PEFT, sets A and a NONZERO B, returns tensors to save."""
    lc = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                    use_rslora=rslora, init_lora_weights=True)
    pm = get_peft_model(model, lc).float().eval()
    out = {}
    with torch.no_grad():
        for name, mod in pm.named_modules():
            if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
                a, bm = mod.lora_A["default"].weight, mod.lora_B["default"].weight
                a.copy_((torch.rand(a.shape, generator=gen) * 2 - 1) / np.sqrt(a.shape[1]))
                bm.copy_(0.03 * torch.randn(bm.shape, generator=gen))
    logits = pm(input_ids=tok).logits.float()
    v = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, v), tgt.reshape(-1), ignore_index=-100)
    loss.backward()
    for name, mod in pm.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            layer = int(name.split(".layers.")[1].split(".")[0])
            proj = name.split(".")[-1]
            key = f"l{layer}.{proj}."
            out[key + "A"] = mod.lora_A["default"].weight.detach().clone()
            out[key + "B"] = mod.lora_B["default"].weight.detach().clone()
            out[key + "gA"] = mod.lora_A["default"].weight.grad.detach().clone()
            out[key + "gB"] = mod.lora_B["default"].weight.grad.detach().clone()
    out["tokens"] = tok.to(torch.int32)
    out["targets"] = tgt.to(torch.int32)
    out["logits"] = logits.detach().reshape(-1, v).clone()
    out["loss"] = loss.detach().reshape(1).clone()
    pm.unload()  # restore the base model
    meta = {"r": str(r), "alpha": str(alpha), "use_rslora": str(rslora).lower(),
            "targets": ",".join(targets)}
    return out, meta


def greedy(model, prompt, n):
    ids = list(prompt)
    margins = []
    with torch.no_grad():
        for _ in range(n):
            lg = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            top = torch.topk(lg, 2).values
            margins.append(float(top[0] - top[1]))
            ids.append(int(torch.argmax(lg)))
    return ids[len(prompt):], min(margins)


def save_hf_dir(model, path):
    os.makedirs(path, exist_ok=True)
    sd = {k: v.to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    # transformers 5 writes rope_parameters; most configs on the Hub carry the v4 key too.
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True, default=str)


def write_gguf(path, arch, cfg, sd, qtype=None):
    """GGUF as llama.cpp's converter writes it (llama: q/k permuted; qwen2: not)."""
    w = gguf.GGUFWriter(path, arch)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_name("qlft synthetic " + arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype is None else gguf.LlamaFileType.MOSTLY_F16)

    def mat(name, t, qk_heads=None):
        a = t.numpy().astype(np.float32)
        if qk_heads and arch != "qwen2":
            a = permute_hf_to_gguf(a, qk_heads)
        if qtype is None:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, quants.quantize(a, qtype), raw_dtype=qtype)

    def vec(name, t):
        w.add_tensor(name, t.numpy().astype(np.float32))

    mat("token_embd.weight", sd["model.embed_tokens.weight"])
    vec("output_norm.weight", sd["model.norm.weight"])
    if not cfg["tie_word_embeddings"]:
        mat("output.weight", sd["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        h, b = f"model.layers.{i}.", f"blk.{i}."
        vec(b + "attn_norm.weight", sd[h + "input_layernorm.weight"])
        vec(b + "ffn_norm.weight", sd[h + "post_attention_layernorm.weight"])
        for p in PROJS:
            sub = "self_attn." if p in PROJS[:4] else "mlp."
            heads = nh if p == "q_proj" else nkv if p == "k_proj" else None
            mat(b + GGUF_PROJ[p] + ".weight", sd[h + sub + p + ".weight"], heads)
            if p in PROJS[:3] and (h + sub + p + ".bias") in sd:
                vec(b + GGUF_PROJ[p] + ".bias", sd[h + sub + p + ".bias"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- quantize/dequantize references -----------------------------------------------------------
def nf4_roundtrip(w):
    """bitsandbytes NF4 codes (blocksize 64, double quant), decoded here from their layout:
    element 2i in the high nibble, absmax = nested_code[c] * nested_absmax[block of 256] + offset.
    (bitsandbytes' own CPU dequantize_4bit mis-decodes blocks that cross rows, so it is not used.)
    """
    import bitsandbytes.functional as BF
    q, st = BF.quantize_4bit(w.contiguous(), blocksize=64, quant_type="nf4",
                             compress_statistics=True)
    codes = q.flatten()
    idx = torch.stack([(codes >> 4).long(), (codes & 15).long()], 1).flatten()
    s2 = st.state2
    am_codes = st.absmax.long()
    am = s2.code[am_codes] * s2.absmax.repeat_interleave(s2.blocksize)[: am_codes.numel()]
    am = am + st.offset
    return (st.code[idx].view(-1, st.blocksize) * am.view(-1, 1)).view(w.shape)


def int8_roundtrip(w):
    import bitsandbytes.functional as BF
    c, scb, _ = BF.int8_vectorwise_quant(w.contiguous())
    return c.float() * scb.view(-1, 1) / 127.0


def gguf_roundtrip(w, qtype):
    a = w.numpy().astype(np.float32)
    return torch.from_numpy(quants.dequantize(quants.quantize(a, qtype), qtype).reshape(a.shape))


def quant_logits(arch, cfg, sd, tok, fn, linear_only):
    m = hf_model(arch, cfg)
    q = {}
    for k, v in sd.items():
        is_lin = any(p in k for p in PROJS) and k.endswith(".weight")
        is_2d = v.dim() == 2
        q[k] = fn(v) if (is_lin if linear_only else is_2d) else v
    m.load_state_dict(q, strict=False)
    if cfg.get("tie_word_embeddings"):
        m.tie_weights()
    with torch.no_grad():
        return m(input_ids=tok).logits.reshape(-1, cfg["vocab_size"]).float().clone()


# ---- main ---------------------------------------------------------------------------------------
def stories(gen):
    path = os.path.join(SHARED, "models", "stories260K.gguf")
    cfg = dict(hidden_size=64, intermediate_size=172, num_hidden_layers=5, num_attention_heads=8,
               num_key_value_heads=4, vocab_size=512, rms_norm_eps=1e-5,
               max_position_embeddings=2048, tie_word_embeddings=False,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               bos_token_id=1, eos_token_id=2)
    model = hf_model("llama", cfg)
    model.load_state_dict(state_from_gguf(path, cfg), strict=True)
    ids, margin = greedy(model, [1], 100)
    print("stories260K greedy:", ids[:20], "... min top-2 margin %.3g" % margin)
    tok, tgt = batch(512, gen, bos=1)
    out, meta = lora_fixture(model, tok, tgt, 4, 8, PROJS, False, gen)
    out["greedy_bos"] = torch.tensor(ids, dtype=torch.int32)
    meta["greedy_min_margin"] = "%g" % margin
    save_file(out, os.path.join(OUT, "stories260k.safetensors"), metadata=meta)
    print("stories260K loss", float(out["loss"]))


def synthetic(name, arch, cfg, r, alpha, targets, rslora, gen):
    model = hf_model(arch, cfg)
    sd = random_state(model, gen)
    model.load_state_dict(sd, strict=False)
    if cfg["tie_word_embeddings"]:
        model.tie_weights()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    save_hf_dir(model, os.path.join(OUT, name))
    write_gguf(os.path.join(OUT, name + ".gguf"), arch, cfg, sd)
    tok, tgt = batch(cfg["vocab_size"], gen)
    out, meta = lora_fixture(model, tok, tgt, r, alpha, targets, rslora, gen)
    with torch.no_grad():
        out["base_logits"] = model(input_ids=tok).logits.reshape(-1, cfg["vocab_size"]).clone()
    save_file(out, os.path.join(OUT, name + ".lora.safetensors"), metadata=meta)
    print(name, "loss", float(out["loss"]))
    return sd, tok


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    stories(gen)

    qwen = dict(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=2, head_dim=8, vocab_size=160, rms_norm_eps=1e-6,
                max_position_embeddings=512, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    synthetic("syn_qwen2", "qwen2", qwen, 4, 16, ["q_proj", "k_proj", "v_proj", "o_proj",
                                                  "down_proj"], True, gen)

    llama = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=8, vocab_size=160, rms_norm_eps=1e-5,
                 max_position_embeddings=512, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    sd, tok = synthetic("syn_llama", "llama", llama, 8, 16, PROJS, False, gen)
    Q = gguf.GGMLQuantizationType
    write_gguf(os.path.join(OUT, "syn_llama_q8_0.gguf"), "llama", llama, sd, Q.Q8_0)
    write_gguf(os.path.join(OUT, "syn_llama_q4_0.gguf"), "llama", llama, sd, Q.Q4_0)
    qref = {
        "tokens": tok.to(torch.int32),
        "nf4": quant_logits("llama", llama, sd, tok, nf4_roundtrip, True),
        "int8": quant_logits("llama", llama, sd, tok, int8_roundtrip, True),
        "q8_0": quant_logits("llama", llama, sd, tok, lambda w: gguf_roundtrip(w, Q.Q8_0), False),
        "q4_0": quant_logits("llama", llama, sd, tok, lambda w: gguf_roundtrip(w, Q.Q4_0), False),
    }
    save_file(qref, os.path.join(OUT, "syn_llama.quant.safetensors"))
    fixture_versions.write(OUT, __file__, inputs=[os.path.join(SHARED, "models", "stories260K.gguf")])
    for f in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, f)
        print(f, os.path.getsize(p) if os.path.isfile(p) else "dir")


if __name__ == "__main__":
    sys.exit(main())
