#!/usr/bin/env python3
"""Reference fixtures for the LoRA variants (src/model/lora_loftq.cpp; LoRA+ is checked against a
host AdamW oracle in the test itself).

Run with the reference venv:  /opt/qlft-ref/bin/python tests/reference/gen_lora_variants_fixtures.py
Every expected value comes from the real peers on CPU:
  - bitsandbytes.functional.quantize_4bit (nf4, blocksize 64, no double quantization: what PEFT's
    LoftQ quantizes with, compress_statistics=False), dequantized as bitsandbytes'
    backends/default _dequantize_4bit_compute does (0.50.2's native CPU dequantize_4bit picks
    the wrong absmax for blocks that straddle rows whose length is a multiple of 32; see
    gen_quant_fixtures.py)
  - peft.utils.loftq_utils._low_rank_decomposition (torch.linalg.svd), the decomposition PEFT's
    loftq_init and replace_lora_weights_loftq (_loftq_init_new) turn the quantization error
    W - dequant(nf4(W)) into lora_A = R and lora_B = L. (_loftq_init_new itself moves the
    tensors to CUDA, so it is not called; it is these two calls.)
Outputs go to tests/reference/fixtures/lora_variants/loftq.safetensors, read by
tests/unit/test_lora_variants.cpp.
"""
import os

import torch
import bitsandbytes as bnb
from safetensors.torch import save_file
from peft.utils.loftq_utils import _low_rank_decomposition

import fixture_versions

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "lora_variants")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(20261207)

tensors = {}
# (out, in, rank): a wide and a tall matrix, and one with min(out, in) above the test's exact
# SVD size (256), so the iterative path is checked too.
for name, (out, inp, r) in {"wide": (48, 160, 8), "tall": (200, 64, 16),
                            "big": (264, 260, 8)}.items():
    w = (torch.randn(out, inp) * 0.05).contiguous()
    # A few outliers per row, as real projections have: the error is not white noise.
    w[torch.rand(out, inp) < 0.01] *= 8
    q, state = bnb.functional.quantize_4bit(w, blocksize=64, quant_type="nf4",
                                            compress_statistics=False)
    code = bnb.functional.get_4bit_type("nf4", device="cpu")
    packed = q.reshape(-1)
    idx = torch.empty(packed.numel() * 2, dtype=torch.int64)
    idx[0::2] = (packed >> 4).long()
    idx[1::2] = (packed & 0xF).long()
    n = out * inp
    deq = (code[idx][:n] * state.absmax.float().repeat_interleave(64)[:n]).reshape(out, inp)
    dec = _low_rank_decomposition(w - deq, reduced_rank=r)
    L, R = dec["L"], dec["R"]
    tensors[f"{name}.w"] = w
    if name != "big":  # (the NF4 agreement is checked on the other two; this keeps the file small)
        tensors[f"{name}.deq"] = deq.contiguous()
    tensors[f"{name}.lora_A"] = R.contiguous()
    tensors[f"{name}.lora_B"] = L.contiguous()
    tensors[f"{name}.S"] = dec["S"][:r].contiguous()
    tensors[f"{name}.rank"] = torch.tensor([r], dtype=torch.int32)

save_file(tensors, os.path.join(OUT, "loftq.safetensors"))
fixture_versions.write(OUT, __file__)
