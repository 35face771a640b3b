#!/usr/bin/env python3
"""Reference fixtures for the GGUF and safetensors readers, written by the reference libraries.

    /opt/qlft-ref/bin/python tests/reference/gen_formats_fixtures.py          # writes fixtures
    /opt/qlft-ref/bin/python tests/reference/gen_formats_fixtures.py --check DIR
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)

Outputs (tests/reference/fixtures/formats/):
  all_types.gguf / all_types.json   every GGUF metadata value type (scalars, arrays of each,
                                    string arrays, a nested array), alignment 64, tensors of
                                    F32/F16/BF16/Q8_0/I32 with 1..4 dims; the JSON holds what
                                    the `gguf` package wrote and reads back.
  sharded/                          two safetensors shards + model.safetensors.index.json
  sharded.json                      per tensor: shard, dtype, shape, values (as float64)
  stories260K.json                  tensor table and key metadata of shared/models/stories260K.gguf
                                    (only when that file is present)

--check DIR loads the files the C++ writer tests leave in DIR (QLFT_WRITER_OUT) with the `gguf`
and `safetensors` packages and checks them against the values those tests write (the same
formulas as below).
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "formats")
SHARED = os.environ.get("QLFT_SHARED_DIR", os.path.join(HERE, "..", "..", "..", "shared"))


def gguf_fixture():
    import gguf
    from gguf import GGUFValueType as T

    path = os.path.join(OUT, "all_types.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_custom_alignment(64)
    scalars = [
        ("t.u8", 200, T.UINT8, "u8"),
        ("t.i8", -100, T.INT8, "i8"),
        ("t.u16", 60000, T.UINT16, "u16"),
        ("t.i16", -30000, T.INT16, "i16"),
        ("t.u32", 4000000000, T.UINT32, "u32"),
        ("t.i32", -2000000000, T.INT32, "i32"),
        ("t.f32", 3.14159, T.FLOAT32, "f32"),
        ("t.bool_true", True, T.BOOL, "bool"),
        ("t.bool_false", False, T.BOOL, "bool"),
        ("t.u64", 2**63 + 5, T.UINT64, "u64"),
        ("t.i64", -(2**62) - 3, T.INT64, "i64"),
        ("t.f64", -1.5e300, T.FLOAT64, "f64"),
        ("t.string", "h\u00e9llo \u2713 GGUF", T.STRING, "string"),
        ("t.empty_string", "", T.STRING, "string"),
    ]
    meta = {"general.architecture": {"type": "string", "value": "llama"},
            "general.alignment": {"type": "u32", "value": 64}}
    for key, val, vt, name in scalars:
        w.add_key_value(key, val, vt)
        if vt == T.FLOAT32:
            val = float(np.float32(val))
        meta[key] = {"type": name, "value": val}
    arrays = [
        ("a.u8", [0, 1, 255], T.UINT8, "u8"),
        ("a.i8", [-128, 0, 127], T.INT8, "i8"),
        ("a.u16", [0, 65535], T.UINT16, "u16"),
        ("a.i16", [-32768, 32767], T.INT16, "i16"),
        ("a.u32", [1, 4294967295], T.UINT32, "u32"),
        ("a.i32", [-7, 0, 7, 2147483647], T.INT32, "i32"),
        ("a.f32", [0.5, -2.25, 1e-30, 3.0e38], T.FLOAT32, "f32"),
        ("a.bool", [True, False, True], T.BOOL, "bool"),
        ("a.u64", [2**64 - 1, 3], T.UINT64, "u64"),
        ("a.i64", [-(2**63), 2**63 - 1], T.INT64, "i64"),
        ("a.f64", [1e-300, -0.1], T.FLOAT64, "f64"),
        ("a.string", ["", "a", "\u00fc\u00f1\u00ee", "<s>"], T.STRING, "string"),
    ]
    for key, val, st, name in arrays:
        w.add_key_value(key, val, T.ARRAY, sub_type=st)
        if st == T.FLOAT32:
            val = [float(np.float32(v)) for v in val]
        meta[key] = {"type": "array", "elem": name, "value": val}
    w.add_key_value("a.nested", [[1, 2], [3]], T.ARRAY, sub_type=T.ARRAY)
    meta["a.nested"] = {"type": "array", "elem": "array", "count": 2}
    w.add_key_value("z.after_nested", 77, T.UINT32)
    meta["z.after_nested"] = {"type": "u32", "value": 77}

    rng = np.random.RandomState(0)
    tensors = {}
    f32 = (rng.randn(2, 3) * 2).astype(np.float32)
    w.add_tensor("t.f32", f32)
    tensors["t.f32"] = (f32, gguf.GGMLQuantizationType.F32, f32)
    f16 = rng.randn(4).astype(np.float16)
    w.add_tensor("t.f16", f16)
    tensors["t.f16"] = (f16, gguf.GGMLQuantizationType.F16, f16.astype(np.float32))
    bf_src = rng.randn(2, 8).astype(np.float32)
    bf16 = (bf_src.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for a fixture
    w.add_tensor("t.bf16", bf16, raw_shape=(2, 8), raw_dtype=gguf.GGMLQuantizationType.BF16)
    tensors["t.bf16"] = (bf16, gguf.GGMLQuantizationType.BF16,
                         (bf16.astype(np.uint32) << 16).view(np.float32))
    q_src = rng.randn(2, 64).astype(np.float32)
    q8 = gguf.quants.quantize(q_src, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("t.q8_0", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    tensors["t.q8_0"] = (q8, gguf.GGMLQuantizationType.Q8_0,
                         gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0))
    i32 = np.array([1, -2, 300], dtype=np.int32)
    w.add_tensor("t.i32", i32)
    tensors["t.i32"] = (i32, gguf.GGMLQuantizationType.I32, i32.astype(np.float32))
    t3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 5
    w.add_tensor("t.3d", t3)
    tensors["t.3d"] = (t3, gguf.GGMLQuantizationType.F32, t3)
    t4 = np.arange(6, dtype=np.float32).reshape(1, 2, 1, 3) * 0.5
    w.add_tensor("t.4d", t4)
    tensors["t.4d"] = (t4, gguf.GGMLQuantizationType.F32, t4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # Read back with the reference reader: offsets and shapes as it sees them.
    r = gguf.GGUFReader(path)
    out_t = []
    for t in r.tensors:
        raw, qt, vals = tensors[t.name]
        assert t.tensor_type == qt
        out_t.append({
            "name": t.name,
            "ne": [int(x) for x in t.shape],  # GGUFReader's shape is GGUF order (ne[0] first)
            "type": int(qt),
            "offset": int(t.data_offset - r.data_offset),
            "nbytes": int(t.n_bytes),
            "hex": np.ascontiguousarray(raw).tobytes().hex(),
            "values": [float(v) for v in np.asarray(vals, dtype=np.float64).ravel()],
        })
    assert r.alignment == 64
    with open(os.path.join(OUT, "all_types.json"), "w") as f:
        json.dump({"version": 3, "alignment": 64, "data_offset": int(r.data_offset),
                   "n_kv": len(r.fields) - 3, "metadata": meta, "tensors": out_t}, f, indent=1,
                  ensure_ascii=False)


def safetensors_fixture():
    import torch
    from safetensors.torch import save_file

    d = os.path.join(OUT, "sharded")
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    shard1 = {
        "model.embed_tokens.weight": torch.randn(4, 3, generator=g),
        "a.bf16": torch.randn(2, 5, generator=g).to(torch.bfloat16),
        "b.f16": torch.randn(3, generator=g).to(torch.float16),
        "s.scalar": torch.tensor(2.5),
        "z.empty": torch.zeros(0, 3),
    }
    shard2 = {
        "c.i64": torch.tensor([[1, -2], [2**40, 7]], dtype=torch.int64),
        "d.u8": torch.tensor([0, 1, 2, 254, 255], dtype=torch.uint8),
        "e.bool": torch.tensor([True, False, True]),
        "f.f64": torch.tensor([1e-300, -3.5], dtype=torch.float64),
        "g.i32": torch.tensor([5, -6, 7], dtype=torch.int32),
        "h.i8": torch.tensor([-128, -1, 0, 127], dtype=torch.int8),
        "i.i16": torch.tensor([-32768, 32767], dtype=torch.int16),
    }
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    meta = {"format": "pt", "note": "qlft fixture"}
    save_file(shard1, os.path.join(d, names[0]), metadata=meta)
    save_file(shard2, os.path.join(d, names[1]), metadata=meta)
    wm, dump, total = {}, {}, 0
    dtn = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
           torch.int64: "I64", torch.uint8: "U8", torch.bool: "BOOL", torch.float64: "F64",
           torch.int32: "I32", torch.int8: "I8", torch.int16: "I16"}
    for name_file, shard in zip(names, (shard1, shard2)):
        for k, v in shard.items():
            wm[k] = name_file
            total += v.numel() * v.element_size()
            dump[k] = {"file": name_file, "dtype": dtn[v.dtype], "shape": list(v.shape),
                       "values": [float(x) for x in v.to(torch.float64).flatten().tolist()]}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    with open(os.path.join(OUT, "sharded.json"), "w") as f:
        json.dump({"metadata": meta, "tensors": dump}, f, indent=1)


def stories_fixture():
    import gguf
    p = os.path.join(SHARED, "models", "stories260K.gguf")
    if not os.path.exists(p):
        print("skipping stories260K.json: no", p)
        return
    r = gguf.GGUFReader(p)
    ts = []
    for t in r.tensors:
        v = np.asarray(t.data, dtype=np.float64)
        ts.append({"name": t.name, "ne": [int(x) for x in t.shape], "type": int(t.tensor_type),
                   "nbytes": int(t.n_bytes), "offset": int(t.data_offset - r.data_offset),
                   "sum": float(v.sum()), "first": [float(x) for x in v.ravel()[:4]]})
    keys = {}
    for k in ["llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
              "llama.attention.head_count", "llama.attention.head_count_kv",
              "llama.context_length"]:
        keys[k] = int(r.fields[k].contents())
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    with open(os.path.join(OUT, "stories260K.json"), "w") as f:
        json.dump({"n_kv": len(r.fields) - 3, "keys": keys, "n_tokens": len(tokens),
                   "tokens_head": tokens[:8], "tensors": ts}, f, indent=1)


# ---- --check: files written by the C++ writers (see tests/unit/test_gguf_writer.cpp) ---------

def writer_values(n, scale, offset):
    return (np.arange(n, dtype=np.float32) * np.float32(scale) + np.float32(offset)).astype(np.float32)


def check(d):
    import gguf
    from safetensors import safe_open

    r = gguf.GGUFReader(os.path.join(d, "writer.gguf"))
    f = {k: v.contents() for k, v in r.fields.items()}
    assert f["general.alignment"] == 64, f["general.alignment"]
    assert f["w.u8"] == 7 and f["w.i8"] == -7 and f["w.u16"] == 65000 and f["w.i16"] == -3
    assert f["w.u32"] == 4000000001 and f["w.i32"] == -5 and f["w.u64"] == 2**64 - 2
    assert f["w.i64"] == -(2**63) + 1 and abs(f["w.f32"] - 0.125) == 0 and f["w.f64"] == 1e300
    assert f["w.bool"] is True and f["w.string"] == "qlft \u2713"
    assert f["w.arr_i32"] == [1, -2, 3] and f["w.arr_f32"] == [0.5, 1.5]
    assert f["w.arr_str"] == ["a", "", "bc"], f["w.arr_str"]
    t = {x.name: x for x in r.tensors}
    a = np.asarray(t["w.f32"].data, dtype=np.float32).ravel()
    assert np.array_equal(a, writer_values(12, 0.5, -3)), a
    assert list(t["w.f32"].shape) == [4, 3]
    h = np.asarray(t["w.f16"].data).ravel().astype(np.float32)
    assert np.array_equal(h, writer_values(8, 0.25, 1).astype(np.float16).astype(np.float32)), h
    b = np.asarray(t["w.bf16"].data)
    assert t["w.bf16"].tensor_type == gguf.GGMLQuantizationType.BF16
    bf = (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32).ravel()
    assert np.array_equal(bf, writer_values(16, 0.125, -1)), bf
    q = t["w.q8_0"]
    deq = gguf.quants.dequantize(np.asarray(q.data), gguf.GGMLQuantizationType.Q8_0).ravel()
    assert np.array_equal(deq, np.repeat(np.float32(0.5), 64) * np.tile(
        np.arange(-32, 32, dtype=np.float32), 1)), deq[:8]
    print("writer.gguf: OK (%d keys, %d tensors)" % (len(r.fields), len(r.tensors)))

    with safe_open(os.path.join(d, "writer.safetensors"), "np") as s:
        assert s.metadata() == {"format": "pt", "who": "qlft"}, s.metadata()
        assert np.array_equal(s.get_tensor("w.f32"), writer_values(6, 1.5, 2).reshape(2, 3))
        assert np.array_equal(s.get_tensor("w.i8"), np.array([1, -2, 3], dtype=np.int8))
        assert np.array_equal(s.get_tensor("w.f16"),
                              writer_values(5, 0.5, 0).astype(np.float16).reshape(5))
        assert s.get_tensor("w.scalar").shape == ()
        keys = sorted(s.keys())
    import torch
    from safetensors.torch import load_file
    tt = load_file(os.path.join(d, "writer.safetensors"))
    assert torch.equal(tt["w.bf16"].float(), torch.tensor(writer_values(4, 0.25, -0.5)).reshape(2, 2))
    print("writer.safetensors: OK", keys)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
        sys.exit(0)
    os.makedirs(OUT, exist_ok=True)
    gguf_fixture()
    safetensors_fixture()
    stories_fixture()
    print("wrote", OUT)
    stories = os.path.join(SHARED, "models", "stories260K.gguf")
    import fixture_versions
    fixture_versions.write(OUT, __file__, inputs=[stories] if os.path.exists(stories) else [])
