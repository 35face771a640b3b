#!/usr/bin/env python3
"""Reference fixture for LoRA on a whole Mixtral model's experts and routers (qlft's LoraAdapter
MoE slots, LlamaRunner passing them to moe_fwd / moe_bwd): PEFT 0.21 on transformers 5's
MixtralForCausalLM, the committed fixture model syn_mixtral (tests/reference/fixtures/families).

Run with the reference venv:  /opt/qlft-ref/bin/python tests/reference/gen_moe_lora_fixtures.py
Output: tests/reference/fixtures/moe_lora/syn_mixtral.moe_lora.safetensors, read by
tests/unit/test_moe_lora.cpp, and syn_qwen3_moe.moe_lora.safetensors (Qwen3MoeForCausalLM
syn_qwen3_moe: experts on layers 0 and 2, a dense MLP on layer 1; target_modules q_proj, v_proj,
gate_proj, up_proj, down_proj, gate, which adapt layer 1's dense projections as modules and the
other layers' experts as target_parameters, lL.gate_proj.* etc. on layer 1):

LoraConfig(r 4, alpha 8, target_modules ["q_proj", "v_proj", "w1", "w2", "w3", "gate"]), which
PEFT rewrites: w1 / w3 -> target_parameters experts.gate_up_proj with rank_pattern 2r and
alpha_pattern 2 alpha (one ParamWrapper, mlp.experts.base_layer), w2 -> experts.down_proj
(mlp.experts), gate -> gate.weight (mlp.gate). Every A drawn U(-1/sqrt(in), 1/sqrt(in)), every B
0.03 N(0, 1) (non-zero, so A's gradients are not trivial). Per layer L, as PEFT holds them:
  lL.q_proj.{A,B,gA,gB}, lL.v_proj.*      A [r, in], B [out, r] (HF row order)
  lL.gate_up.{A,B,gA,gB}                  A [E 2r, dim], B [2 ffn, 2r E]
  lL.down.{A,B,gA,gB}                     A [E r, ffn], B [dim, r E]
  lL.router.{A,B,gA,gB}                   A [r, dim], B [E, r]
  tokens [2, 16], targets [2, 16] (-100 ignored), logits [32, vocab], loss [1] (mean CE)
  merged_logits [32, vocab]               merge_and_unload()'s logits on tokens
metadata: r, alpha, targets (qlft's lora.target_modules), peft_keys (save_pretrained's tensor
names, comma-separated), adapter_config (save_pretrained's adapter_config.json), the smallest
top-k routing margin over layers and rows (routing_min_margin).
"""
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM

import fixture_versions
from gen_family_fixtures import routing_margin

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = {"mixtral": (MixtralForCausalLM, ["q_proj", "v_proj", "w1", "w2", "w3", "gate"], 4870),
            "qwen3_moe": (Qwen3MoeForCausalLM,
                          ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj", "gate"], 4871)}
OUT = os.path.join(HERE, "fixtures", "moe_lora")
R, ALPHA = 4, 8
# PEFT's module (after "mlp." / "self_attn.") -> the fixture's name
NAMES = {"q_proj": "q_proj", "v_proj": "v_proj", "experts.base_layer": "gate_up",
         "experts": "down", "gate": "router", "gate_proj": "gate_proj", "up_proj": "up_proj",
         "down_proj": "down_proj"}


def model_dir(family):
    return os.path.join(HERE, "fixtures", "families", "syn_" + family)


def load(family):
    return FAMILIES[family][0].from_pretrained(model_dir(family), dtype=torch.float32,
                                               attn_implementation="eager").eval()


def lora_modules(pm):
    for name, mod in pm.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            layer = int(name.split(".layers.")[1].split(".")[0])
            leaf = name.split(".layers.")[1].split(".", 2)[2]
            yield f"l{layer}.{NAMES[leaf]}.", mod


def fixture(family):
    cls, targets, seed = FAMILIES[family]
    gen = torch.Generator().manual_seed(seed)
    vocab = 160
    tok = torch.randint(3, vocab, (2, 16), generator=gen)
    tgt = torch.cat([tok[:, 1:], torch.randint(3, vocab, (2, 1), generator=gen)], 1).clone()
    tgt[0, 3] = tgt[1, 9] = -100
    lc = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0, bias="none")
    pm = get_peft_model(load(family), lc).float().eval()
    out = {}
    with torch.no_grad():
        for key, mod in lora_modules(pm):
            a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight
            a.copy_((torch.rand(a.shape, generator=gen) * 2 - 1) / np.sqrt(a.shape[1]))
            b.copy_(0.03 * torch.randn(b.shape, generator=gen))
    logits = pm(input_ids=tok).logits.float().reshape(-1, vocab)
    loss = F.cross_entropy(logits, tgt.reshape(-1), ignore_index=-100)
    loss.backward()
    for key, mod in lora_modules(pm):
        for part, w in (("A", mod.lora_A["default"].weight), ("B", mod.lora_B["default"].weight)):
            out[key + part] = w.detach().clone()
            out[key + "g" + part] = w.grad.detach().clone()
    print(family, len(out) // 4, "LoRA tensors' pairs")
    out["tokens"] = tok.to(torch.int32)
    out["targets"] = tgt.to(torch.int32)
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1).clone()
    with tempfile.TemporaryDirectory() as d:
        pm.save_pretrained(d)
        with safe_open(os.path.join(d, "adapter_model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
        with open(os.path.join(d, "adapter_config.json")) as f:
            acfg = json.load(f)
    with torch.no_grad():
        out["merged_logits"] = pm.merge_and_unload()(input_ids=tok).logits.reshape(-1, vocab).clone()
    meta = {"r": str(R), "alpha": str(ALPHA), "targets": ",".join(targets),
            "peft_keys": ",".join(keys),
            # (PEFT writes its sets in Python's hash order: sorted here)
            "adapter_config": json.dumps({k: sorted(acfg[k]) if isinstance(acfg[k], list)
                                          else acfg[k]
                                          for k in ("r", "lora_alpha", "target_modules",
                                                    "target_parameters", "rank_pattern",
                                                    "alpha_pattern")}, sort_keys=True),
            "routing_min_margin": "%g" % routing_margin(load(family), tok)}
    os.makedirs(OUT, exist_ok=True)
    save_file(out, os.path.join(OUT, "syn_%s.moe_lora.safetensors" % family), metadata=meta)
    print("loss", float(loss), "merged vs lora logits",
          float((out["merged_logits"] - out["logits"]).abs().max()), meta)


def main():
    inputs = []
    for family in FAMILIES:
        fixture(family)
        inputs += [os.path.join(model_dir(family), f) for f in ("model.safetensors", "config.json")]
    fixture_versions.write(OUT, __file__, inputs=inputs)


if __name__ == "__main__":
    sys.exit(main())
