#!/usr/bin/env python3
"""Throughput of the Hugging Face `tokenizers` package on the text bench/bench_tokenizer.cpp
encodes, with the same vocabularies as tokenizer.json (built from the GGUF files exactly as
gen_tokenizer_fixtures.py does; the full GPT-2 vocabulary, not the cut-down fixture).

    /opt/qlft-ref/bin/python tests/reference/bench_tokenizers_peer.py [--threads 1]
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)

Reports input bytes/s for the whole file in one encode() call and for encode_batch() over its
lines (RAYON_NUM_THREADS threads; 1 by default to compare with our single-threaded encoder).
"""
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--repeat", type=int, default=5)
args = parser.parse_args()
os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its pool
os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.threads > 1 else "false"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_tokenizer_fixtures as g  # noqa: E402

import tokenizers  # noqa: E402

with open(os.path.join(g.SHARED, "data", "tinyshakespeare.txt"), "rb") as f:
    raw = f.read()
text = raw.decode("utf-8")
lines = [l + "\n" for l in text.split("\n")]
if text.endswith("\n"):
    lines = lines[:-1]


def best(fn):
    times = []
    for _ in range(args.repeat):
        t0 = time.process_time() if args.threads == 1 else time.perf_counter()
        n = fn()
        t1 = time.process_time() if args.threads == 1 else time.perf_counter()
        times.append(t1 - t0)
    return min(times), n


print(f"tokenizers {tokenizers.__version__}, {len(raw)} bytes, threads={args.threads}, "
      f"{'CPU' if args.threads == 1 else 'wall'} time, best of {args.repeat}")
for name, path in (("stories260K (SPM-style BPE)", os.path.join(g.SHARED, "models", "stories260K.gguf")),
                   ("gpt-2 (byte-level BPE)",
                    os.path.join(g.SHARED, "tokenizer-vectors", "ggml-vocab-gpt-2.gguf"))):
    tk = g.build(g.read_vocab(path))
    t, n = best(lambda: len(tk.encode(text, add_special_tokens=False).ids))
    print(f"{name:30s} whole text : {len(raw) / t / 1e6:7.2f} MB/s  ({n} tokens, {t * 1e3:.0f} ms)")
    t, n = best(lambda: sum(len(e.ids) for e in tk.encode_batch(lines, add_special_tokens=False)))
    print(f"{name:30s} batch/lines: {len(raw) / t / 1e6:7.2f} MB/s  ({n} tokens, {t * 1e3:.0f} ms)")
