#!/usr/bin/env python3
"""Reference fixtures for the preference objectives (issue 49): DPO, IPO, ORPO, SimPO, KTO.

Runs TRL 1.16's own loss code in fp32 on the CPU and writes tests/reference/fixtures/preference/
preference.safetensors. The model is stories260K as HF Llama (from the GGUF, as
gen_train_fixtures.py), wrapped by PEFT with LoraConfig(r=4, lora_alpha=8, all seven
projections, dropout 0) whose A and B are set to seeded values (B != 0, so the policy differs
from the reference: with PEFT's B = 0 every reward would be 0). The batch is 2 pairs of
prompt + chosen / prompt + rejected token ids (seeded, BOS first, EOS last), right-padded.

Each objective's loss is computed by calling TRL's method on a stand-in `self` holding the
attributes the method reads (the real trainers also tokenize and build datasets, which the
fixture does not need):
  dpo    DPOTrainer._compute_loss, loss_type ["sigmoid"], beta 0.1; the reference is the same
         PEFT model with the adapter disabled (TRL's use_adapter(model, None))
  ipo    the same, loss_type ["ipo"], beta 0.1
  orpo   ORPOTrainer.get_batch_loss_metrics (concatenated_forward + odds_ratio_loss), beta 0.1
  simpo  CPOTrainer.get_batch_loss_metrics, loss_type "simpo", beta 2.0, simpo_gamma 0.5,
         cpo_alpha 0.5 (the CPO NLL term on too), label_smoothing 0.1
  kto    KTOTrainer._compute_loss, beta 0.1, desirable_weight 1.0, undesirable_weight 1.5; the 4
         rows (both pairs' chosen: label true, rejected: false) with TRL's KL rows (completions
         rotated by one: row j's prompt with row j-1's completion)
then loss.backward() gives the LoRA gradients. Written per objective X: X.loss, X.metrics (TRL's
logged values, in the order of METRICS below; NaN where TRL logs none) and X.l{i}.{proj}.dA/.dB
(HF row order).

Run: /opt/qlft-ref/bin/python tests/reference/gen_preference_fixtures.py
"""
import contextlib
import os
import sys
import types
from collections import defaultdict

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

from trl.trainer.dpo_trainer import DPOTrainer
from trl.trainer.kto_trainer import KTOTrainer
from trl.trainer.utils import add_fused_lm_head
from trl.experimental.cpo.cpo_trainer import CPOTrainer
from trl.experimental.orpo.orpo_trainer import ORPOTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixture_versions  # noqa: E402
import gen_model_fixtures as gm  # noqa: E402
import gen_train_fixtures as gt  # noqa: E402

OUT = os.path.join(HERE, "fixtures", "preference")
METRICS = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
           "logps/chosen", "logps/rejected"]
T = 24  # padded row length
PAD = 0

torch.set_num_threads(2)


class Accel:
    """The accelerator calls the loss code makes, for one process."""
    device = torch.device("cpu")

    def unwrap_model(self, m):
        return m

    def gather_for_metrics(self, x):
        return x

    def gather(self, x):
        return x


def make_batch(gen):
    """2 pairs: prompt (4-7 ids), chosen and rejected completions (3-9 ids, EOS last)."""
    rows = []
    for _ in range(2):
        prompt = [1] + torch.randint(3, 512, (int(torch.randint(3, 7, (1,), generator=gen)),),
                                     generator=gen).tolist()
        comps = []
        for _ in range(2):
            n = int(torch.randint(2, 9, (1,), generator=gen))
            comps.append(torch.randint(3, 512, (n,), generator=gen).tolist() + [2])
        rows.append((prompt, comps[0], comps[1]))
    return rows


def pad_rows(seqs):
    """[(prompt, completion)] -> input_ids, attention_mask, completion_mask [n, T]."""
    ids = torch.full((len(seqs), T), PAD, dtype=torch.long)
    attn = torch.zeros((len(seqs), T), dtype=torch.long)
    comp = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, (p, c) in enumerate(seqs):
        n = len(p) + len(c)
        assert n <= T
        ids[i, :n] = torch.tensor(p + c)
        attn[i, :n] = 1
        comp[i, len(p):n] = 1
    return ids, attn, comp


def policy():
    m = gt.stories_model().float()
    add_fused_lm_head(m, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=gm.PROJS, bias="none",
                     task_type="CAUSAL_LM")
    pm = get_peft_model(m, cfg)
    g = torch.Generator().manual_seed(4901)
    for mod in gt.lora_modules(pm).values():
        a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight
        with torch.no_grad():
            a.copy_(torch.randn(a.shape, generator=g) * 0.2)
            b.copy_(torch.randn(b.shape, generator=g) * 0.03)
    pm.train()
    return pm


def grads(pm, prefix, out):
    for (i, p), mod in gt.lora_modules(pm).items():
        out[f"{prefix}.l{i}.{p}.dA"] = mod.lora_A["default"].weight.grad.detach().clone()
        out[f"{prefix}.l{i}.{p}.dB"] = mod.lora_B["default"].weight.grad.detach().clone()
    pm.zero_grad(set_to_none=True)


def metric_vec(m):
    return torch.tensor([float(m[k]) if k in m else float("nan") for k in METRICS],
                        dtype=torch.float32)


def last(d):
    return {k: v[-1] for k, v in d.items() if v}


def dpo_like(pm, loss_type, ids, attn, comp):
    self = types.SimpleNamespace(
        model=pm, ref_model=None, accelerator=Accel(), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=False, args=types.SimpleNamespace(gradient_checkpointing_kwargs=None),
        f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0], beta=0.1,
        label_smoothing=0.0, use_weighting=False, f_alpha_divergence_coef=1.0,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0, _tp_size=1)
    loss = DPOTrainer._compute_loss(self, pm, {"input_ids": ids, "attention_mask": attn,
                                               "completion_mask": comp}, False)
    return loss, last(self._metrics["train"])


def cpo_batch(pairs):
    """The tokenized pair batch CPOTrainer / ORPOTrainer collate: *_input_ids, *_attention_mask,
    *_labels (prompt tokens -100)."""
    out = {}
    for side, k in (("chosen", 1), ("rejected", 2)):
        ids, attn, comp = pad_rows([(p[0], p[k]) for p in pairs])
        out[f"{side}_input_ids"] = ids
        out[f"{side}_attention_mask"] = attn
        out[f"{side}_labels"] = ids.masked_fill(comp == 0, -100)
    return out


def cpo_self(pm, **kw):
    return types.SimpleNamespace(model=pm, accelerator=Accel(), is_encoder_decoder=False,
                                 pad_token_id=PAD, padding_value=PAD, aux_loss_enabled=False,
                                 concatenated_inputs=CPOTrainer.concatenated_inputs,
                                 get_batch_logps=CPOTrainer.get_batch_logps, **kw)


def simpo(pm, pairs):
    self = cpo_self(pm, loss_type="simpo", beta=2.0, simpo_gamma=0.5, cpo_alpha=0.5,
                    label_smoothing=0.1, alpha=0.0)
    self.concatenated_forward = lambda m, b: CPOTrainer.concatenated_forward(self, m, b)
    self.cpo_loss = lambda c, r: CPOTrainer.cpo_loss(self, c, r)
    return CPOTrainer.get_batch_loss_metrics(self, pm, cpo_batch(pairs))


def orpo(pm, pairs):
    self = cpo_self(pm, beta=0.1)
    self.concatenated_inputs = ORPOTrainer.concatenated_inputs
    self.get_batch_logps = ORPOTrainer.get_batch_logps
    self.concatenated_forward = lambda m, b: ORPOTrainer.concatenated_forward(self, m, b)
    self.odds_ratio_loss = lambda c, r: ORPOTrainer.odds_ratio_loss(self, c, r)
    return ORPOTrainer.get_batch_loss_metrics(self, pm, cpo_batch(pairs))


def kto(pm, pairs):
    seqs = [(p[0], p[1]) for p in pairs] + [(p[0], p[2]) for p in pairs]
    label = [True] * len(pairs) + [False] * len(pairs)
    kl = [(seqs[j][0], seqs[j - 1][1]) for j in range(len(seqs))]  # TRL: completions rotated by 1
    ids, attn, comp = pad_rows(seqs)
    kids, kattn, kcomp = pad_rows(kl)
    self = types.SimpleNamespace(
        model=pm, ref_model=None, accelerator=Accel(), aux_loss_enabled=False,
        precompute_ref_logps=False, calculate_KL=True, loss_type="kto", beta=0.1,
        desirable_weight=1.0, undesirable_weight=1.5,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0, _tp_size=1)
    self._compute_kl_logps = lambda m, b: KTOTrainer._compute_kl_logps(self, m, b)
    batch = {"input_ids": ids, "attention_mask": attn, "completion_mask": comp,
             "KL_input_ids": kids, "KL_attention_mask": kattn, "KL_completion_mask": kcomp,
             "label": torch.tensor(label)}
    loss = KTOTrainer._compute_loss(self, pm, batch, False)
    m = last(self._metrics["train"])
    return loss, m, (kids, kattn, kcomp), torch.tensor(label, dtype=torch.int32)


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(49)
    pairs = make_batch(gen)
    pm = policy()
    out = {}
    for (i, p), mod in gt.lora_modules(pm).items():
        out[f"l{i}.{p}.A"] = mod.lora_A["default"].weight.detach().clone()
        out[f"l{i}.{p}.B"] = mod.lora_B["default"].weight.detach().clone()
    # Rows: the pairs' chosen sequences, then their rejected ones (TRL's concatenated order).
    ids, attn, comp = pad_rows([(p[0], p[1]) for p in pairs] + [(p[0], p[2]) for p in pairs])
    out["ids"], out["attn"], out["comp"] = ids.int(), attn.int(), comp.int()

    for name in ("dpo", "ipo"):
        loss, m = dpo_like(pm, "sigmoid" if name == "dpo" else "ipo", ids, attn, comp)
        loss.backward()
        out[f"{name}.loss"] = loss.detach().reshape(1).float()
        out[f"{name}.metrics"] = metric_vec(m)
        grads(pm, name, out)
        print(name, float(loss.detach()), m)
    for name, fn in (("orpo", orpo), ("simpo", simpo)):
        loss, m = fn(pm, pairs)
        loss.backward()
        out[f"{name}.loss"] = loss.detach().reshape(1).float()
        out[f"{name}.metrics"] = metric_vec(m)
        out[f"{name}.nll_loss"] = torch.tensor([float(m["nll_loss"])])
        grads(pm, name, out)
        print(name, float(loss.detach()), m)
    loss, m, (kids, kattn, kcomp), label = kto(pm, pairs)
    loss.backward()
    out["kto.loss"] = loss.detach().reshape(1).float()
    out["kto.metrics"] = metric_vec(m)
    out["kto.kl"] = torch.tensor([float(m["kl"])])
    out["kto.kl_ids"], out["kto.kl_comp"], out["kto.label"] = kids.int(), kcomp.int(), label
    grads(pm, "kto", out)
    print("kto", float(loss), m)

    save_file({k: v.contiguous() for k, v in out.items()},
              os.path.join(OUT, "preference.safetensors"))
    fixture_versions.write(OUT, __file__, inputs=[gt.GGUF_PATH])


if __name__ == "__main__":
    sys.exit(main())
