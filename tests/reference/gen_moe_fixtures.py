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

mixtral_block_lora.safetensors (and qwen3_moe_block_lora.safetensors: Qwen3MoeSparseMoeBlock,
whose experts hold the same fused layout, norm_topk_prob False; norm_topk [1] int32 says which):
the top_k 2 block with a PEFT LoRA (LoraConfig target_parameters
["experts.gate_up_proj", "experts.down_proj", "gate.weight"], r 2, alpha 6: ParamWrapper on
each) whose B factors are random (non-zero, so A's gradients are not trivial). As PEFT holds them:
  gate_up.A [E r, dim], gate_up.B [2 ffn, r E], down.A [E r, ffn], down.B [dim, r E]
                         (expert e's A: rows e r .. e r + r - 1; its B: columns j E + e)
  router.A [r, dim], router.B [E, r]
  *.dA, *.dB             d scalar / d of each, same layouts
  out, dout, dx          as above, with the LoRA
  x, router, e{i}.*      the frozen block (the mixtral_block weights' layout)
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


def make_block(top_k, seed, family="mixtral"):
    """A MixtralSparseMoeBlock (4 experts, dim 24, ffn 40) with random weights, and its config;
    family qwen3_moe: a Qwen3MoeSparseMoeBlock of those sizes, norm_topk_prob False (the top-k
    weights not renormalised). Returns the block, (E, F, D, K) and whether it renormalises."""
    torch.manual_seed(seed)
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        cfg = Qwen3MoeConfig(hidden_size=24, moe_intermediate_size=40, num_experts=4,
                             num_experts_per_tok=top_k, norm_topk_prob=False, hidden_act="silu")
        block = Qwen3MoeSparseMoeBlock(cfg).float().eval()
        sizes = (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size, top_k)
    else:
        cfg = MixtralConfig(hidden_size=24, intermediate_size=40, num_local_experts=4,
                            num_experts_per_tok=top_k, hidden_act="silu", router_jitter_noise=0.0)
        block = MixtralSparseMoeBlock(cfg).float().eval()
        sizes = (cfg.num_local_experts, cfg.intermediate_size, cfg.hidden_size, top_k)
    with torch.no_grad():
        block.gate.weight.normal_(0, 0.4)
        block.experts.gate_up_proj.normal_(0, 0.2)
        block.experts.down_proj.normal_(0, 0.2)
    return block, sizes, family != "qwen3_moe"


def block_fixture(top_k, seed, name):
    block, (E, F, D, K), _ = make_block(top_k, seed)
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


def lora_block_fixture(seed, name, family="mixtral"):
    from peft import LoraConfig, get_peft_model
    import peft

    block, (E, F, D, K), norm = make_block(2, seed, family)
    frozen = {"router": block.gate.weight.detach().clone()}
    for i in range(E):
        gu = block.experts.gate_up_proj[i].detach()
        frozen[f"e{i}.w1"], frozen[f"e{i}.w3"] = gu[:F].clone(), gu[F:].clone()
        frozen[f"e{i}.w2"] = block.experts.down_proj[i].detach().clone()
    r = 2
    model = get_peft_model(block, LoraConfig(
        r=r, lora_alpha=6, lora_dropout=0.0,
        target_parameters=["experts.gate_up_proj", "experts.down_proj", "gate.weight"]))
    named = {"gate_up": "experts.base_layer", "down": "experts", "router": "gate"}
    lora = {}
    for n, p in model.named_parameters():
        if "lora_" not in n:
            continue
        part = None
        for key, mod in named.items():
            if n == f"base_model.model.{mod}.lora_A.default.weight":
                part = key + ".A"
            if n == f"base_model.model.{mod}.lora_B.default.weight":
                part = key + ".B"
        assert part is not None, n
        with torch.no_grad():
            if part.endswith(".B"):
                p.normal_(0, 0.3)
        lora[part] = p
    assert len(lora) == 6, sorted(lora)
    assert tuple(lora["gate_up.A"].shape) == (E * r, D) and tuple(lora["gate_up.B"].shape) == (2 * F, r * E)
    assert tuple(lora["down.A"].shape) == (E * r, F) and tuple(lora["down.B"].shape) == (D, r * E)
    rows = 14
    while True:  # routing margins with the LoRA on the router
        x = torch.randn(rows, D)
        with torch.no_grad():
            logits, _, _ = model.base_model.model.gate(x)
        srt = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True).values
        if (srt[:, K - 1] - srt[:, K]).min() > 1e-3:
            break
    dout = torch.randn(rows, D)
    xi = x.clone().requires_grad_(True)
    out = model(xi.view(2, rows // 2, D)).view(rows, D)
    (out * dout).sum().backward()
    t = dict(frozen)
    t.update({"x": x, "out": out.detach(), "dout": dout, "dx": xi.grad.detach(),
              "top_k": torch.tensor([K], dtype=torch.int32),
              "norm_topk": torch.tensor([int(norm)], dtype=torch.int32)})
    for k, p in lora.items():
        t[k] = p.detach()
        t[k.replace(".A", ".dA").replace(".B", ".dB")] = p.grad.detach()
    t = {k: v.contiguous().clone() for k, v in t.items()}
    save_file(t, os.path.join(OUT, name), metadata={
        "transformers": transformers.__version__, "torch": torch.__version__,
        "peft": peft.__version__, "r": str(r), "lora_alpha": "6", "family": family,
        "num_local_experts": str(E), "num_experts_per_tok": str(K),
        "hidden_size": str(D), "intermediate_size": str(F)})
    print(name, "max |dx|", xi.grad.abs().max().item(),
          "max |gate_up.dA|", lora["gate_up.A"].grad.abs().max().item())


def main():
    block_fixture(2, 4801, "mixtral_block.safetensors")
    # top_k 1: the one weight is p / p = 1, so no gradient reaches the router's path.
    block_fixture(1, 4802, "mixtral_block_top1.safetensors")
    lora_block_fixture(4803, "mixtral_block_lora.safetensors")
    lora_block_fixture(4804, "qwen3_moe_block_lora.safetensors", "qwen3_moe")
    fixture_versions.write(OUT, __file__)


if __name__ == "__main__":
    main()
