#!/usr/bin/env python3
"""Reference fixtures for the LoRA variants (src/model/lora_loftq.cpp, src/model/lora_init_factors.cpp,
and the DoRA / PiSSA / OLoRA runtime; LoRA+ is checked against a host AdamW oracle in the test
itself).

Run with the reference venv:  /opt/qlft-ref/bin/python tests/reference/gen_lora_variants_fixtures.py
(`--exports-only`: only phase 2 below, on the committed fixtures.)
Every expected value comes from the real peers on CPU, in fp32. Outputs in
tests/reference/fixtures/lora_variants/, read by tests/unit/test_lora_variants.cpp and the
runtime's tests:

loftq.safetensors  (LoftQ's factors)
  - bitsandbytes.functional.quantize_4bit (nf4, blocksize 64, no double quantization: what PEFT's
    LoftQ quantizes with, compress_statistics=False), dequantized as bitsandbytes'
    backends/default _dequantize_4bit_compute does (0.50.2's native CPU dequantize_4bit picks
    the wrong absmax for blocks that straddle rows whose length is a multiple of 32; see
    gen_quant_fixtures.py)
  - peft.utils.loftq_utils._low_rank_decomposition (torch.linalg.svd), the decomposition PEFT's
    loftq_init and replace_lora_weights_loftq (_loftq_init_new) turn the quantization error
    W - dequant(nf4(W)) into lora_A = R and lora_B = L. (_loftq_init_new itself moves the
    tensors to CUDA, so it is not called; it is these two calls.)
  {wide,tall,big}.{w,deq,lora_A,lora_B,S,rank}

init_factors.safetensors  (PiSSA / OLoRA factor math, PEFT's own pissa_init / olora_init)
  A torch module of Linear layers "wide" [24, 80] and "tall" [100, 32] wrapped by get_peft_model
  (r = 6, lora_alpha = 9: scale 1.5) with init_lora_weights="pissa", then "olora":
  {wide,tall}.w [out, in] the weight; {wide,tall}.{pissa,olora}.{A [r, in], B [out, r],
  residual [out, in]} (PEFT's lora_A, lora_B and the base weight W - scale B A it wrote);
  "rank" [1] int32, "scale" [1]. "{wide,tall}.pissa64.{A,B}" and "l0.{proj}.pissa64.{A,B}" (syn_llama's
  projections, r = 4, scale 2): pissa_init's formula with torch.linalg.svd in float64 (PEFT's
  fp32 SVD is off by up to ~1e-5 of the factors where singular values are close).

The model fixtures below run the synthetic llama of gen_model_fixtures.py
(fixtures/model/syn_llama/, loaded in fp32, eager attention) with PEFT, r = 4, lora_alpha = 8
(scale 2), all 7 targets, dropout 0, on the batch convention of gen_model_fixtures.lora_fixture:
"tokens" [2, 16] int32, "targets" [2, 16] int32 (-100 = ignored), "loss" [1] the mean cross-entropy
over the non-ignored targets, logits [32, 160] (rows = batch x position). Per-projection keys are
"l{layer}.{proj}.{...}" with proj the PEFT module name (q_proj ... down_proj), in HF (rotate-half)
q/k row order; A [r, in], B [out, r], m [out]; g* the gradient of "loss".

dora.safetensors  LoraConfig(use_dora=True): A set as lora_fixture does, B = 0.03 randn, the
  magnitude PEFT initialised (= the row norms of W, B being 0 then) kept as "init.l{L}.{proj}.m",
  then multiplied by (1 + 0.05 randn). "l{L}.{proj}.{A,B,m}" (the values used), "logits", "loss",
  "l{L}.{proj}.{gA,gB,gm}", and "merged_logits": the logits of merge_and_unload() of that model.
  (PEFT's DoRA detaches the norm ||W + s B A||_row from the gradient, DoRA paper section 4.3.)
dora_peft/  that adapter as PEFT's save_pretrained writes it (adapter_config.json with
  "use_dora": true; the magnitude as "...lora_magnitude_vector" in adapter_model.safetensors).
dora_nf4.safetensors  the same keys (no dora_peft/) with syn_llama's 7 projections replaced by
  their NF4 values (bitsandbytes' codes, blocksize 64, double quant: qlft's default
  quant.type=nf4, decoded as gen_model_fixtures.nf4_roundtrip does), in an fp32 model: PEFT's
  DoRA on a Linear4bit is that same fp32 math on the dequantized weight (check_nf4_dora_layers
  shows it layer by layer), but bitsandbytes' CPU dequantize mis-decodes down_proj (rows of 96).

pissa.safetensors, olora.safetensors  init_lora_weights="pissa" / "olora" (PEFT writes the residual
  W - s B0 A0 into the base): "init.l{L}.{proj}.{A,B}" PEFT's initial factors, "init_logits",
  "init_loss", "init.l{L}.{proj}.{gA,gB}" at the start; then A += 0.02 randn, B += 0.02 randn:
  "l{L}.{proj}.{A,B}", "logits", "loss", "l{L}.{proj}.{gA,gB}" in that state, and
  "converted_logits": the logits of a fresh fp32 syn_llama + PeftModel.from_pretrained of
  {pissa,olora}_converted/ (equal to "logits").
{pissa,olora}_converted/  the perturbed adapter saved with save_pretrained(dir,
  path_initial_model_for_weight_conversion=<the initial adapter>): the rank-2r LoRA
  [A; A0], [B, -B0] on the ORIGINAL base, r = 8 and lora_alpha = 16 in its config.

Phase 2 (for the runtime's export test): each fixtures/lora_variants/qlft_{dora,pissa,olora}/
that exists (written by qlft's test with QLFT_WRITE_LORA_VARIANT_FIXTURES=1) is loaded with
PeftModel.from_pretrained on a fresh fp32 syn_llama; its logits on that variant's "tokens" go to
qlft_exports.safetensors as "{v}_qlft_export_logits" [32, 160]. No such directory: no file.
"""
import argparse
import json
import os
import shutil
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import bitsandbytes as bnb
from safetensors.torch import load_file, save_file
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils.loftq_utils import _low_rank_decomposition
from transformers import BitsAndBytesConfig, LlamaForCausalLM

import fixture_versions
from gen_model_fixtures import PROJS, batch, nf4_roundtrip

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "lora_variants")
SYN = os.path.join(HERE, "fixtures", "model", "syn_llama")
RANK, ALPHA = 4, 8  # scale 2: a missing scale shows
VARIANTS = ["dora", "pissa", "olora"]


def loftq():
    """loftq.safetensors (the values it was first written with)."""
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


def init_factors():
    """init_factors.safetensors: PEFT's pissa_init / olora_init on a wide and a tall Linear."""
    gen = torch.Generator().manual_seed(4907)
    shapes = {"wide": (24, 80), "tall": (100, 32)}
    r, alpha = 6, 9
    t = {"rank": torch.tensor([r], dtype=torch.int32),
         "scale": torch.tensor([alpha / r], dtype=torch.float32)}
    ws = {n: torch.randn(o, i, generator=gen) / np.sqrt(i) for n, (o, i) in shapes.items()}
    for n, w in ws.items():
        t[n + ".w"] = w.contiguous()
    for init in ["pissa", "olora"]:
        net = torch.nn.ModuleDict({n: torch.nn.Linear(i, o, bias=False)
                                   for n, (o, i) in shapes.items()})
        with torch.no_grad():
            for n, w in ws.items():
                net[n].weight.copy_(w)
        pm = get_peft_model(net, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(shapes),
                                            lora_dropout=0.0, init_lora_weights=init))
        for n in shapes:
            mod = pm.base_model.model[n]
            t[f"{n}.{init}.A"] = mod.lora_A["default"].weight.detach().clone()
            t[f"{n}.{init}.B"] = mod.lora_B["default"].weight.detach().clone()
            t[f"{n}.{init}.residual"] = mod.base_layer.weight.detach().clone()
    # PEFT's pissa_init runs torch.linalg.svd in fp32, whose singular vectors are off by about
    # 1e-5 of the factors' size where the r-th and (r+1)-th singular values are close; the same
    # formula in float64 is the exact reference the double-precision factors are held to.
    for n, w in ws.items():
        t[f"{n}.pissa64.A"], t[f"{n}.pissa64.B"] = pissa_f64(w, r, alpha / r)
    syn = load_syn()
    for key, w in syn.state_dict().items():
        if any(p in key for p in PROJS):
            proj = key.split(".")[-2]
            a, b = pissa_f64(w, RANK, ALPHA / RANK)
            t[f"l0.{proj}.pissa64.A"], t[f"l0.{proj}.pissa64.B"] = a, b
            pa, pb = pissa_f64(w, RANK, ALPHA / RANK, torch.float32)
            print("pissa %s: torch fp32 vs float64 s B A, max error / max %.2g" % (
                proj, float((pb @ pa - b @ a).abs().max() / (b @ a).abs().max())))
    save_file(t, os.path.join(OUT, "init_factors.safetensors"))


def pissa_f64(w, r, scale, dtype=torch.float64):
    """pissa_init's formula (peft/tuners/lora/layer.py) with the SVD in dtype: (A, B) in fp32."""
    V, S, Uh = torch.linalg.svd(w.to(dtype), full_matrices=False)
    Sr = S[:r] / scale
    A = torch.diag(torch.sqrt(Sr)) @ Uh[:r]
    B = V[:, :r] @ torch.diag(torch.sqrt(Sr))
    return A.float().contiguous(), B.float().contiguous()


def load_syn(nf4=False):
    """A fresh fp32 syn_llama; nf4: its 7 projections replaced by their NF4 values (bitsandbytes'
    codes, blocksize 64, double quant: qlft's default quant.type=nf4), decoded in fp32."""
    m = LlamaForCausalLM.from_pretrained(SYN, dtype=torch.float32)
    m.config._attn_implementation = "eager"
    if nf4:
        sd = m.state_dict()
        m.load_state_dict({k: nf4_roundtrip(v) if any(p in k for p in PROJS) else v
                           for k, v in sd.items()})
    return m.eval()


def tidy_adapter_dir(d):
    """PEFT's model card goes, the base is named without this machine's path, and
    target_modules (a set in PEFT) is sorted so that a rerun writes the same file."""
    os.remove(os.path.join(d, "README.md"))
    cfg_path = os.path.join(d, "adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = "tests/reference/fixtures/model/syn_llama"
    cfg["target_modules"] = sorted(cfg["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def check_nf4_dora_layers():
    """Why dora_nf4 runs on decoded NF4 weights: PEFT's DoRA on a bitsandbytes Linear4bit (nf4,
    double quant) equals PEFT's DoRA on an fp32 Linear holding the decoded NF4 weight (output,
    dx, gA, gB, gm), shown here on the projections whose rows (64) keep every 64-block inside one
    row. On down_proj (rows of 96) bitsandbytes' CPU dequantize picks the wrong absmax (see
    gen_quant_fixtures.py), so its own 4-bit forward there is not NF4's (error / max 0.25)."""
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
    targets = ["q_proj", "o_proj", "gate_proj", "up_proj"]
    lc = lambda: LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0,
                            use_dora=True)
    p4 = get_peft_model(LlamaForCausalLM.from_pretrained(
        SYN, dtype=torch.float32, quantization_config=q, device_map="cpu"), lc())
    pf = get_peft_model(load_syn(nf4=True), lc())
    p4.train(); pf.train()  # (bnb's eval-mode CPU path repacks and needs out % 32 == 0)
    gen = torch.Generator().manual_seed(5)
    worst = 0.0
    for (k4, m4), (kf, mf) in zip(lora_modules(p4), lora_modules(pf)):
        assert k4 == kf
        with torch.no_grad():
            for name in ["lora_A", "lora_B", "lora_magnitude_vector"]:
                src = getattr(mf, name)["default"].weight
                src.add_(0.05 * torch.randn(src.shape, generator=gen))
                getattr(m4, name)["default"].weight.copy_(src)
        x = torch.randn(3, m4.in_features, generator=gen)
        g = torch.randn(3, m4.out_features, generator=gen)
        res = []
        for m in (m4, mf):
            xx = x.clone().requires_grad_(True)
            y = m(xx)
            (y * g).sum().backward()
            res.append([y.detach(), xx.grad] + [getattr(m, n)["default"].weight.grad for n in
                                                 ["lora_A", "lora_B", "lora_magnitude_vector"]])
        for a, b in zip(*res):
            worst = max(worst, float((a - b).abs().max() / b.abs().max()))
    print("dora_nf4: bnb Linear4bit vs decoded-NF4 fp32 layers, max error / max %.2g" % worst)
    assert worst < 1e-5


def lora_modules(pm):
    """(key prefix "l{layer}.{proj}.", module) of every LoRA layer of a PEFT model."""
    for name, mod in pm.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            layer = int(name.split(".layers.")[1].split(".")[0])
            yield f"l{layer}.{name.split('.')[-1]}.", mod


def run(pm, tok, tgt):
    """logits [rows, vocab] and the mean cross-entropy, after backward (grads zeroed first)."""
    pm.zero_grad(set_to_none=True)
    logits = pm(input_ids=tok).logits.float()
    v = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, v), tgt.reshape(-1), ignore_index=-100)
    loss.backward()
    return logits.detach().reshape(-1, v).clone(), loss.detach().reshape(1).clone()


def lora_config(**kw):
    return LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=PROJS, lora_dropout=0.0,
                      bias="none", **kw)


def logits_of(model, tok):
    with torch.no_grad():
        lg = model(input_ids=tok).logits.float()
    return lg.reshape(-1, lg.shape[-1]).clone()


def dora(tok, tgt, gen, nf4=False):
    """dora.safetensors + dora_peft/, or (nf4) dora_nf4.safetensors."""
    name = "dora_nf4" if nf4 else "dora"
    pm = get_peft_model(load_syn(nf4), lora_config(use_dora=True)).float().eval()
    out = {"tokens": tok.to(torch.int32), "targets": tgt.to(torch.int32)}
    with torch.no_grad():
        for key, mod in lora_modules(pm):
            a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight
            m = mod.lora_magnitude_vector["default"].weight
            a.copy_((torch.rand(a.shape, generator=gen) * 2 - 1) / np.sqrt(a.shape[1]))
            b.copy_(0.03 * torch.randn(b.shape, generator=gen))
            out["init." + key + "m"] = m.detach().clone()
            m.mul_(1 + 0.05 * torch.randn(m.shape, generator=gen))
    out["logits"], out["loss"] = run(pm, tok, tgt)
    for key, mod in lora_modules(pm):
        for part, p in [("A", mod.lora_A["default"].weight), ("B", mod.lora_B["default"].weight),
                        ("m", mod.lora_magnitude_vector["default"].weight)]:
            out[key + part] = p.detach().clone()
            out[key + "g" + part] = p.grad.detach().clone()
    if not nf4:
        d = os.path.join(OUT, "dora_peft")
        shutil.rmtree(d, ignore_errors=True)
        pm.save_pretrained(d)
        tidy_adapter_dir(d)
        # PeftModel.from_pretrained of what was saved gives the same logits (the file is complete).
        back = logits_of(PeftModel.from_pretrained(load_syn(), d).eval(), tok)
        print("dora: reloaded adapter max |dlogits| %.3g" % float((back - out["logits"]).abs().max()))
    out["merged_logits"] = logits_of(pm.merge_and_unload(), tok)
    print("%s: merged max |dlogits| %.3g" % (name, float((out["merged_logits"] - out["logits"]).abs().max())))
    save_file(out, os.path.join(OUT, name + ".safetensors"))
    print(name, "loss", float(out["loss"]))


def residual_init(init, tok, tgt, gen, tmp):
    """pissa / olora: PEFT's initial factors, the state after a seeded perturbation, and the
    converted rank-2r adapter on the original base."""
    pm = get_peft_model(load_syn(), lora_config(init_lora_weights=init)).float().eval()
    out = {"tokens": tok.to(torch.int32), "targets": tgt.to(torch.int32)}
    out["init_logits"], out["init_loss"] = run(pm, tok, tgt)
    for key, mod in lora_modules(pm):
        for part, p in [("A", mod.lora_A["default"].weight), ("B", mod.lora_B["default"].weight)]:
            out["init." + key + part] = p.detach().clone()
            out["init." + key + "g" + part] = p.grad.detach().clone()
    base = logits_of(load_syn(), tok)
    print("%s: init vs base max |dlogits| %.3g" % (init, float((out["init_logits"] - base).abs().max())))
    init_dir = os.path.join(tmp, init + "_initial")
    pm.save_pretrained(init_dir)
    with torch.no_grad():
        for key, mod in lora_modules(pm):
            for p in [mod.lora_A["default"].weight, mod.lora_B["default"].weight]:
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
    out["logits"], out["loss"] = run(pm, tok, tgt)
    for key, mod in lora_modules(pm):
        for part, p in [("A", mod.lora_A["default"].weight), ("B", mod.lora_B["default"].weight)]:
            out[key + part] = p.detach().clone()
            out[key + "g" + part] = p.grad.detach().clone()
    d = os.path.join(OUT, init + "_converted")
    shutil.rmtree(d, ignore_errors=True)
    pm.save_pretrained(d, path_initial_model_for_weight_conversion=init_dir)
    tidy_adapter_dir(d)
    out["converted_logits"] = logits_of(PeftModel.from_pretrained(load_syn(), d).eval(), tok)
    err = float((out["converted_logits"] - out["logits"]).abs().max())
    print("%s: converted vs trained max |dlogits| %.3g" % (init, err))
    assert err < 1e-4, init + ": PEFT's converted adapter does not reproduce the model"
    save_file(out, os.path.join(OUT, init + ".safetensors"))
    print(init, "loss", float(out["init_loss"]), "->", float(out["loss"]))


def exports():
    """Phase 2: the logits PEFT computes from qlft's exported adapters, where they exist."""
    t = {}
    for v in VARIANTS:
        d = os.path.join(OUT, "qlft_" + v)
        if not os.path.isdir(d):
            continue
        tok = load_file(os.path.join(OUT, v + ".safetensors"))["tokens"].long()
        t[v + "_qlft_export_logits"] = logits_of(PeftModel.from_pretrained(load_syn(), d).eval(), tok)
        print("qlft export", v, "loaded by PEFT")
    path = os.path.join(OUT, "qlft_exports.safetensors")
    if t:
        save_file(t, path)
    elif os.path.exists(path):
        os.remove(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exports-only", action="store_true",
                    help="only phase 2, on the committed fixtures")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if not args.exports_only:
        loftq()
        init_factors()
        gen = torch.Generator().manual_seed(4949)
        tok, tgt = batch(160, gen)
        dora(tok, tgt, gen)
        check_nf4_dora_layers()
        dora(tok, tgt, gen, nf4=True)
        with tempfile.TemporaryDirectory() as tmp:
            for init in ["pissa", "olora"]:
                residual_init(init, tok, tgt, gen, tmp)
    exports()
    fixture_versions.write(OUT, __file__)


if __name__ == "__main__":
    main()
