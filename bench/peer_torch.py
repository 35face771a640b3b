#!/usr/bin/env python3
"""The PyTorch + PEFT side of bench/e2e.sh (CPU) and bench/gpu_bench.sh (--device cuda): LoRA
fine-tuning of a GGUF file or a Hugging Face model directory.

It is configured the way a user would pick for CPU LoRA training, and the same way as the qlft
run it is compared with:
  - the same GGUF file, loaded by transformers (gguf_file=..., dequantized to float32);
  - LoRA r / alpha on all seven projections (q,k,v,o,gate,up,down), dropout 0, PEFT defaults;
  - torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss (oneDNN bf16 GEMMs on
    AVX512-BF16), fp32 master LoRA weights, torch.optim.AdamW (fused where available);
  - the same data: the text tokenized whole, cut into rows of seq tokens (labels = inputs, the
    model shifts them), micro-batch rows per step, no padding;
  - torch.set_num_threads(threads).
Warm-up steps are excluded from the timing; the step time includes forward, backward and the
optimizer. Prints one JSON line (prefixed "RESULT ") with tokens/s and peak RSS.

  /opt/qlft-ref/bin/python bench/peer_torch.py --model M.gguf --data tinyshakespeare.txt
"""
import argparse
import json
import os
import resource
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a .gguf file or a Hugging Face model directory")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the model on GPU 0, autocast(cuda), peak memory from "
                         "torch.cuda.max_memory_allocated")
    ap.add_argument("--data", required=True, help="a text file")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    ap.add_argument("--base-dtype", choices=["float32", "bfloat16", "nf4"], default="float32",
                    help="dtype of the frozen base weights (LoRA weights stay float32); nf4: "
                         "bitsandbytes 4-bit NF4 with double quantization and bf16 compute, "
                         "as a QLoRA (Unsloth-baseline) run loads it; cuda only")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                    help="bf16: torch.autocast(cpu, bfloat16); fp32: no autocast")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--grad-checkpointing", action="store_true")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from peft import LoraConfig, get_peft_model

    t_load = time.perf_counter()
    quant = {}
    if args.base_dtype == "nf4":
        from transformers import BitsAndBytesConfig
        quant = dict(quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16), device_map={"": 0})
        dtype = torch.bfloat16
    else:
        dtype = getattr(torch, args.base_dtype)
    if os.path.isdir(args.model):
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, **quant)
    else:
        mdir, mfile = os.path.split(os.path.abspath(args.model))
        tok = AutoTokenizer.from_pretrained(mdir, gguf_file=mfile)
        model = AutoModelForCausalLM.from_pretrained(mdir, gguf_file=mfile, dtype=dtype)
    if not quant:  # a bitsandbytes model is placed by device_map
        model.to(args.device)
    model.config.use_cache = False
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable()
    lcfg = LoraConfig(r=args.r, lora_alpha=args.alpha, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"])
    model = get_peft_model(model, lcfg)
    # LoRA master weights in float32 whatever the base dtype (what autocast training expects).
    for n, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
    model.train()
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())

    with open(args.data, encoding="utf-8") as f:
        text = f.read()
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    rows = ids.numel() // args.seq
    data = ids[: rows * args.seq].view(rows, args.seq).to(args.device)
    load_s = time.perf_counter() - t_load

    params = [p for p in model.parameters() if p.requires_grad]
    try:
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, fused=True)
        fused = True
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
        fused = False

    fwd = model
    if args.compile:
        fwd = torch.compile(model)

    def step(i):
        b0 = (i * args.micro_batch) % (rows - args.micro_batch)
        x = data[b0: b0 + args.micro_batch]
        if args.precision == "bf16":
            with torch.autocast(args.device, dtype=torch.bfloat16):
                loss = fwd(input_ids=x, labels=x).loss
        else:
            loss = fwd(input_ids=x, labels=x).loss
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)  # waits for the device: the step time includes all of its work

    step_s = []
    cpu_s = []
    losses = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        c0 = time.process_time()  # all threads of the process
        losses.append(step(i))
        dt = time.perf_counter() - t0
        step_s.append(dt)
        cpu_s.append(time.process_time() - c0)
        tag = "warmup" if i < args.warmup else "timed"
        print(f"torch step {i + 1} ({tag}) loss {losses[-1]:.4f} "
              f"{args.micro_batch * args.seq / dt:.1f} tok/s", file=sys.stderr, flush=True)
    timed = step_s[args.warmup:]
    tokens = args.micro_batch * args.seq * len(timed)
    res = {
        "torch": torch.__version__,
        "base_dtype": args.base_dtype,
        "precision": args.precision,
        "compile": args.compile,
        "fused_adamw": fused,
        "threads": torch.get_num_threads(),
        "trainable_params": n_train,
        "params": n_all,
        "rows": rows,
        "load_s": round(load_s, 2),
        "tokens_per_s": tokens / sum(timed),
        "tokens_per_cpu_s": tokens / sum(cpu_s[args.warmup:]),
        "step_s": [round(s, 3) for s in step_s],
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if args.device == "cuda":
        res["device"] = torch.cuda.get_device_name(0)
        res["peak_device_bytes"] = torch.cuda.max_memory_allocated(0)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
