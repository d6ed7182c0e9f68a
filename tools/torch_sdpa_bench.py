#!/usr/bin/env python3
"""PyTorch's side of step07's flash attention table: torch SDPA with the flash backend forced
(torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)) and an eager attention (QK^T, mask,
fp32 softmax, PV, as Hugging Face's eager path) on the shapes of build/bin/flash_bench, timed with
CUDA events (warm-up, median), written as CSV with the same FLOP count:

    FLOPs = 4 * hd * H * (query, key) pairs computed; causal from 0: 4 * hd * H * T (T + 1) / 2

Cases (flash_bench's CASES; T tokens, H query / KV kv heads, hd):
  llama8b_4k  1 x 4096, 32/8, 128     llama1b_4k  1 x 4096, 32/8, 64
  qwen06b_1k  1 x 1024, 16/8, 128     qwen06b_4k  1 x 4096, 16/8, 128
  varlen      8 sequences 1 .. 3001 tokens, 32/8, 128: SDPA has no varlen entry point here, so
              one call per sequence (8 launches), timed together
  chunked     64 sequences x 64 new tokens after 1024 context tokens, 16/8, 128: one batched call on
              contiguous K/V (the context already gathered, not timed), with the bottom-right causal
              mask (token j of the chunk sees keys 0 .. 1024 + j)

    python3 tools/torch_sdpa_bench.py [--case NAME] [--dtype bf16|fp16] [--reps 20] [--warmup 5]
                                      [--impl sdpa_flash,eager] [--csv out.csv]

Needs torch with CUDA (GQA through enable_gqa, torch >= 2.5). Each case also prints the max
relative error of SDPA against the eager result (a check that both compute the same thing).
"""
import argparse
import csv
import datetime
import statistics
import sys

CASES = [
    # name, H, KV, hd, lens, ctx
    ("llama8b_4k", 32, 8, 128, [4096], 0),
    ("llama1b_4k", 32, 8, 64, [4096], 0),
    ("qwen06b_1k", 16, 8, 128, [1024], 0),
    ("qwen06b_4k", 16, 8, 128, [4096], 0),
    ("varlen", 32, 8, 128, [1, 77, 300, 513, 1000, 1525, 3000, 3001], 0),
    ("chunked", 16, 8, 128, [64] * 64, 1024),
]


def visible_pairs(lens, ctx):
    return sum(n * ctx + n * (n + 1) / 2 for n in lens)


def time_ms(torch, fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default=None, help="one case (default: all)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--impl", default="sdpa_flash,eager", help="comma list of sdpa_flash, eager")
    ap.add_argument("--csv", default=None, help="write the table here (default: stdout)")
    ap.add_argument("--seed", type=int, default=12)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    if not torch.cuda.is_available():
        sys.exit("torch_sdpa_bench: no CUDA device")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    impls = [s for s in args.impl.split(",") if s]
    for s in impls:
        if s not in ("sdpa_flash", "eager"):
            sys.exit(f"--impl: unknown '{s}'")
    cases = [c for c in CASES if args.case in (None, c[0])]
    if not cases:
        sys.exit(f"--case: '{args.case}' is not a case")
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    rows = []

    for name, H, KV, hd, lens, ctx in cases:
        scale = hd ** -0.5
        g = H // KV
        # (batch, heads, tokens, hd) per group of equal-length sequences
        if name == "chunked":
            nq, nk = lens[0], ctx + lens[0]
            groups = [(len(lens), nq, nk)]
        else:
            groups = [(1, n, n) for n in lens]
        tensors = []
        for b, nq, nk in groups:
            q = torch.rand(b, H, nq, hd, device=dev, dtype=dtype) * 2 - 1
            k = torch.rand(b, KV, nk, hd, device=dev, dtype=dtype) * 2 - 1
            v = torch.rand(b, KV, nk, hd, device=dev, dtype=dtype) * 2 - 1
            tensors.append((q, k, v))
        masks = [causal_lower_right(nq, nk) if nq != nk else None for _, nq, nk in groups]
        # the bottom-right mask goes through CausalBias, which is not given enable_gqa here: its K/V
        # heads are repeated beforehand (untimed)
        expanded = [(k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)) if m is not None else None
                    for (q, k, v), m in zip(tensors, masks)]

        def sdpa_all():
            outs = []
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                for (q, k, v), m, kv in zip(tensors, masks, expanded):
                    if m is None:
                        outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True))
                    else:
                        outs.append(F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=m, scale=scale))
            return outs

        def eager_all():
            outs = []
            for q, k, v in tensors:
                nq, nk = q.shape[2], k.shape[2]
                kk = k.repeat_interleave(g, dim=1)
                vv = v.repeat_interleave(g, dim=1)
                s = torch.matmul(q, kk.transpose(-1, -2)) * scale
                # token i of the chunk sits at position nk - nq + i: it sees keys 0 .. nk - nq + i
                mask = torch.ones(nq, nk, device=dev, dtype=torch.bool).tril(diagonal=nk - nq)
                s = s.masked_fill(~mask, float("-inf"))
                p = torch.softmax(s.float(), dim=-1).to(dtype)
                outs.append(torch.matmul(p, vv))
            return outs

        flops = 4.0 * hd * H * visible_pairs(lens, ctx)
        launches = len(groups)
        err = None
        if "sdpa_flash" in impls and "eager" in impls:
            try:
                a, b = sdpa_all(), eager_all()
                err = max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item() for x, y in zip(a, b))
            except RuntimeError:
                err = None  # the timing below reports the failure
        for impl in impls:
            fn = sdpa_all if impl == "sdpa_flash" else eager_all
            try:
                ms = time_ms(torch, fn, args.warmup, args.reps)
            except RuntimeError as e:  # e.g. the flash backend refusing a shape: say so, keep going
                rows.append([name, impl, "", "", launches, f"failed: {str(e).splitlines()[0]}"])
                continue
            note = "one call per sequence" if name == "varlen" else (
                "batched, contiguous K/V (context gathered and kv heads repeated, untimed), bottom-right causal" if name == "chunked" else "")
            if err is not None:
                note = (note + "; " if note else "") + f"sdpa vs eager max_rel_err {err:.2e}"
            rows.append([name, impl, f"{ms:.4f}", f"{flops / (ms * 1e-3) / 1e12:.1f}", launches, note])

    out = open(args.csv, "w", newline="") if args.csv else sys.stdout
    out.write(f"# device: {torch.cuda.get_device_name(0)}\n")
    out.write(f"# torch: {torch.__version__}, cuda {torch.version.cuda}\n")
    out.write(f"# date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}\n")
    out.write(f"# dtype: {args.dtype}; timing: CUDA events, {args.warmup} warm-up runs, median of {args.reps}\n")
    out.write("# flops: 4 * hd * H * (query, key) pairs computed (the same count as build/bin/flash_bench)\n")
    w = csv.writer(out)
    w.writerow(["case", "impl", "ms", "tflops", "launches", "note"])
    w.writerows(rows)
    if args.csv:
        out.close()


if __name__ == "__main__":
    main()
