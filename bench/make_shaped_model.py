#!/usr/bin/env python3
"""A model of a published architecture's shapes with seeded random weights, as a Hugging Face
directory (sharded safetensors, config.json, a tokenizer).

For benchmarks on a machine that cannot reach the model hub and cannot be sent the weights
(scripts/gpu_check.sh and scripts/cpu_check.sh on a lent machine): tokens/s, memory and FLOPs
depend on the shapes, not on the weight values. The tokenizer is SmolLM2's real one
(tests/reference/fixtures/smollm2/hf-tokenizer, saved by transformers from the GGUF); its ids
are all below 49152, valid in every vocabulary here, so a larger model's head keeps its real
size. Tensors are made one at a time (on the GPU when there is one) and written in shards, so an
8B model needs neither its fp32 copy in memory nor transformers' initialisation.

  python3 bench/make_shaped_model.py OUT_DIR [--shape smollm2-135m] [--dtype bfloat16]
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

# Shapes of the published configs (config.json of each model on the Hugging Face hub).
SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True, initializer_range=0.041666666666666664),
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=False, initializer_range=0.02,
                         rope_scaling={"factor": 8.0, "high_freq_factor": 4.0,
                                       "low_freq_factor": 1.0,
                                       "original_max_position_embeddings": 8192,
                                       "rope_type": "llama3"}),
}


def tensors(c):
    """(name, shape, kind) of every tensor of a Llama checkpoint, in file order."""
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (v, d), "w"
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (d,), "norm"
        for n, shape in (("q_proj", (q, d)), ("k_proj", (kv, d)), ("v_proj", (kv, d)),
                         ("o_proj", (d, q))):
            yield p + "self_attn." + n + ".weight", shape, "w"
        yield p + "post_attention_layernorm.weight", (d,), "norm"
        for n, shape in (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f))):
            yield p + "mlp." + n + ".weight", shape, "w"
    yield "model.norm.weight", (d,), "norm"
    if not c["tie_word_embeddings"]:
        yield "lm_head.weight", (v, d), "w"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--shard-gib", type=float, default=4.0)
    args = ap.parse_args()
    c = dict(SHAPES[args.shape])
    dtype = getattr(torch, args.dtype)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    shard, shard_bytes, shards, weight_map, n_params = {}, 0, [], {}, 0

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, os.path.join(args.out, name), metadata={"format": "pt"})
            shards.append(name)
            for k in shard:
                weight_map[k] = name
            shard, shard_bytes = {}, 0

    for name, shape, kind in tensors(c):
        if kind == "norm":
            t = torch.ones(shape, dtype=dtype)
        else:
            t = (torch.randn(shape, generator=gen, device=dev, dtype=torch.float32) *
                 c["initializer_range"]).to(dtype).cpu()
        shard[name] = t
        shard_bytes += t.numel() * t.element_size()
        n_params += t.numel()
        if shard_bytes >= args.shard_gib * 2**30:
            flush()
    flush()
    # One shard keeps the single-file name; several get transformers' index.
    if len(shards) == 1:
        os.replace(os.path.join(args.out, shards[0]), os.path.join(args.out, "model.safetensors"))
    else:
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               bos_token_id=1, eos_token_id=2, torch_dtype=args.dtype, **c)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tok_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference",
                           "fixtures", "smollm2", "hf-tokenizer")
    for f in os.listdir(tok_dir):
        shutil.copy(os.path.join(tok_dir, f), args.out)
    print(f"wrote {args.out}: {args.shape}, {n_params} parameters, {len(shards)} shard(s)")


if __name__ == "__main__":
    main()
