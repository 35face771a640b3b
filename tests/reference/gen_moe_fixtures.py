#!/usr/bin/env python3
"""Reference fixture for qlft's mixture-of-experts FFN (src/model/moe.cpp): transformers'
MixtralSparseMoeBlock (router softmax, top-k, the k weights renormalised, SwiGLU experts) in fp32
on CPU, forward and backward.

Run with the reference venv:  /opt/qlft-ref/bin/python tests/reference/gen_moe_fixtures.py
Output: tests/reference/fixtures/moe/mixtral_block.safetensors (top_k 2) and
mixtral_block_top1.safetensors (top_k 1), read by tests/unit/test_moe.cpp:

  x [rows, dim]          the block's input (the post-attention RMSNorm's output)
  router [E, dim]        MixtralTopKRouter.weight (block_sparse_moe.gate.weight on disk)
  e{i}.w1 [ffn, dim], e{i}.w3 [ffn, dim], e{i}.w2 [dim, ffn]
                         expert i's gate / up / down, as Mixtral checkpoints name them
                         (transformers 5 holds them fused: gate_up_proj[i] = [w1; w3], down_proj[i] = w2)
  out [rows, dim]        the block's output
  dout [rows, dim]       a random output gradient; the scalar is sum(out * dout)
  dx [rows, dim]         d scalar / d x: through the experts and through the routing weights
  dx_no_route [rows, dim] the same with the routing weights detached (how far the routing path moves dx)
  top_k [1] int32, index [rows, top_k] int32 (torch.topk's experts), weight [rows, top_k]
metadata: transformers version, MixtralConfig fields used.
Every row's k-th and (k+1)-th router probabilities differ by more than 1e-3, so fp32 rounding
cannot change which experts are chosen.
"""
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

import fixture_versions

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "moe")


def block_fixture(top_k, seed, name):
    torch.manual_seed(seed)
    cfg = MixtralConfig(hidden_size=24, intermediate_size=40, num_local_experts=4,
                        num_experts_per_tok=top_k, hidden_act="silu", router_jitter_noise=0.0)
    block = MixtralSparseMoeBlock(cfg).float().eval()
    E, F, D, K = cfg.num_local_experts, cfg.intermediate_size, cfg.hidden_size, cfg.num_experts_per_tok
    with torch.no_grad():
        block.gate.weight.normal_(0, 0.4)
        block.experts.gate_up_proj.normal_(0, 0.2)
        block.experts.down_proj.normal_(0, 0.2)
    rows = 14
    while True:
        x = torch.randn(2, rows // 2, D)
        probs = torch.softmax(x.view(-1, D) @ block.gate.weight.T, dim=-1)
        srt = probs.sort(dim=-1, descending=True).values
        if (srt[:, K - 1] - srt[:, K]).min() > 1e-3:
            break
    dout = torch.randn(2, rows // 2, D)

    def run(detach_route):
        xi = x.clone().requires_grad_(True)
        if detach_route:
            h = xi.view(-1, D)
            _, w, idx = block.gate(h)
            out = block.experts(h, idx, w.detach()).view_as(xi)
        else:
            out = block(xi)
        (out * dout).sum().backward()
        return out.detach(), xi.grad.detach()

    out, dx = run(False)
    _, dx_nr = run(True)
    with torch.no_grad():
        _, w, idx = block.gate(x.view(-1, D))
    t = {
        "x": x.view(-1, D), "router": block.gate.weight.detach(),
        "out": out.view(-1, D), "dout": dout.view(-1, D), "dx": dx.view(-1, D),
        "dx_no_route": dx_nr.view(-1, D), "top_k": torch.tensor([K], dtype=torch.int32),
        "index": idx.to(torch.int32), "weight": w.float(),
    }
    for i in range(E):
        gu = block.experts.gate_up_proj[i].detach()
        t[f"e{i}.w1"], t[f"e{i}.w3"] = gu[:F], gu[F:]
        t[f"e{i}.w2"] = block.experts.down_proj[i].detach()
    t = {k: v.contiguous().clone() for k, v in t.items()}
    os.makedirs(OUT, exist_ok=True)
    save_file(t, os.path.join(OUT, name), metadata={
        "transformers": transformers.__version__, "torch": torch.__version__,
        "num_local_experts": str(E), "num_experts_per_tok": str(K),
        "hidden_size": str(D), "intermediate_size": str(F)})
    print(name, "dx vs dx_no_route max diff", (dx - dx_nr).abs().max().item(),
          "max |dx|", dx.abs().max().item())


def main():
    block_fixture(2, 4801, "mixtral_block.safetensors")
    # top_k 1: the one weight is p / p = 1, so no gradient reaches the router's path.
    block_fixture(1, 4802, "mixtral_block_top1.safetensors")
    fixture_versions.write(OUT, __file__)


if __name__ == "__main__":
    main()
