#!/usr/bin/env python3
"""A SmolLM2-135M-shaped Llama with seeded random weights, as a Hugging Face directory.

For benchmarks on a machine that cannot reach the model hub and cannot be sent the 98 MB GGUF
(bench/gpu_check.sh on a lent GPU machine): tokens/s, memory and FLOPs depend on the shapes, not
on the weight values. Shapes are SmolLM2-135M-Instruct's (dim 576, 30 layers, 9 heads, 3 KV
heads, FFN 1536, vocab 49152, tied embedding, rope theta 100000); the tokenizer is the real one
(tests/reference/fixtures/smollm2/hf-tokenizer, saved by transformers from the GGUF).

  python3 bench/make_smollm2_shaped.py OUT_DIR [--dtype bfloat16]
"""
import argparse
import os
import shutil

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                      hidden_act="silu", initializer_range=0.041666666666666664)
    model = LlamaForCausalLM(cfg).to(getattr(torch, args.dtype))
    model.save_pretrained(args.out, safe_serialization=True)
    tok_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference",
                           "fixtures", "smollm2", "hf-tokenizer")
    for f in os.listdir(tok_dir):
        shutil.copy(os.path.join(tok_dir, f), args.out)
    print(f"wrote {args.out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
