#!/usr/bin/env python3
"""Reference fixtures for the mixture-of-experts load-balancing auxiliary loss (qlft's
moe.aux_loss; src/model/moe.cpp moe_aux_loss): transformers' MixtralForCausalLM /
Qwen3MoeForCausalLM called with output_router_logits=True add router_aux_loss_coef x
load_balancing_loss_func(every MoE layer's router logits, the expert count, num_experts_per_tok,
attention_mask) to the loss.

Run with the reference venv:  /opt/qlft-ref/bin/python tests/reference/gen_moe_aux_fixtures.py
Input: the committed tests/reference/fixtures/families/syn_mixtral/ (2 layers, 4 experts, top-2)
and syn_qwen3_moe/ (3 layers, experts on 0 and 2, top-2 not renormalised), router_aux_loss_coef
4 in place of theirs (see COEF), and their .lora.safetensors (tokens, targets and the PEFT LoRA
A / B on q/k/v/o, r 4, alpha 8). Output: tests/reference/fixtures/moe_aux/
syn_<family>_aux.safetensors, read by tests/unit/test_moe_aux.cpp, in fp32 on CPU, two cases:

  {case}.mask [2, 16] int32   the attention_mask ("full": all ones, called without a mask;
                              "pad": row 1 right-padded from position 11)
  {case}.targets [2, 16]      the fixture's targets (pad: -100 from position 10 of row 1 on)
  {case}.ce [1]               token-mean cross-entropy
  {case}.aux [1]              outputs.aux_loss (load_balancing_loss_func, before the coefficient)
  {case}.loss [1]             ce + router_aux_loss_coef * aux, what is differentiated
  {case}.l{layer}.{proj}.gA / gB   its LoRA gradients (HF q/k row order)
  {case}.nocoef.l0.q_proj.gA  the gradient of ce alone (how far the auxiliary term moves it)
metadata: router_aux_loss_coef.
"""
import os

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM

import fixture_versions

HERE = os.path.dirname(os.path.abspath(__file__))
FAM = os.path.join(HERE, "fixtures", "families")
OUT = os.path.join(HERE, "fixtures", "moe_aux")
CLASSES = {"mixtral": MixtralForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM}
# The file's 0.02 moves the LoRA gradients by 3e-4 of their size here, too close to the tests'
# 1e-4 tolerance to show the term: the fixture weighs the loss 4 (config.json edited alike).
COEF = 4.0


def run_case(family, ref, mask, tgt, use_mask):
    model = CLASSES[family].from_pretrained(os.path.join(FAM, "syn_" + family), dtype=torch.float32,
                                               attn_implementation="eager",
                                               router_aux_loss_coef=COEF)
    lc = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                    lora_dropout=0.0, bias="none", init_lora_weights=True)
    pm = get_peft_model(model, lc).float().eval()
    mods = {}
    with torch.no_grad():
        for name, mod in pm.named_modules():
            if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
                key = "l%s.%s." % (name.split(".layers.")[1].split(".")[0], name.split(".")[-1])
                mod.lora_A["default"].weight.copy_(ref[key + "A"])
                mod.lora_B["default"].weight.copy_(ref[key + "B"])
                mods[key] = mod
    coef = model.config.router_aux_loss_coef
    out = pm(input_ids=ref["tokens"].long(), attention_mask=mask if use_mask else None,
             output_router_logits=True)
    v = out.logits.shape[-1]
    ce = F.cross_entropy(out.logits.float().reshape(-1, v), tgt.reshape(-1), ignore_index=-100)
    return pm, mods, coef, ce, out.aux_loss


def case(family, name, ref, mask, tgt, use_mask, res):
    pm, mods, coef, ce, aux = run_case(family, ref, mask, tgt, use_mask)
    loss = ce + coef * aux
    loss.backward()
    res[name + ".mask"] = mask.to(torch.int32)
    res[name + ".targets"] = tgt.to(torch.int32)
    res[name + ".ce"] = ce.detach().reshape(1).clone()
    res[name + ".aux"] = aux.detach().reshape(1).clone()
    res[name + ".loss"] = loss.detach().reshape(1).clone()
    for key, mod in mods.items():
        res[name + "." + key + "gA"] = mod.lora_A["default"].weight.grad.detach().clone()
        res[name + "." + key + "gB"] = mod.lora_B["default"].weight.grad.detach().clone()
    _, mods, _, ce, _ = run_case(family, ref, mask, tgt, use_mask)  # the cross-entropy alone
    ce.backward()
    res[name + ".nocoef.l0.q_proj.gA"] = mods["l0.q_proj."].lora_A["default"].weight.grad.clone()
    g = res[name + ".l0.q_proj.gA"]
    moved = (res[name + ".nocoef.l0.q_proj.gA"] - g).abs().max() / g.abs().max()
    print(family, name, "ce", res[name + ".ce"].item(), "aux", res[name + ".aux"].item(), "loss",
          res[name + ".loss"].item(), "aux term moves l0.q_proj.gA by", moved.item())
    return coef


def fixture(family):
    lora = os.path.join(FAM, "syn_%s.lora.safetensors" % family)
    ref = load_file(lora)
    tgt = ref["targets"].long()
    res = {}
    coef = case(family, "full", ref, torch.ones_like(tgt), tgt, False, res)
    mask = torch.ones_like(tgt)
    mask[1, 11:] = 0
    pad_tgt = tgt.clone()
    pad_tgt[1, 10:] = -100
    case(family, "pad", ref, mask, pad_tgt, True, res)
    save_file(res, os.path.join(OUT, "syn_%s_aux.safetensors" % family),
              metadata={"router_aux_loss_coef": "%r" % coef})
    # (VERSIONS.json names inputs by file name: the models' model.safetensors / config.json would
    # collide; the adapters' files name their models.)
    return [lora]


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    inputs = []
    for family in CLASSES:
        inputs += fixture(family)
    fixture_versions.write(OUT, __file__, inputs=inputs)


if __name__ == "__main__":
    main()
