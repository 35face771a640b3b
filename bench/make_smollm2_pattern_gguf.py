#!/usr/bin/env python3
"""The SmolLM2-135M-Instruct Q4_1 GGUF with its tensor bytes replaced by a repeated pattern.

For the CPU benchmark on a lent machine's host (scripts/cpu_check.sh): the 98 MB GGUF cannot
travel there (64 MiB per call) and compresses poorly, while tokens/s, FLOPs and memory depend on
the shapes and block types, not on the values. The output keeps the real file's header, metadata
and tokenizer byte for byte and every tensor's type, shape and offset; each tensor's data becomes
valid blocks cut from one short seeded random pattern (Q4_1: scale 0.01, min -0.08, random 4-bit
codes; Q8_0: scale 0.0005, random int8 codes; F32: 1.0), so `xz -9` packs it into a few MB.

  python3 bench/make_smollm2_pattern_gguf.py IN.gguf OUT.gguf   (needs the gguf package)
"""
import sys

import numpy as np
from gguf import GGUFReader


def pattern(kind, n_bytes, rng):
    if kind == "F32":
        return np.ones(n_bytes // 4, dtype="<f4").tobytes()
    if kind == "Q4_1":  # f16 d, f16 m, 16 bytes of codes per 32 elements
        head, codes = np.array([0.01, -0.08], dtype="<f2").tobytes(), 16
    elif kind == "Q8_0":  # f16 d, 32 int8 codes
        head, codes = np.array([0.0005], dtype="<f2").tobytes(), 32
    else:
        raise SystemExit(f"make_smollm2_pattern_gguf: tensor type {kind} not handled")
    block = len(head) + codes
    # 1024 distinct blocks, repeated: short enough for xz's window, long enough that no GEMM
    # sees a trivially repeating row.
    blocks = b"".join(head + rng.integers(0, 256, codes, dtype=np.uint8).tobytes()
                      for _ in range(1024))
    n_blocks = n_bytes // block
    reps = -(-n_blocks // 1024)
    return (blocks * reps)[: n_blocks * block]


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    reader = GGUFReader(src)
    data = bytearray(open(src, "rb").read())
    rng = np.random.default_rng(0)
    for t in reader.tensors:
        b = pattern(t.tensor_type.name, int(t.n_bytes), rng)
        assert len(b) == t.n_bytes, t.name
        data[t.data_offset: t.data_offset + t.n_bytes] = b
    with open(dst, "wb") as f:
        f.write(data)
    print(f"wrote {dst}: {len(reader.tensors)} tensors, {len(data)} bytes")


if __name__ == "__main__":
    main()
