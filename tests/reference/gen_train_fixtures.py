#!/usr/bin/env python3
"""Reference fixtures for the trainer and the adapter exports (issue 5).

Runs transformers + peft in fp32 on the CPU and writes tests/reference/fixtures/train/:

  parity.safetensors   a 20-step PEFT + transformers run on stories260K: LoraConfig(r=8,
                       lora_alpha=16, all 7 targets, dropout 0) with PEFT's own init (torch seed),
                       2 micro-batches of [2, 32] per step (some targets -100), loss of a step =
                       sum of token losses over both micro-batches / counted tokens,
                       torch.optim.AdamW(lr 1e-3, wd 0.01), get_linear_schedule_with_warmup(2, 20),
                       clip_grad_norm_(1.0). Holds the tokens/targets, the initial A (B = 0), the
                       loss and lr of every step, and the final A/B (HF q/k row order).
  export.safetensors   fixed tokens [2, 16] and the logits of PeftModel.from_pretrained(peft_adapter/)
                       on the HF stories260K model, and of the merged safetensors model.
  export_checks.json   results of checking adapter.gguf / adapter_rslora.gguf against the rules of
                       llama.cpp's LoRA loader (src/llama-adapter.cpp) with the gguf package, and of
                       loading merged/ with transformers.

peft_adapter/, adapter.gguf, adapter_rslora.gguf and merged/ are written by OUR code (the C++ test
test_adapter_export with QLFT_WRITE_TRAIN_FIXTURES=1); this script only reads them.

Run: /opt/qlft-ref/bin/python tests/reference/gen_train_fixtures.py
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import gguf
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import LlamaForCausalLM, get_linear_schedule_with_warmup

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixture_versions  # noqa: E402
import gen_model_fixtures as gm  # noqa: E402  (stories260K -> HF conversion, q/k permutations)

OUT = os.path.join(HERE, "fixtures", "train")
GGUF_PATH = os.path.join(gm.SHARED, "models", "stories260K.gguf")
STORIES_CFG = dict(hidden_size=64, intermediate_size=172, num_hidden_layers=5,
                   num_attention_heads=8, num_key_value_heads=4, vocab_size=512, rms_norm_eps=1e-5,
                   max_position_embeddings=2048, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                   bos_token_id=1, eos_token_id=2)

torch.set_num_threads(2)


def stories_model():
    m = gm.hf_model("llama", STORIES_CFG)
    m.load_state_dict(gm.state_from_gguf(GGUF_PATH, STORIES_CFG), strict=True)
    return m


def lora_modules(peft_model):
    """(layer, proj) -> the LoRA Linear module."""
    out = {}
    for i, layer in enumerate(peft_model.base_model.model.model.layers):
        for p in gm.PROJS:
            parent = layer.self_attn if p in gm.PROJS[:4] else layer.mlp
            out[(i, p)] = getattr(parent, p)
    return out


# ---- 1. 20-step parity run ---------------------------------------------------------------------
def micro_batch(gen, n=2, t=32):
    tok = torch.randint(3, 512, (n, t), generator=gen)
    tok[:, 0] = 1
    tgt = torch.cat([tok[:, 1:], torch.randint(3, 512, (n, 1), generator=gen)], 1).clone()
    # A few ignored targets at random places (and row 1 starts ignored, like a prompt).
    for _ in range(5):
        tgt[int(torch.randint(0, n, (1,), generator=gen))][int(torch.randint(0, t, (1,), generator=gen))] = -100
    tgt[1, :3] = -100
    return tok, tgt


def parity():
    steps, micro = 20, 2
    model = stories_model()
    torch.manual_seed(2024)
    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=gm.PROJS, bias="none",
                     task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    pm.train()
    mods = lora_modules(pm)
    out = {}
    for (i, p), m in mods.items():
        out[f"l{i}.{p}.A0"] = m.lora_A["default"].weight.detach().clone()
        assert float(m.lora_B["default"].weight.abs().max()) == 0.0
    params = [p for p in pm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=steps)
    gen = torch.Generator().manual_seed(99)
    toks, tgts, losses, lrs, norms = [], [], [], [], []
    for s in range(steps):
        batches = [micro_batch(gen) for _ in range(micro)]
        n = sum(int((t != -100).sum()) for _, t in batches)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for tok, tgt in batches:
            logits = pm(input_ids=tok).logits
            ls = F.cross_entropy(logits.reshape(-1, 512), tgt.reshape(-1), ignore_index=-100,
                                 reduction="sum")
            (ls / n).backward()
            total += float(ls)
            toks.append(tok)
            tgts.append(tgt)
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        losses.append(total / n)
        norms.append(float(norm))
        print(f"step {s + 1:2d} loss {losses[-1]:.6f} lr {lrs[-1]:.3e} norm {norms[-1]:.4f}")
    for (i, p), m in mods.items():
        out[f"l{i}.{p}.A"] = m.lora_A["default"].weight.detach().clone()
        out[f"l{i}.{p}.B"] = m.lora_B["default"].weight.detach().clone()
    out["tokens"] = torch.stack(toks).to(torch.int32)   # [steps * micro, 2, 32]
    out["targets"] = torch.stack(tgts).to(torch.int32)
    out["loss"] = torch.tensor(losses, dtype=torch.float64)
    out["lr"] = torch.tensor(lrs, dtype=torch.float64)
    out["grad_norm"] = torch.tensor(norms, dtype=torch.float64)
    meta = {"r": "8", "alpha": "16", "targets": ",".join(gm.PROJS), "steps": str(steps),
            "micro": str(micro), "lr": "1e-3", "weight_decay": "0.01", "warmup": "2",
            "max_grad_norm": "1.0"}
    save_file(out, os.path.join(OUT, "parity.safetensors"), metadata=meta)


# ---- 2. PEFT load of our export, merged model ----------------------------------------------------
def export_refs(checks):
    peft_dir = os.path.join(OUT, "peft_adapter")
    gen = torch.Generator().manual_seed(5)
    tok = torch.randint(3, 512, (2, 16), generator=gen)
    tok[:, 0] = 1
    out = {"tokens": tok.to(torch.int32)}
    base = stories_model()
    with torch.no_grad():
        out["base_logits"] = base(input_ids=tok).logits.reshape(-1, 512).clone()
    pm = PeftModel.from_pretrained(base, peft_dir)
    pm.eval()
    with torch.no_grad():
        peft_logits = pm(input_ids=tok).logits.reshape(-1, 512).clone()
    out["peft_logits"] = peft_logits
    # The adapter must change the model noticeably, or the comparison proves nothing.
    d = float((peft_logits - out["base_logits"]).abs().max())
    checks["peft_load"] = {"ok": d > 1e-2, "max_abs_change_vs_base": d}

    merged_dir = os.path.join(OUT, "merged")
    if os.path.isdir(merged_dir):
        mm = LlamaForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
        mm.config._attn_implementation = "eager"
        mm.eval()
        with torch.no_grad():
            ml = mm(input_ids=tok).logits.reshape(-1, 512).clone()
        out["merged_logits"] = ml
        err = float((ml - peft_logits).abs().max() / peft_logits.abs().max())
        checks["merged_safetensors"] = {"ok": err < 1e-5, "max_rel_err_vs_peft": err}
        print("merged vs peft max rel err", err)
    save_file(out, os.path.join(OUT, "export.safetensors"))
    return load_file(os.path.join(peft_dir, "adapter_model.safetensors"))


# ---- 3. llama.cpp adapter loader rules -----------------------------------------------------------
def field_str(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    return bytes(f.parts[f.data[0]]).decode()


def field_f32(r, key):
    f = r.fields.get(key)
    if f is None or f.types[0] != gguf.GGUFValueType.FLOAT32:
        return None
    return float(f.parts[f.data[0]][0])


def check_gguf(path, peft_sd, expect_alpha, r_expected):
    """The checks of llama_adapter_lora_init_impl (llama.cpp src/llama-adapter.cpp)."""
    errs = []
    r = gguf.GGUFReader(path)
    base = gguf.GGUFReader(GGUF_PATH)
    base_t = {t.name: t for t in base.tensors}
    if field_str(r, "general.type") != "adapter":
        errs.append("general.type is not 'adapter'")
    if field_str(r, "general.architecture") != field_str(base, "general.architecture"):
        errs.append("general.architecture differs from the base model's")
    if field_str(r, "adapter.type") != "lora":
        errs.append("adapter.type is not 'lora'")
    alpha = field_f32(r, "adapter.lora.alpha")
    if alpha is None:
        errs.append("adapter.lora.alpha missing or not f32")
    elif abs(alpha - expect_alpha) > 1e-5 * expect_alpha:
        errs.append(f"adapter.lora.alpha is {alpha}, expected {expect_alpha}")
    pairs = {}
    for t in r.tensors:
        if t.name.endswith(".lora_a"):
            pairs.setdefault(t.name[:-7], {})["a"] = t
        elif t.name.endswith(".lora_b"):
            pairs.setdefault(t.name[:-7], {})["b"] = t
        elif not t.name.endswith("_norm.weight"):
            errs.append(f"tensor {t.name} has an unexpected suffix")
    nh, nkv = STORIES_CFG["num_attention_heads"], STORIES_CFG["num_key_value_heads"]
    max_err, control = 0.0, float("inf")
    expected = set()
    for i in range(STORIES_CFG["num_hidden_layers"]):
        for p in gm.PROJS:
            expected.add(f"blk.{i}.{gm.GGUF_PROJ[p]}.weight")
    if set(pairs) != expected:
        errs.append(f"tensor pairs {sorted(set(pairs) ^ expected)} missing or extra")
    for name, ab in sorted(pairs.items()):
        if "a" not in ab or "b" not in ab:
            errs.append(f"pair {name} is missing one component")
            continue
        a, b = ab["a"], ab["b"]
        bt = base_t.get(name)
        if bt is None:
            errs.append(f"{name} does not exist in the base model")
            continue
        ane, bne, mne = [int(x) for x in a.shape], [int(x) for x in b.shape], [int(x) for x in bt.shape]
        if mne[0] != ane[0] or mne[1] != bne[1]:
            errs.append(f"{name} has incorrect shape")
        if ane[1] != bne[0] or ane[1] != r_expected:
            errs.append(f"{name}: lora_a is not [in, r] / lora_b not [r, out]")
        if a.tensor_type != gguf.GGMLQuantizationType.F32 or b.tensor_type != gguf.GGMLQuantizationType.F32:
            errs.append(f"{name}: not F32")
        # Row order: base (GGUF order) + scale * B A must equal the HF merge permuted to GGUF order.
        layer, proj = int(name.split(".")[1]), name.split(".")[2]
        hf = [k for k, v in gm.GGUF_PROJ.items() if v == proj][0]
        A = np.array(a.data, dtype=np.float64).reshape(ane[1], ane[0])  # numpy [r, in]
        B = np.array(b.data, dtype=np.float64).reshape(bne[1], bne[0])  # numpy [out, r]
        W = np.array(bt.data, dtype=np.float64).reshape(mne[1], mne[0])
        scale = alpha / ane[1]  # llama.cpp: alpha / rank
        ours = W + scale * (B @ A)
        group = "self_attn" if hf in gm.PROJS[:4] else "mlp"
        key = f"base_model.model.model.layers.{layer}.{group}.{hf}.lora_"
        Ah = peft_sd[key + "A.weight"].double().numpy()
        Bh = peft_sd[key + "B.weight"].double().numpy()
        peft_scale = 8.0 / 4  # the committed PEFT adapter: lora_alpha 8, r 4 (rsLoRA: 8 / sqrt 4)
        if "rslora" in os.path.basename(path):
            peft_scale = 8.0 / math.sqrt(4)
        Wh = W
        if hf == "q_proj":
            Wh = gm.permute_gguf_to_hf(W, nh)
        elif hf == "k_proj":
            Wh = gm.permute_gguf_to_hf(W, nkv)
        ref = Wh + peft_scale * (Bh @ Ah)
        if hf == "q_proj":
            ref = gm.permute_hf_to_gguf(ref, nh)
        elif hf == "k_proj":
            ref = gm.permute_hf_to_gguf(ref, nkv)
        err = float(np.abs(ours - ref).max() / np.abs(ref).max())
        max_err = max(max_err, err)
        if hf in ("q_proj", "k_proj"):
            # Control: the same comparison fails when B's rows are taken in HF order as stored,
            # so the check above does see the row order.
            wrong = W + scale * (Bh @ Ah)
            control = min(control, float(np.abs(wrong - ref).max() / np.abs(ref).max()))
    if max_err > 1e-6:
        errs.append(f"merged weight in GGUF order differs from the permuted HF merge ({max_err})")
    if not control > 1e-3:
        errs.append(f"the unpermuted control is not detected ({control})")
    return {"ok": not errs, "errors": errs, "alpha": alpha, "pairs": len(pairs),
            "max_merge_rel_err": max_err, "min_control_rel_err_unpermuted_qk": control}


def main():
    os.makedirs(OUT, exist_ok=True)
    parity()
    checks = {}
    if os.path.isdir(os.path.join(OUT, "peft_adapter")):
        peft_sd = export_refs(checks)
        for f, alpha in (("adapter.gguf", 8.0), ("adapter_rslora.gguf", 8.0 * math.sqrt(4))):
            p = os.path.join(OUT, f)
            if os.path.exists(p):
                checks[f] = check_gguf(p, peft_sd, alpha, 4)
        with open(os.path.join(OUT, "export_checks.json"), "w") as fp:
            json.dump(checks, fp, indent=2, sort_keys=True)
            fp.write("\n")
        print(json.dumps(checks, indent=2))
    else:
        print("peft_adapter/ not written yet: run test_adapter_export with QLFT_WRITE_TRAIN_FIXTURES=1")
    fixture_versions.write(OUT, __file__, inputs=[GGUF_PATH])
    for f in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, f)
        print(f, os.path.getsize(p) if os.path.isfile(p) else "dir")


if __name__ == "__main__":
    sys.exit(main())
