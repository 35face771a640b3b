#!/usr/bin/env python3
"""Reference fixtures for src/quant (NF4, blockwise 8-bit, INT8, GGUF blocks, bnb serialization).

Run with the reference venv:  /opt/qlft-ref/bin/python tests/reference/gen_quant_fixtures.py
(The reference venv /opt/qlft-ref: `bash scripts/setup-reference.sh` creates it.)
Every expected value comes from the real peer: bitsandbytes 0.50.2 on CPU (quantize_4bit,
quantize_blockwise, create_dynamic_map, int8_vectorwise_quant, Linear4bit state dicts), torch
(mean) and gguf-py (quants.quantize / quants.dequantize). Outputs are safetensors files under
tests/reference/fixtures/quant/, read back by tests/unit/test_quant_*.cpp.
"""
import json
import os

import numpy as np
import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from safetensors.torch import save_file
from safetensors.numpy import save_file as save_np
from gguf import quants, GGMLQuantizationType as T

import fixture_versions

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "quant")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(1234)
rng = np.random.default_rng(1234)


def nf4_midpoints():
    code = F.get_4bit_type("nf4", device="cpu")
    return (code[:-1] + code[1:]) / 2


def _dequantize_4bit_ref(packed, absmax, blocksize, n):
    """bitsandbytes backends/default _dequantize_4bit_compute, without torch.compile."""
    code = F.get_4bit_type("nf4", device="cpu")
    q = torch.empty(packed.numel() * 2, dtype=torch.int64)
    q[0::2] = (packed >> 4).long()
    q[1::2] = (packed & 0xF).long()
    vals = code[q][:n]
    scale = absmax.float().repeat_interleave(blocksize)[:n]
    return vals * scale


# ---- NF4 (quantize_4bit / dequantize_4bit), with and without double quantization ----
def nf4_cases():
    cases = []
    # 1-D, 1000 elements: not a multiple of 64, an all-zero block, a crafted block whose values
    # sit exactly on the NF4 decision midpoints (tie behaviour), a partial last block.
    a = torch.randn(1000)
    a[128:192] = 0
    mids = nf4_midpoints()
    blk = torch.zeros(64)
    blk[0] = 1.0
    blk[1:16] = mids
    blk[16:31] = -mids
    a[192:256] = blk
    cases.append(("v1000_bs64", a, 64, False))
    cases.append(("v1000_bs64_dq", a, 64, True))
    # odd element count (packing pads a zero nibble), all-zero partial last block
    b = torch.randn(999) * 0.02
    b[960:] = 0
    cases.append(("v999_bs64", b, 64, False))
    # matrices whose rows do not start on block boundaries
    c = torch.randn(12, 172)
    c[3, 20:100] = 0
    cases.append(("m12x172_bs64_dq", c, 64, True))
    cases.append(("m12x172_bs128", c, 128, False))
    # more than one nested block of 256 absmax values (280 blocks -> 2 nested, last partial)
    d = torch.randn(40, 448) * torch.linspace(0.01, 3.0, 448)
    cases.append(("m40x448_bs64_dq", d, 64, True))
    e = torch.randn(16, 96)
    cases.append(("m16x96_bs32_dq", e, 32, True))
    cases.append(("m16x96_bs256", e, 256, False))
    return cases


def gen_nf4():
    tensors, meta = {}, {}
    names = []
    for name, x, bs, dq in nf4_cases():
        packed, st = F.quantize_4bit(x.clone(), blocksize=bs, quant_type="nf4", compress_statistics=dq)
        deq = F.dequantize_4bit(packed, st)
        # bitsandbytes 0.50.2's native CPU dequantize_4bit kernel picks the wrong absmax when a
        # block straddles two rows and the row length is a multiple of 32 (e.g. [16, 96] with
        # blocksize 256, [40, 96] with 64: its vectorized path assumes blocks lie within rows);
        # its own reference implementation (backends/default), the CUDA kernels and
        # quantize_4bit all run blocks over the flattened tensor. Expect that.
        absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset if dq else st.absmax
        ref = _dequantize_4bit_ref(packed.reshape(-1), absmax, bs, x.numel())
        native_ok = bool(torch.equal(ref, deq.reshape(-1).float()))
        deq = ref
        names.append(name)
        meta[name] = json.dumps({"blocksize": bs, "double_quant": dq, "shape": list(x.shape),
                                 "bnb_native_cpu_dequant_agrees": native_ok})
        tensors[f"{name}.input"] = x.clone().contiguous()
        tensors[f"{name}.packed"] = packed.reshape(-1).contiguous()
        tensors[f"{name}.dequant"] = deq.reshape(-1).float().contiguous()
        if dq:
            tensors[f"{name}.absmax_codes"] = st.absmax.contiguous()
            tensors[f"{name}.nested_absmax"] = st.state2.absmax.contiguous()
            tensors[f"{name}.nested_code"] = st.state2.code.contiguous()
            tensors[f"{name}.offset"] = st.offset.reshape(1).float().contiguous()
        else:
            tensors[f"{name}.absmax"] = st.absmax.contiguous()
    tensors["nf4_code"] = F.get_4bit_type("nf4", device="cpu").contiguous()
    meta["cases"] = json.dumps(names)
    save_file(tensors, os.path.join(OUT, "nf4.safetensors"), metadata=meta)


# ---- blockwise 8-bit (dynamic map, quantize_blockwise / dequantize_blockwise) and torch mean ----
def gen_blockwise8():
    tensors, meta = {}, {}
    tensors["map_signed"] = F.create_dynamic_map(signed=True)
    tensors["map_unsigned"] = F.create_dynamic_map(signed=False)
    names = []
    for name, x, bs in [
        ("v3000_bs256", torch.randn(3000) * 5, 256),
        ("v700_bs64", torch.randn(700).abs() * 0.001, 64),
        ("v1000_bs256_zero", torch.cat([torch.zeros(256), torch.randn(744)]), 256),
    ]:
        q, st = F.quantize_blockwise(x.clone(), code=F.create_dynamic_map(signed=True), blocksize=bs)
        deq = F.dequantize_blockwise(q, st)
        names.append(name)
        meta[name] = json.dumps({"blocksize": bs, "signed": True})
        tensors[f"{name}.input"] = x
        tensors[f"{name}.codes"] = q
        tensors[f"{name}.absmax"] = st.absmax
        tensors[f"{name}.dequant"] = deq
    # unsigned map (8-bit AdamW second moment)
    x = torch.randn(1100).abs() * 3
    q, st = F.quantize_blockwise(x.clone(), code=F.create_dynamic_map(signed=False), blocksize=256)
    names.append("u1100_bs256")
    meta["u1100_bs256"] = json.dumps({"blocksize": 256, "signed": False})
    tensors["u1100_bs256.input"] = x
    tensors["u1100_bs256.codes"] = q
    tensors["u1100_bs256.absmax"] = st.absmax
    tensors["u1100_bs256.dequant"] = F.dequantize_blockwise(q, st)
    meta["cases"] = json.dumps(names)
    # torch.mean of float32 vectors (single-threaded: the double-quant offset)
    torch.set_num_threads(1)
    sizes = [1, 3, 15, 16, 17, 63, 64, 65, 100, 255, 256, 257, 1000, 1023, 4097, 5000, 33000]
    vals, means = [], []
    for n in sizes:
        v = torch.rand(n) * torch.rand(1) * 10
        vals.append(v)
        means.append(v.mean())
    tensors["mean.values"] = torch.cat(vals)
    tensors["mean.results"] = torch.stack(means)
    meta["mean.sizes"] = json.dumps(sizes)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "blockwise8.safetensors"),
              metadata=meta)


# ---- INT8 row-wise absmax (LLM.int8 storage) ----
def gen_int8():
    x = torch.randn(9, 100)
    x[4] = 0  # zero row
    x[5] = torch.randint(-127, 128, (100,)).float() + 0.5  # many exact .5 ties after scaling
    x[5, 0] = 127.0
    x[6] *= 1e-3
    cb, scb, _ = F.int8_vectorwise_quant(x.clone())
    deq = F.int8_vectorwise_dequant(cb, scb)
    save_file({"input": x, "codes": cb, "scb": scb, "dequant": deq.float()},
              os.path.join(OUT, "int8.safetensors"))


# ---- GGUF block types: bytes and gguf-py's dequantization ----
def gguf_f16_scale(n, lo=-8, hi=-2):
    return (rng.uniform(0.5, 1.0, n) * 2.0 ** rng.integers(lo, hi, n)).astype(np.float16)


def gen_gguf():
    out, meta = {}, {}
    n = 1024
    x = (rng.standard_normal(n) * 0.7).astype(np.float32)
    x[:32] = 0  # a zero block for the simple types
    for t in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1]:
        raw = quants.quantize(x.reshape(4, 256), t)
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        out[f"{t.name}.raw"] = raw
        out[f"{t.name}.expected"] = quants.dequantize(raw, t).reshape(-1).astype(np.float32)
        meta[t.name] = str(int(t))
    # F64: plain doubles
    d = rng.standard_normal(n)
    out["F64.raw"] = d.view(np.uint8)
    out["F64.expected"] = d.astype(np.float32)
    meta["F64"] = str(int(T.F64))
    # K-quants: gguf-py only dequantizes them, so random bytes with finite, sane f16 scales.
    for t in [T.Q4_K, T.Q5_K, T.Q6_K]:
        bs, ts = quants.GGML_QUANT_SIZES[t]
        nb = n // bs
        raw = rng.integers(0, 256, (nb, ts), dtype=np.uint8)
        if t in (T.Q4_K, T.Q5_K):
            raw[:, 0:2] = gguf_f16_scale(nb).view(np.uint8).reshape(nb, 2)
            raw[:, 2:4] = gguf_f16_scale(nb).view(np.uint8).reshape(nb, 2)
        else:
            raw[:, ts - 2:ts] = gguf_f16_scale(nb).view(np.uint8).reshape(nb, 2)
        raw = raw.reshape(-1)
        out[f"{t.name}.raw"] = raw
        out[f"{t.name}.expected"] = quants.dequantize(raw, t).reshape(-1).astype(np.float32)
        meta[t.name] = str(int(t))
    meta["types"] = json.dumps(sorted(k for k in meta))
    save_np(out, os.path.join(OUT, "gguf_blocks.safetensors"), metadata=meta)


# ---- bitsandbytes serialization (as transformers save_pretrained writes it) ----
def gen_bnb():
    tensors = {}
    expect = {}
    for prefix, rows, cols, dq, bs in [
        ("model.layers.0.self_attn.q_proj", 24, 172, True, 64),
        ("model.layers.0.mlp.up_proj", 40, 96, False, 64),
    ]:
        w = torch.randn(rows, cols) * 0.05
        lin = bnb.nn.Linear4bit(cols, rows, bias=False, compress_statistics=dq, quant_type="nf4",
                                compute_dtype=torch.float32)
        lin.weight = bnb.nn.Params4bit(w.clone(), requires_grad=False, compress_statistics=dq,
                                       quant_type="nf4", blocksize=bs)
        lin = lin.to("cpu")
        for k, v in lin.state_dict().items():
            tensors[f"{prefix}.{k}"] = v.contiguous()
        qs = lin.weight.quant_state
        absmax = F.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset if dq else qs.absmax
        # reference dequantization (see gen_nf4 on the native CPU kernel's row-straddling bug)
        expect[f"{prefix}.expected"] = _dequantize_4bit_ref(lin.weight.data.reshape(-1), absmax, bs,
                                                            rows * cols).reshape(rows, cols)
    # INT8 (Linear8bitLt with has_fp16_weights=False stores weight=CB int8 and SCB)
    prefix = "model.layers.0.self_attn.o_proj"
    w = torch.randn(20, 64) * 0.1
    cb, scb, _ = F.int8_vectorwise_quant(w.clone())
    tensors[f"{prefix}.weight"] = cb.contiguous()
    tensors[f"{prefix}.SCB"] = scb.contiguous()
    expect[f"{prefix}.expected"] = F.int8_vectorwise_dequant(cb, scb).float()
    # a plain (not quantized) weight: load_bnb_weight must say "not mine"
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.randn(8, 16)
    save_file(tensors, os.path.join(OUT, "bnb_model.safetensors"), metadata={"format": "pt"})
    save_file({k: v.contiguous() for k, v in expect.items()}, os.path.join(OUT, "bnb_expected.safetensors"))


# ---- a whole tiny Llama quantized and saved by transformers (BitsAndBytesConfig, CPU) ----
def gen_transformers_models():
    import shutil
    import tempfile
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(77)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    tmp = tempfile.mkdtemp()
    LlamaForCausalLM(cfg).save_pretrained(tmp)
    variants = {
        "tiny_llama_nf4": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                             bnb_4bit_use_double_quant=True,
                                             bnb_4bit_compute_dtype=torch.float32),
        "tiny_llama_int8": BitsAndBytesConfig(load_in_8bit=True),
    }
    for name, qcfg in variants.items():
        try:
            model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=qcfg, device_map="cpu",
                                                         dtype=torch.float32)
        except Exception as e:  # the INT8 path may need a GPU in some versions
            print(f"skipping {name}: {e}")
            continue
        out_dir = os.path.join(OUT, name)
        shutil.rmtree(out_dir, ignore_errors=True)
        model.save_pretrained(out_dir)
        for extra in os.listdir(out_dir):
            if extra not in ("model.safetensors", "config.json"):
                os.remove(os.path.join(out_dir, extra))
        expect = {}
        for mod_name, mod in model.named_modules():
            if isinstance(mod, bnb.nn.Linear4bit):
                qs = mod.weight.quant_state
                absmax = F.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset if qs.nested else qs.absmax
                rows, cols = qs.shape
                expect[mod_name] = _dequantize_4bit_ref(mod.weight.data.reshape(-1), absmax, qs.blocksize,
                                                        rows * cols).reshape(rows, cols)
            elif isinstance(mod, bnb.nn.Linear8bitLt):
                w = mod.weight
                expect[mod_name] = F.int8_vectorwise_dequant(w.data, w.SCB).float()
        save_file({k: v.contiguous() for k, v in expect.items()}, os.path.join(OUT, f"{name}_expected.safetensors"))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    gen_nf4()
    gen_blockwise8()
    gen_int8()
    gen_gguf()
    gen_bnb()
    gen_transformers_models()
    fixture_versions.write(OUT, __file__)
    for f in sorted(os.listdir(OUT)):
        print(f, os.path.getsize(os.path.join(OUT, f)))
