#!/usr/bin/env python3
"""Summary of bench/e2e.sh: tokens/s, peak RSS, ratios, model FLOPs per token and MFU.

Model FLOPs per token (training, recomputation not counted), T = sequence length:
  every linear (7 projections per layer, and the LM head):   forward 2*in*out + input gradient
                                                              2*in*out = 4*in*out
  every LoRA adapter (r):                                    4*r*(in+out)  (forward + input
                                                              gradient; dA/dB not counted)
  causal attention per layer: forward QK^T and PV over (T+1)/2 keys on average
                              = 2*2*H*hd*(T+1)/2, backward (dQ, dK, dV, dP) twice that:
                              6*H*hd*(T+1)
MFU = FLOPs/token * tokens/s / measured bf16 GEMM peak (wall time), and the same with tokens per
CPU-second * threads (what the work reaches with every thread busy; robust to other load).
"""
import argparse
import json
import re


def time_v(path):
    """Peak RSS (bytes) and wall seconds from a /usr/bin/time -v report."""
    rss = wall = None
    try:
        with open(path) as f:
            for line in f:
                m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", line)
                if m:
                    rss = int(m.group(1)) * 1024
                m = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", line)
                if m:
                    h = int(m.group(1) or 0)
                    wall = h * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    except FileNotFoundError:
        pass
    return rss, wall


def model_shape(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    arch = r.fields["general.architecture"].contents()

    def g(k):
        return int(r.fields[f"{arch}.{k}"].contents())
    dim = g("embedding_length")
    heads = g("attention.head_count")
    kv = g("attention.head_count_kv")
    hd = dim // heads
    vocab = int(r.fields[f"{arch}.vocab_size"].contents()) if f"{arch}.vocab_size" in r.fields \
        else len(r.fields["tokenizer.ggml.tokens"].contents())
    return dict(layers=g("block_count"), dim=dim, ffn=g("feed_forward_length"), heads=heads,
                kv=kv, hd=hd, vocab=vocab)


def flops_per_token(s, seq, r):
    dim, ffn, hd = s["dim"], s["ffn"], s["hd"]
    qd, kvd = s["heads"] * hd, s["kv"] * hd
    projs = [(dim, qd), (dim, kvd), (dim, kvd), (qd, dim), (dim, ffn), (dim, ffn), (ffn, dim)]
    lin = s["layers"] * sum(4 * i * o for i, o in projs)
    lora = s["layers"] * sum(4 * r * (i + o) for i, o in projs)
    head = 4 * dim * s["vocab"]
    attn = s["layers"] * 6 * s["heads"] * hd * (seq + 1)
    return dict(linear=lin, lora=lora, head=head, attention=attn, total=lin + lora + head + attn)


def gib(b):
    return f"{b / 2**20:.0f} MiB" if b is not None else "n/a"


def qlft_side(spec, warmup):
    name, metrics, timef, cpu = spec.split(":")
    recs = [json.loads(l) for l in open(metrics) if l.strip()]
    timed = [x for x in recs if x["step"] > warmup]
    base = [x for x in recs if x["step"] == warmup]
    t0 = base[0]["elapsed_s"] if base else 0.0
    tps = sum(x["tokens"] for x in timed) / (timed[-1]["elapsed_s"] - t0)
    rss, wall = time_v(timef)
    tokens = sum(x["tokens"] for x in timed)
    return dict(name=name, tps=tps, rss=rss, wall=wall,
                tpc=tokens / float(cpu) if float(cpu) > 0 else None,
                tracked=recs[-1].get("memory_peak_bytes"),
                info=f"loss {recs[0]['loss']:.3f} -> {recs[-1]['loss']:.3f}")


def torch_side(spec):
    name, out, timef = spec.split(":")
    res = None
    for line in open(out):
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    rss, wall = time_v(timef)
    return dict(name=name, tps=res["tokens_per_s"], rss=rss, wall=wall, tracked=None,
                tpc=res.get("tokens_per_cpu_s"),
                info=(f"torch {res['torch']}, base {res['base_dtype']}, {res['precision']}, "
                      f"compile={res['compile']}, fused AdamW={res['fused_adamw']}, load "
                      f"{res['load_s']} s, loss {res['first_loss']:.3f} -> "
                      f"{res['last_loss']:.3f}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--qlft", action="append", default=[], help="NAME:metrics.jsonl:time-v")
    ap.add_argument("--torch", action="append", default=[], help="NAME:stdout:time-v")
    ap.add_argument("--peak", type=float, default=0.0, help="bf16 GEMM peak, GFLOP/s")
    ap.add_argument("--f32-peak", type=float, default=0.0, help="fp32 GEMM peak, GFLOP/s")
    ap.add_argument("--cpu-peaks", type=float, nargs=2, default=[0.0, 0.0],
                    help="bf16 and fp32 GEMM peaks per CPU-second x threads")
    a = ap.parse_args()

    qs = [qlft_side(x, a.warmup) for x in a.qlft]
    ts = [torch_side(x) for x in a.torch]
    s = model_shape(a.model)
    f = flops_per_token(s, a.seq, a.r)
    print("== model FLOPs per token (forward + input gradient, no recompute)")
    print(f"  shape: {s}")
    for k in ("linear", "lora", "head", "attention", "total"):
        print(f"  {k:10s} {f[k] / 1e6:9.1f} MFLOP")

    print("== results (tokens/s over the timed steps; peak RSS of the whole process)")
    print(f"  {'':14s} {'tokens/s':>10s} {'tok/CPU-s':>10s} {'peak RSS':>10s} {'tracked':>10s} "
          f"{'wall':>7s}")
    for x in qs + ts:
        tpc = f"{x['tpc']:.1f}" if x["tpc"] else "n/a"
        print(f"  {x['name']:14s} {x['tps']:10.1f} {tpc:>10s} {gib(x['rss']):>10s} "
              f"{gib(x['tracked']) if x['tracked'] else '':>10s} "
              f"{x['wall'] or 0:6.0f}s   {x['info']}")
    print("== ratios qlft / torch (tokens/s higher is better, RSS lower is better)")
    for q in qs:
        for t in ts:
            rr = q["rss"] / t["rss"] if q["rss"] and t["rss"] else float("nan")
            rc = f"{q['tpc'] / t['tpc']:.2f}x" if q["tpc"] and t["tpc"] else "n/a"
            print(f"  {q['name']} / {t['name']}: tokens/s {q['tps'] / t['tps']:.2f}x, "
                  f"tokens per CPU-second {rc}, peak RSS {rr:.2f}x")
    best = max(a.peak, a.f32_peak)
    if best > 0:
        print(f"== MFU: bf16 GEMM peak {a.peak:.1f} GFLOP/s, fp32 GEMM peak {a.f32_peak:.1f} "
              f"GFLOP/s (measured by bench_kernels)")
        for x in qs + ts:
            g = f["total"] * x["tps"] / 1e9
            frac_bf16 = f"{100 * g / a.peak:5.1f}% of bf16 peak, " if a.peak else ""
            print(f"  {x['name']:14s} {g:7.1f} GFLOP/s = {frac_bf16}"
                  f"{100 * g / best:5.1f}% of the better peak (wall time)")
            cb, cf = a.cpu_peaks
            if x["tpc"] and max(cb, cf) > 0:
                # Both sides per CPU-second x threads: what the work reaches with every thread
                # busy, against the GEMM peaks measured the same way.
                g = f["total"] * x["tpc"] * a.threads / 1e9
                frac_bf16 = f"{100 * g / cb:5.1f}% of bf16 peak, " if cb else ""
                print(f"  {'':14s} {g:7.1f} GFLOP/s = {frac_bf16}"
                      f"{100 * g / max(cb, cf):5.1f}% of the better peak "
                      f"(per CPU-second x {a.threads}; peaks {cb:.1f} / {cf:.1f})")
    print("RESULT " + json.dumps({
        "sides": [{k: x[k] for k in ("name", "tps", "tpc", "rss", "tracked")} for x in qs + ts],
        "flops_per_token": f["total"], "bf16_peak_gflops": a.peak,
        "f32_peak_gflops": a.f32_peak, "cpu_peaks_gflops": a.cpu_peaks}))


if __name__ == "__main__":
    main()
