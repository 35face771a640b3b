#!/usr/bin/env python3
"""Reference fixtures for the CPU backend ops whose exact float32 conventions come from
Hugging Face transformers (the other ops are checked against double-precision oracles in the
C++ tests).

Writes tests/reference/fixtures/backend/rope.safetensors: for two (theta, head_dim) settings,
random q at positions up to 8191 and q after LlamaRotaryEmbedding + apply_rotary_pos_emb
(rotate-half convention, fp32 on the CPU): "t{i}.x", "t{i}.y" [rows, heads * head_dim],
"t{i}.pos" [rows] int32, "t{i}.meta" [theta, head_dim, heads] float32.

Run: /opt/qlft-ref/bin/python tests/reference/gen_backend_fixtures.py
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)
"""
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import fixture_versions

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "backend")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)

tensors = {}
for i, (theta, hd, heads) in enumerate([(10000.0, 64, 2), (500000.0, 128, 1)]):
    rows = 40
    pos = torch.cat([torch.arange(8), torch.randint(8, 8192, (rows - 9,)), torch.tensor([8191])])
    cfg = LlamaConfig(hidden_size=hd * heads, num_attention_heads=heads, num_key_value_heads=heads,
                      head_dim=hd, max_position_embeddings=8192,
                      rope_parameters={"rope_type": "default", "rope_theta": theta})
    rot = LlamaRotaryEmbedding(cfg)
    x = torch.randn(rows, heads * hd, dtype=torch.float32)
    q = x.view(1, rows, heads, hd).transpose(1, 2)  # [batch, heads, seq, hd]
    cos, sin = rot(q, pos.view(1, rows))
    y, _ = apply_rotary_pos_emb(q, q, cos, sin)
    y = y.transpose(1, 2).reshape(rows, heads * hd)
    tensors[f"t{i}.x"] = x.contiguous()
    tensors[f"t{i}.y"] = y.contiguous()
    tensors[f"t{i}.pos"] = pos.to(torch.int32).contiguous()
    tensors[f"t{i}.meta"] = torch.tensor([theta, hd, heads], dtype=torch.float32)
    print(f"t{i}: theta {theta} head_dim {hd} heads {heads}, rope_theta in config:",
          cfg.rope_parameters.get("rope_theta"))

save_file(tensors, os.path.join(OUT, "rope.safetensors"))
print("wrote", os.path.join(OUT, "rope.safetensors"))
fixture_versions.write(OUT, __file__)
