#!/usr/bin/env python3
"""Reference renderings for the dataset pipeline's chat templates (src/data/chat_template.*).

Each case renders messages with transformers' apply_chat_template and a real model's Jinja chat
template (embedded below; no hub access), and marks the spans a completion-only loss trains on:
for assistant turn i, the text between render(messages[:i], add_generation_prompt=True) and the
end of the turn's end marker in render(messages[:i+1]) -- the "prefix diff" rule, ending at the
end-of-turn token (<|im_end|>, <|eot_id|>, eos). Alpaca records under the alpaca template use
Stanford Alpaca's own prompt strings (PROMPT_DICT) instead.

Token level: each rendered text is also tokenized whole by Hugging Face tokenizers of the GGUF
vocabularies in shared/ (stories260K, Llama SPM, GPT-2; built as gen_tokenizer_fixtures.py does) with special tokens parsed, and a token is marked
trained when its character offsets overlap a trained span (Hugging Face's
return_assistant_tokens_mask works the same way, through offsets).

Run: /opt/qlft-ref/bin/python tests/reference/gen_data_fixtures.py
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)
Writes tests/reference/fixtures/data/templates.json (offsets are UTF-8 byte offsets).
"""
import json
import os
import sys

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "data")

# teknium/OpenHermes-2.5-Mistral-7B and most ChatML models.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")
# Qwen/Qwen2-7B-Instruct: ChatML with a default system prompt.
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# meta-llama/Meta-Llama-3-8B-Instruct
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
          " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
          "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# meta-llama/Llama-2-7b-chat-hf
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
          "{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
          "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}"
          "{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
          "{% endif %}{% endfor %}")
# mistralai/Mixtral-8x7B-Instruct-v0.1 (same scheme as Mistral-7B-Instruct-v0.1)
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
           "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
           "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
           "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
           "roles are supported!') }}{% endif %}{% endfor %}")
# No model ships an Alpaca chat template; this one is ours. It writes Stanford Alpaca's
# no-input prompt for a single turn (checked below against PROMPT_DICT).
ALPACA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
          "{% set loop_messages = messages[1:] %}{% else %}{{ 'Below is an instruction that "
          "describes a task. Write a response that appropriately completes the request.' }}"
          "{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}"
          "{% if message['role'] == 'user' %}{{ '\n\n### Instruction:\n' + message['content'] }}"
          "{% elif message['role'] == 'assistant' %}{{ '\n\n### Response:\n' + message['content'] + "
          "eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
          "{{ '\n\n### Response:\n' }}{% endif %}")

# Stanford Alpaca (tatsu-lab/stanford_alpaca train.py PROMPT_DICT).
PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
                "further context. Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that "
                   "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
                   "### Response:\n")

TEMPLATES = [
    # name, kind, jinja, bos, eos, end-of-turn marker, supports system
    ("chatml", "chatml", CHATML, "", "<|im_end|>", "<|im_end|>", True),
    ("qwen2", "chatml", QWEN2, "", "<|im_end|>", "<|im_end|>", True),
    ("llama3", "llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>", True),
    ("llama2", "llama2", LLAMA2, "<s>", "</s>", "</s>", True),
    ("mistral", "mistral", MISTRAL, "<s>", "</s>", "</s>", False),
    ("alpaca", "alpaca", ALPACA, "<s>", "</s>", "</s>", True),
]

CHATS = [
    [{"role": "user", "content": "Hello, how are you?"},
     {"role": "assistant", "content": "I'm doing great. How can I help you today?"}],
    [{"role": "system", "content": "You are a pirate. Answer briefly."},
     {"role": "user", "content": "What's 2+2?"},
     {"role": "assistant", "content": "  Four, matey!  "},
     {"role": "user", "content": "And 3+3? "},
     {"role": "assistant", "content": "Six."}],
    [{"role": "user", "content": "Unicode: h\u00e9llo \u2014 \u65e5\u672c\u8a9e \U0001F331\n"},
     {"role": "assistant", "content": "\u00c7a va\ttr\u00e8s bien.\n"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}],
]

ALPACAS = [
    {"instruction": "Give three tips for staying healthy.", "input": "",
     "output": "1. Eat well.\n2. Sleep enough.\n3. Move every day."},
    {"instruction": "Translate to French.", "input": "Good morning, friend.",
     "output": "Bonjour, mon ami."},
]


def tokenizer(bos, eos):
    vocab = {"<unk>": 0}
    for t in (bos, eos):
        if t and t not in vocab:
            vocab[t] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    kw = {"unk_token": "<unk>"}
    if bos:
        kw["bos_token"] = bos
    if eos:
        kw["eos_token"] = eos
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kw)


def nbytes(s):
    return len(s.encode("utf-8"))


def chat_case(tok, jinja, eot, messages):
    def render(msgs, gen):
        return tok.apply_chat_template(msgs, chat_template=jinja, tokenize=False,
                                       add_generation_prompt=gen)
    full = render(messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = render(messages[:i], True)
        upto = render(messages[: i + 1], False)
        assert upto.startswith(prefix) and full.startswith(upto), (prefix, upto)
        end = upto.rfind(eot) + len(eot)
        assert end > len(prefix)
        spans.append([nbytes(prefix), nbytes(upto[:end])])
    return full, spans


ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.environ.get("QLFT_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
# fixture key -> GGUF vocabulary in shared/. Hugging Face tokenizers are built from the GGUF
# metadata by gen_tokenizer_fixtures.build (full vocabularies; the tokenizer fixtures commit only
# cut-down ones).
TOKENIZERS = {
    "stories260k": "models/stories260K.gguf",
    "llama_spm": "tokenizer-vectors/ggml-vocab-llama-spm.gguf",
    "gpt2": "tokenizer-vectors/ggml-vocab-gpt-2.gguf",
}


def token_mask(tok, text, spans):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    # byte spans back to character spans
    b2c = {}
    nb = 0
    for ci, ch in enumerate(text):
        b2c[nb] = ci
        nb += len(ch.encode("utf-8"))
    b2c[nb] = len(text)
    cspans = [(b2c[a], b2c[b]) for a, b in spans]
    trained = []
    for s, e in enc["offset_mapping"]:
        trained.append(int(e > s and any(s < b and e > a for a, b in cspans)))
    return enc["input_ids"], trained


def main():
    sys.path.insert(0, HERE)
    import fixture_versions
    import gen_tokenizer_fixtures as gt
    toks = {k: PreTrainedTokenizerFast(tokenizer_object=gt.build(gt.read_vocab(
        os.path.join(SHARED, rel)))) for k, rel in TOKENIZERS.items()}
    cases = []
    for name, kind, jinja, bos, eos, eot, system_ok in TEMPLATES:
        tok = tokenizer(bos, eos)
        for ci, msgs in enumerate(CHATS):
            if not system_ok and msgs[0]["role"] == "system":
                continue
            text, spans = chat_case(tok, jinja, eot, msgs)
            cases.append({"name": f"{name}/chat{ci}", "template": kind, "jinja": jinja, "bos": bos,
                          "eos": eos, "messages": msgs, "text": text, "trained": spans})
        for ai, rec in enumerate(ALPACAS):
            if kind == "alpaca":
                prompt = (PROMPT_INPUT if rec["input"] else PROMPT_NO_INPUT).format(**rec)
                text = bos + prompt + rec["output"] + eos
                spans = [[nbytes(bos + prompt), nbytes(text)]]
                if not rec["input"]:  # the chat template writes the same text for one turn
                    msgs = [{"role": "user", "content": rec["instruction"]},
                            {"role": "assistant", "content": rec["output"]}]
                    assert chat_case(tok, jinja, eot, msgs) == (text, spans)
            else:
                user = rec["instruction"] + ("\n\n" + rec["input"] if rec["input"] else "")
                msgs = [{"role": "user", "content": user},
                        {"role": "assistant", "content": rec["output"]}]
                text, spans = chat_case(tok, jinja, eot, msgs)
            cases.append({"name": f"{name}/alpaca{ai}", "template": kind, "jinja": jinja,
                          "bos": bos, "eos": eos, "record": rec, "text": text, "trained": spans})
    for c in cases:
        for k, tok in toks.items():
            ids, trained = token_mask(tok, c["text"], c["trained"])
            c[k] = {"ids": ids, "trained": trained}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "templates.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "transformers apply_chat_template", "cases": cases}, f, indent=1,
                  ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} cases -> {OUT}/templates.json")
    fixture_versions.write(OUT, __file__, inputs=[os.path.join(SHARED, r) for r in TOKENIZERS.values()])


if __name__ == "__main__":
    main()
