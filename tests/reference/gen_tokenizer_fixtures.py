#!/usr/bin/env python3
"""Tokenizer fixtures: Hugging Face tokenizer.json equivalents of the GGUF vocabularies in
shared/, and the ids the `tokenizers` package gives for the test inputs.

    /opt/qlft-ref/bin/python tests/reference/gen_tokenizer_fixtures.py
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)

For each GGUF vocabulary a `tokenizers.Tokenizer` is built from its metadata, the way the
original Hugging Face tokenizers look:
  * SentencePiece ("llama"): BPE over the vocabulary with merges recovered from the scores
    (transformers' generate_merges, as its GGUF conversion does), byte_fallback, normalizer
    Prepend("▁") + Replace(" ", "▁") (Llama-2's tokenizer.json; matches llama.cpp's space
    prefix), decoder Replace/ByteFallback/Fuse/Strip.
  * byte-level BPE ("gpt2"): the GGUF merges, ByteLevel pre-tokenizer and decoder.
Control/unknown tokens become special added tokens.

The two large vocabularies are committed cut down to the tokens and merges the test inputs can
reach: a token is kept if it is a substring of some pre-tokenized input word (a merge can only
produce such a token), plus all byte tokens and special tokens; token ids are unchanged. BPE's
result is the same with the unused merges removed (each step picks the lowest-rank applicable
merge, and removed merges are never applicable); the script checks that the cut-down tokenizer
gives exactly the full one's ids. stories260K's tokenizer (512 tokens) is committed whole.

Also records the count and a hash of the ids for the whole of data/tinyshakespeare.txt
(too many ids to commit), with the full vocabularies.

Writes tests/reference/fixtures/tokenizer/{llama-spm,gpt-2,stories260k}/tokenizer.json (+
tokenizer_config.json) and expected_ids.json. The inputs themselves are read from shared/ by the
test (tokenizer-vectors/*.inp, the first stories of data/tinystories-sample.txt).
"""
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.processors import TemplateProcessing
from tokenizers import Regex
from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
from transformers.tokenization_utils_base import generate_merges

import fixture_versions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("QLFT_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
OUT = os.path.join(ROOT, "tests", "reference", "fixtures", "tokenizer")
SEP = "\n__ggml_vocab_test__\n"
N_STORIES = 6
SPACE = "\u2581"


def read_vocab(path):
    r = gguf.GGUFReader(path)

    def get(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [f.parts[i][0].item() for i in f.data]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode("utf-8")
        return f.parts[f.data[0]][0].item()

    return {k: get("tokenizer.ggml." + k) for k in (
        "model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id",
        "eos_token_id", "unknown_token_id", "add_bos_token", "add_eos_token")}


def specials(v):
    types = v["token_type"] or [1] * len(v["tokens"])
    return [i for i, t in enumerate(types) if t in (2, 3)]  # UNKNOWN, CONTROL


def build(v):
    tokens = v["tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate token spellings"
    if v["model"] == "llama":
        merges = generate_merges(vocab, dict(zip(tokens, v["scores"])))
        unk = tokens[v["unknown_token_id"] if v["unknown_token_id"] is not None else 0]
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                                  byte_fallback=True))
        tk.normalizer = normalizers.Sequence(
            [normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
        tk.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                        decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    elif v["model"] == "gpt2":
        assert v["pre"] in (None, "gpt-2", "default"), v["pre"]
        merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tk.decoder = decoders.ByteLevel()
    else:
        raise ValueError(v["model"])
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i in specials(v)])
    bos = v["bos_token_id"]
    if v["model"] == "llama" and bos is not None:
        tk.post_processor = TemplateProcessing(single=f"{tokens[bos]} $A",
                                               special_tokens=[(tokens[bos], bos)])
    return tk


# Extra inputs for the pre-tokenizer variants: contractions in both cases, digit runs, \r\n.
EXTRA = [
    "I'VE got 12345 apples\r\n\r\n  and 3.14159!!\n\tTab's here",
    "HELLO'S world's 1234567890 don'T WE'LL they'Re",
    "  leading spaces, trailing spaces   ",
    "mixed\u00a0nbsp and \u3000ideographic space, caf\u00e9 na\u00efve \u0660\u0661\u0662",
    "emoji \U0001F600\U0001F600 ... ??? !!! $$$ 100% #hashtag @user",
]


# llama.cpp's multi-regex pre-tokenizers (src/llama-vocab.cpp), run in sequence, each splitting
# the pieces of the one before, as a Sequence of isolated Splits does. Spelled with \x{...}
# escapes; "\s+$" (std::regex: end of the piece) as "\s+\z".
DEEPSEEK_CJK = r"[\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]+"
MULTI_REGEX = {
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+",
               r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
               r"[0-9][0-9][0-9]"],
    "deepseek-llm": [
        "[\r\n]",
        r"\s?[A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}\x{1c4}-\x{293}"
        r"\x{295}-\x{2af}\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}\x{37f}\x{386}\x{388}-\x{38a}"
        r"\x{38c}\x{38e}-\x{3a1}\x{3a3}-\x{3f5}\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556}"
        r"\x{10a0}-\x{10c5}\x{13a0}-\x{13f5}\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf}"
        r"\x{1d00}-\x{1d2b}\x{1d6b}-\x{1d77}\x{1d79}-\x{1d9a}\x{1e00}-\x{1f15}\x{1f18}-\x{1f1d}"
        r"\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-\x{1f57}\x{1f59}\x{1f5b}\x{1f5d}\x{1f5f}-\x{1f7d}"
        r"\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe}\x{1fc2}-\x{1fc4}\x{1fc6}-\x{1fcc}\x{1fd0}-\x{1fd3}"
        r"\x{1fd6}-\x{1fdb}\x{1fe0}-\x{1fec}\x{1ff2}-\x{1ff4}\x{1ff6}-\x{1ffc}\x{2102}\x{2107}"
        r"\x{210a}-\x{2113}\x{2115}\x{2119}-\x{211d}\x{2124}\x{2126}\x{2128}\x{212a}-\x{212d}"
        r"\x{212f}-\x{2134}\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149}\x{214e}\x{2183}\x{2184}"
        r"\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4}\x{2ceb}-\x{2cee}\x{2cf2}\x{2cf3}\x{a640}-\x{a66d}"
        r"\x{a680}-\x{a69b}\x{a722}-\x{a76f}\x{a771}-\x{a787}\x{a78b}-\x{a78e}\x{ab70}-\x{abbf}"
        r"\x{fb00}-\x{fb06}\x{fb13}-\x{fb17}\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}\x{10400}-\x{1044f}"
        r"\x{104b0}-\x{104d3}\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2}"
        r"\x{118a0}-\x{118df}\x{1e900}-\x{1e943}]+",
        r"\s?[!-/:-~\x{ff01}-\x{ff0f}\x{ff1a}-\x{ff5e}\x{2018}-\x{201f}\x{3000}-\x{3002}]+",
        r"\s+\z", DEEPSEEK_CJK, r"\p{N}+"],
    "deepseek-v3": [
        r"\p{N}{1,3}", r"[\x{4e00}-\x{9fa5}\x{3040}-\x{309f}\x{30a0}-\x{30ff}]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
        r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""],
}


def build_pre_variant(v, pre):
    """The GPT-2 vocabulary and merges with another llama.cpp pre-tokenizer, spelled the way
    that model family's tokenizer.json spells it."""
    tokens = v["tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=(pre == "llama3")))
    if pre in MULTI_REGEX:
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in MULTI_REGEX[pre]] +
            [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(GGUF_PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i in specials(v)])
    return tk


def build_metaspace(v):
    """A SentencePiece vocabulary the newer way: Metaspace(prepend_scheme="first") instead of
    the Prepend/Replace normalizer (no extra "▁" before text that starts with a space)."""
    tk = build(v)
    tk.normalizer = None
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first",
                                                split=False)
    tk.decoder = decoders.Sequence([
        decoders.ByteFallback(),
        decoders.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)])
    return tk


def config(v):
    t = v["tokens"]
    name = lambda k: t[v[k]] if v[k] is not None and 0 <= v[k] < len(t) else None
    add_bos = v["add_bos_token"] if v["add_bos_token"] is not None else v["model"] == "llama"
    return {"bos_token": name("bos_token_id"), "eos_token": name("eos_token_id"),
            "unk_token": name("unknown_token_id"), "add_bos_token": bool(add_bos),
            "add_eos_token": bool(v["add_eos_token"] or False)}


def words(tk, texts):
    """The strings BPE runs on: normalized text (SentencePiece) or byte-level pieces."""
    out = []
    for t in texts:
        s = tk.normalizer.normalize_str(t) if tk.normalizer is not None else t
        if tk.pre_tokenizer is not None:
            out.extend(p for p, _ in tk.pre_tokenizer.pre_tokenize_str(s))
        else:
            out.append(s)
    return out


def cut_down(tk, v, texts):
    d = json.loads(tk.to_str())
    model = d["model"]
    joined = "\x00".join(words(tk, texts))
    keep = set(specials(v))
    byte_level = v["model"] == "gpt2"
    for tok, i in model["vocab"].items():
        if tok in joined or (byte_level and len(tok) == 1) or (
                not byte_level and v["token_type"][i] == 6):
            keep.add(i)
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i in keep}
    merges = []
    for m in model["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a + b in model["vocab"]:
            merges.append(m)
    model["merges"] = merges
    return d


def ids_of(tk, texts):
    return [tk.encode(t, add_special_tokens=False).ids for t in texts]


def fnv1a(ids):
    """FNV-1a 64 over the ids as little-endian uint32 (the test hashes the same way)."""
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def shakespeare(tk):
    """Count and hash of the ids for all of data/tinyshakespeare.txt in one encode() call."""
    with open(os.path.join(SHARED, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        ids = tk.encode(f.read(), add_special_tokens=False).ids
    return {"count": len(ids), "fnv1a64": fnv1a(ids)}


def write_json(path, obj, compact=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        if compact:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        else:
            json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def vector_inputs(name):
    with open(os.path.join(SHARED, "tokenizer-vectors", f"ggml-vocab-{name}.gguf.inp"),
              encoding="utf-8", newline="") as f:
        raw = f.read()
    return raw.split(SEP)[:-1]


def vector_expected(name):
    with open(os.path.join(SHARED, "tokenizer-vectors", f"ggml-vocab-{name}.gguf.out"),
              encoding="utf-8") as f:
        return [[int(x) for x in line.split()] for line in f.read().split("\n")]


def stories():
    with open(os.path.join(SHARED, "data", "tinystories-sample.txt"), encoding="utf-8") as f:
        parts = f.read().split("<|endoftext|>")
    return [p.strip() for p in parts if p.strip()][:N_STORIES]


def main():
    expected = {}
    for name in ("llama-spm", "gpt-2"):
        v = read_vocab(os.path.join(SHARED, "tokenizer-vectors", f"ggml-vocab-{name}.gguf"))
        texts = vector_inputs(name)
        tk = build(v)
        ids = ids_of(tk, texts)
        want = vector_expected(name)
        bad = [i for i, (a, b) in enumerate(zip(ids, want)) if a != b]
        print(f"{name}: {len(texts)} inputs, {len(bad)} differ from llama.cpp's .out: {bad}")
        small = cut_down(tk, v, texts)
        small_tk = Tokenizer.from_str(json.dumps(small))
        assert ids_of(small_tk, texts) == ids, f"{name}: cut-down tokenizer differs"
        print(f"  cut down to {len(small['model']['vocab'])} tokens, "
              f"{len(small['model']['merges'])} merges")
        write_json(os.path.join(OUT, name, "tokenizer.json"), small, compact=True)
        write_json(os.path.join(OUT, name, "tokenizer_config.json"), config(v))
        expected[name] = {"inputs": f"tokenizer-vectors/ggml-vocab-{name}.gguf.inp",
                          "ids": ids, "tinyshakespeare": shakespeare(tk)}

    gpt2 = read_vocab(os.path.join(SHARED, "tokenizer-vectors", "ggml-vocab-gpt-2.gguf"))
    texts = vector_inputs("gpt-2") + EXTRA
    for pre in ("llama3", "qwen2", "smollm", "falcon", "deepseek-llm", "deepseek-v3"):
        tk = build_pre_variant(gpt2, pre)
        ids = ids_of(tk, texts)
        small = cut_down(tk, gpt2, texts)
        assert ids_of(Tokenizer.from_str(json.dumps(small)), texts) == ids, pre
        name = f"gpt-2-{pre}"
        write_json(os.path.join(OUT, name, "tokenizer.json"), small, compact=True)
        expected[name] = {"inputs": "tokenizer-vectors/ggml-vocab-gpt-2.gguf.inp + extra",
                          "pre": pre, "ids": ids}
        print(f"{name}: cut down to {len(small['model']['vocab'])} tokens")
    expected["extra_inputs"] = EXTRA

    v = read_vocab(os.path.join(SHARED, "models", "stories260K.gguf"))
    tk = build_metaspace(v)
    texts = vector_inputs("llama-spm") + EXTRA
    ids = ids_of(tk, texts)
    write_json(os.path.join(OUT, "stories260k-metaspace", "tokenizer.json"),
               json.loads(tk.to_str()), compact=True)
    expected["stories260k-metaspace"] = {
        "inputs": "tokenizer-vectors/ggml-vocab-llama-spm.gguf.inp + extra", "ids": ids,
        "decoded": [tk.decode(i) for i in ids]}

    tk = build(v)
    write_json(os.path.join(OUT, "stories260k", "tokenizer.json"), json.loads(tk.to_str()),
               compact=True)
    write_json(os.path.join(OUT, "stories260k", "tokenizer_config.json"), config(v))
    st = stories()
    expected["stories260k"] = {
        "inputs": "tokenizer-vectors/ggml-vocab-llama-spm.gguf.inp",
        "ids": ids_of(tk, vector_inputs("llama-spm")),
        "stories": f"data/tinystories-sample.txt, first {N_STORIES} stories split on "
                   "<|endoftext|>, stripped",
        "n_stories": N_STORIES,
        "story_ids": ids_of(tk, st),
        "tinyshakespeare": shakespeare(tk),
    }
    write_json(os.path.join(OUT, "expected_ids.json"), expected, compact=True)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT} ({total / 1024:.0f} KiB)")
    tv = os.path.join(SHARED, "tokenizer-vectors")
    fixture_versions.write(OUT, __file__, inputs=[
        *(os.path.join(tv, f"ggml-vocab-{n}.gguf{x}") for n in ("llama-spm", "gpt-2")
          for x in ("", ".inp", ".out")),
        os.path.join(SHARED, "models", "stories260K.gguf"),
        os.path.join(SHARED, "data", "tinyshakespeare.txt"),
        os.path.join(SHARED, "data", "tinystories-sample.txt")])


if __name__ == "__main__":
    sys.exit(main())
