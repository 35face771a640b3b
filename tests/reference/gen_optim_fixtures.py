#!/usr/bin/env python3
"""Reference fixtures for src/optim (AdamW, 8-bit AdamW, clipping, schedules, loss scaler).

Run with the reference venv:  /opt/qlft-ref/bin/python tests/reference/gen_optim_fixtures.py
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)
Every expected value comes from the real peer running on CPU:
  - torch.optim.AdamW (single-tensor path, the CPU default)
  - bitsandbytes.optim.AdamW8bit 0.50.2 (its CPU backend: fp32 state under 4096 elements,
    blockwise-256 dynamic 8-bit state otherwise)
  - torch.nn.utils.clip_grad_norm_
  - transformers' get_{constant,linear,cosine}_schedule_with_warmup and
    get_cosine_with_min_lr_schedule_with_warmup, through torch's LambdaLR
  - torch._amp_update_scale_ and torch._amp_foreach_non_finite_check_and_unscale_ (what
    torch.amp.GradScaler runs)
Outputs go to tests/reference/fixtures/optim/, read by tests/unit/test_optim*.cpp.

Run it where torch's CPU capability is AVX512 (an AVX-512 CPU; VERSIONS.json "machine"). torch
dispatches its CPU kernels by ISA, and at the same versions the AdamW / AdamW8bit results differ
in the last bits between capabilities (measured 2026-11-25 on an AVX2 EPYC: torch's own DEFAULT
and AVX2 AdamW differ by up to 4 ulps after 4 steps; the regenerated adamw.safetensors put
test_optim's AdamW 5 ulps and AdamW8bit 8 ulps from ours, against bounds of 1 and 2 that the
AVX512-made file meets). The generator refuses another capability unless QLFT_REF_ANY_ISA=1.
"""
import json
import math
import os

import torch
import bitsandbytes as bnb
from safetensors.torch import save_file

import fixture_versions
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "optim")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(20261121)

STEPS = 4


def make_grads(shape, steps, spread):
    # Gradients whose magnitude varies over several decades within a tensor, so the second
    # moment spans much of the 8-bit dynamic map (and its near-zero region).
    out = []
    scale = torch.exp(torch.randn(shape) * spread)
    for _ in range(steps):
        out.append((torch.randn(shape) * scale * 1e-2).contiguous())
    return out


def run(opt_factory, shapes, tag, tensors, meta, extra_state):
    params = [torch.nn.Parameter(torch.randn(s) * 0.5) for s in shapes]
    grads = [make_grads(s, STEPS, 1.5) for s in shapes]
    for i, p in enumerate(params):
        tensors[f"{tag}.p{i}.init"] = p.detach().clone()
        for k in range(STEPS):
            tensors[f"{tag}.p{i}.grad{k}"] = grads[i][k]
    opt = opt_factory(params)
    for k in range(STEPS):
        for i, p in enumerate(params):
            p.grad = grads[i][k].clone()
        opt.step()
        if k == 0 or k == STEPS - 1:
            for i, p in enumerate(params):
                tensors[f"{tag}.p{i}.after{k + 1}"] = p.detach().clone()
                extra_state(opt, p, f"{tag}.p{i}.s{k + 1}", tensors)
    meta[tag] = {"shapes": [list(s) for s in shapes], "steps": STEPS}


def adamw_state(opt, p, prefix, tensors):
    st = opt.state[p]
    tensors[prefix + ".exp_avg"] = st["exp_avg"].clone()
    tensors[prefix + ".exp_avg_sq"] = st["exp_avg_sq"].clone()


def bnb_state(opt, p, prefix, tensors):
    st = opt.state[p]
    if st["state1"].dtype == torch.uint8:
        tensors[prefix + ".state1"] = st["state1"].clone()
        tensors[prefix + ".state2"] = st["state2"].clone()
        tensors[prefix + ".absmax1"] = st["absmax1"].clone()
        tensors[prefix + ".absmax2"] = st["absmax2"].clone()
    else:
        tensors[prefix + ".exp_avg"] = st["state1"].clone()
        tensors[prefix + ".exp_avg_sq"] = st["state2"].clone()


def optimizer_fixtures():
    tensors, meta = {}, {}
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    meta["hparams"] = {"lr": hp["lr"], "beta1": 0.9, "beta2": 0.999, "eps": hp["eps"],
                       "weight_decay": hp["weight_decay"]}
    run(lambda ps: torch.optim.AdamW(ps, **hp, foreach=False), [(8, 96), (300,)], "adamw",
        tensors, meta, adamw_state)
    # 1000 elements: fp32 state path (< min_8bit_size 4096); 4096: exactly the threshold, 8-bit;
    # 4232 = 16 * 256 + 136: 8-bit with a ragged last block.
    run(lambda ps: bnb.optim.AdamW8bit(ps, **hp), [(1000,), (16, 256), (4232,)], "adamw8bit",
        tensors, meta, bnb_state)
    save_file(tensors, os.path.join(OUT, "adamw.safetensors"))
    return meta


def run_var(opt_factory, n, tag, lrs, tensors, meta, extra_state):
    # Other hyperparameters and a changing lr (as a scheduler sets param_group["lr"]); inputs
    # are float16-representable and stored as F16 to keep the fixture small.
    p = torch.nn.Parameter((torch.randn(n) * 0.5).half().float())
    grads = [(torch.randn(n) * torch.exp(torch.randn(n) * 1.5) * 1e-2).half().float()
             for _ in lrs]
    tensors[f"{tag}.init"] = p.detach().half()
    for k, g in enumerate(grads):
        tensors[f"{tag}.grad{k}"] = g.half()
    opt = opt_factory([p])
    for k, g in enumerate(grads):
        for group in opt.param_groups:
            group["lr"] = lrs[k]
        p.grad = g.clone()
        opt.step()
    tensors[f"{tag}.after"] = p.detach().clone()
    extra_state(opt, p, f"{tag}.s", tensors)
    meta[tag] = {"n": n, "lrs": lrs}


def optimizer_var_fixtures(meta):
    tensors = {}
    lrs = [1e-3, 5e-4, 2e-3, 1e-4]
    hp = dict(betas=(0.3, 0.95), eps=1e-6)
    meta["var_hparams"] = {"beta1": 0.3, "beta2": 0.95, "eps": 1e-6}
    # beta1 < 0.5 takes torch lerp's other branch; weight decay 0.1 for AdamW, 0 for 8-bit
    # (bnb skips the decay multiply then); 4100 = 16 * 256 + 4: a last block of 4 elements.
    run_var(lambda ps: torch.optim.AdamW(ps, lr=lrs[0], weight_decay=0.1, foreach=False, **hp),
            300, "adamw_var", lrs, tensors, meta, adamw_state)
    meta["adamw_var"]["weight_decay"] = 0.1
    run_var(lambda ps: bnb.optim.AdamW8bit(ps, lr=lrs[0], weight_decay=0.0, **hp), 4100,
            "adamw8bit_var", lrs, tensors, meta, bnb_state)
    meta["adamw8bit_var"]["weight_decay"] = 0.0
    save_file(tensors, os.path.join(OUT, "adamw_var.safetensors"))


def clip_fixtures():
    tensors, meta = {}, {}
    for case, (mul, max_norm) in {"clipped": (1.0, 1.0), "unclipped": (1e-3, 1.0)}.items():
        grads = [torch.randn(37) * mul, torch.randn(8, 33) * 3 * mul, torch.randn(1000) * mul]
        for i, g in enumerate(grads):
            tensors[f"{case}.g{i}.before"] = g.clone()
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        for i, p in enumerate(params):
            tensors[f"{case}.g{i}.after"] = p.grad.clone()
        meta[case] = {"max_norm": max_norm, "total_norm": float(norm)}
    save_file(tensors, os.path.join(OUT, "clip.safetensors"))
    return meta


def schedule_fixtures():
    base_lr, total, warmup = 3e-4, 40, 7
    cases = {
        "constant": lambda o: get_constant_schedule_with_warmup(o, warmup),
        "linear": lambda o: get_linear_schedule_with_warmup(o, warmup, total),
        "cosine": lambda o: get_cosine_schedule_with_warmup(o, warmup, total),
        "cosine_min0.1": lambda o: get_cosine_with_min_lr_schedule_with_warmup(
            o, warmup, total, min_lr_rate=0.1),
        "linear_nowarmup": lambda o: get_linear_schedule_with_warmup(o, 0, total),
    }
    out = {"base_lr": base_lr, "total_steps": total, "warmup_steps": warmup, "cases": {}}
    for name, make in cases.items():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
        sched = make(opt)
        lrs = []
        # lr used by optimizer step k (k = 0 .. total + 4, past the end on purpose)
        for _ in range(total + 5):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        out["cases"][name] = lrs
    return out


def scaler_fixtures():
    # The sequence torch.amp.GradScaler.update() produces for a pattern of overflow steps.
    init, growth, backoff, interval = 65536.0, 2.0, 0.5, 3
    scale = torch.full((1,), init, dtype=torch.float32)
    tracker = torch.zeros((1,), dtype=torch.int32)
    pattern = [0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    scales = []
    for inf in pattern:
        found = torch.full((1,), float(inf), dtype=torch.float32)
        torch._amp_update_scale_(scale, tracker, found, growth, backoff, interval)
        scales.append(float(scale))
    # Unscale + non-finite check on a set of gradients.
    g = [torch.randn(50) * 1000, torch.randn(7) * 1000]
    gc = [x.clone() for x in g]
    found = torch.zeros((1,), dtype=torch.float32)
    inv = torch.full((1,), 1.0 / 1024.0, dtype=torch.float32)
    torch._amp_foreach_non_finite_check_and_unscale_(gc, found, inv)
    save_file({"g0": g[0], "g1": g[1], "g0.unscaled": gc[0], "g1.unscaled": gc[1]},
              os.path.join(OUT, "scaler.safetensors"))
    return {"init_scale": init, "growth_factor": growth, "backoff_factor": backoff,
            "growth_interval": interval, "found_inf": pattern, "scales_after": scales,
            "unscale_inv_scale": 1.0 / 1024.0, "unscale_found_inf": float(found)}


def main():
    cap = torch.backends.cpu.get_cpu_capability()
    if cap != "AVX512" and os.environ.get("QLFT_REF_ANY_ISA") != "1":
        raise SystemExit(f"gen_optim_fixtures: torch's CPU capability here is {cap}; the committed "
                         "fixtures and test_optim's ulp bounds are AVX512's (see the docstring). "
                         "Run on an AVX-512 CPU, or set QLFT_REF_ANY_ISA=1 to write them anyway.")
    meta = {}  # the peers' versions: VERSIONS.json
    meta["optim"] = optimizer_fixtures()
    optimizer_var_fixtures(meta["optim"])
    meta["clip"] = clip_fixtures()
    meta["schedule"] = schedule_fixtures()
    meta["scaler"] = scaler_fixtures()
    with open(os.path.join(OUT, "optim.json"), "w") as f:
        json.dump(meta, f, indent=1, separators=(',', ': '))
        f.write("\n")
    fixture_versions.write(OUT, __file__)


if __name__ == "__main__":
    main()
