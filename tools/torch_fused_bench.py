#!/usr/bin/env python3
"""The PyTorch side of step07's three-way table: the same ops as build/bin/fused_bench (residual
add + RMSNorm in place on the residual, SwiGLU over the merged gate|up output, RoPE on q and k +
K/V written to a paged cache through a slot mapping), the same shapes, dtypes and byte counts,
run as PyTorch eager and as torch.compile of the same function.

Timing as fused_bench's: CUDA events around back-to-back calls (enough to cover ~20 us per
sample), warm-up, median of --reps samples, buffers rotated over >= 3x the L2 so each call reads
HBM. Before timing, the compiled output is compared with the eager one. Kernel launches per call
are counted with torch.profiler (CUDA kernels seen in one call).

    python3 tools/torch_fused_bench.py > step07_kernels/results/torch_h200.csv
    python3 tools/torch_fused_bench.py --kernel addnorm --models 8b --tokens 1,4096

Output: CSV with the columns kernel, model, T, n, dtype, impl, us, gb_s, launches, max_abs_diff
(the same kernel / model / T / n / dtype values as fused_bench's --csv, so the two join on them).
Needs torch with CUDA; nothing else.
"""
import argparse
import math
import statistics
import sys

import torch
import torch.nn.functional as F

SHAPES = {  # id: (name, hidden, heads, kv_heads, head_dim, ff)
    "0.6b": ("Qwen3-0.6B", 1024, 16, 8, 128, 3072),
    "1b": ("Llama-3.2-1B", 2048, 32, 8, 64, 8192),
    "8b": ("Llama-3.1-8B", 4096, 32, 8, 128, 14336),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EPS = 1e-6


# ---------------------------------------------------------------- the ops, written as transformers does
def addnorm(x, residual, w, odt):
    """residual += x (in the residual dtype); out = (w * rmsnorm(residual).to(residual dtype)).to(odt)."""
    residual.add_(x)
    s = residual.float()
    inv = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS)
    return (w * (s * inv).to(residual.dtype)).to(odt)


def swiglu(gu, odt):
    gate, up = gu.chunk(2, dim=-1)
    return (F.silu(gate) * up).to(odt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_kv(qkv, cos, sin, rows, slots, kc, vc, H, KV, hd):
    """q rotated in place in qkv (fp32; cos, sin (T, hd) as transformers builds them); k rotated and
    v written to cache rows `slots` (the
    non-padding rows `rows` of the batch: slot -1 rows are left out when the batch is built)."""
    T = qkv.shape[0]
    q = qkv[:, : H * hd].view(T, H, hd)
    k = qkv[:, H * hd : (H + KV) * hd].view(T, KV, hd)
    v = qkv[:, (H + KV) * hd :].view(T, KV, hd)
    c = cos.unsqueeze(1)  # (T, 1, hd): HF's tables, the half-width angles twice, made once per forward
    s = sin.unsqueeze(1)
    q.copy_(q * c + rotate_half(q) * s)
    k_rot = k * c + rotate_half(k) * s
    kc.index_copy_(0, slots, k_rot[rows].reshape(-1, KV * hd).to(kc.dtype))
    vc.index_copy_(0, slots, v[rows].reshape(-1, KV * hd).to(vc.dtype))


# ---------------------------------------------------------------- inputs, bytes, timing
def make_sets(kernel, m, T, dt, res_f32, nrot, dev):
    name, hidden, H, KV, hd, ff = m
    rdt = torch.float32 if res_f32 else dt
    sets = []
    for i in range(nrot):
        if kernel == "addnorm":
            sets.append((torch.empty(T, hidden, dtype=rdt, device=dev).uniform_(-1, 1),
                         torch.empty(T, hidden, dtype=rdt, device=dev).uniform_(-1, 1)))
        elif kernel == "swiglu":
            sets.append((torch.empty(T, 2 * ff, dtype=rdt, device=dev).uniform_(-6, 6),))
        else:
            half = hd // 2
            pos = torch.randint(0, 4096, (T, 1), device=dev).float()
            inv_freq = 500000.0 ** (-torch.arange(0, half, device=dev).float() * 2 / hd)
            ang = torch.cat((pos * inv_freq, pos * inv_freq), dim=-1)
            rows = torch.tensor([t for t in range(T) if t % 7 != 6], device=dev, dtype=torch.long)
            slots = torch.arange(rows.numel(), device=dev, dtype=torch.long) + i * T
            sets.append((torch.empty(T, (H + 2 * KV) * hd, device=dev).uniform_(-1, 1), ang.cos(), ang.sin(), rows, slots))
    return sets


def op_bytes(kernel, m, T, dt, res_f32):
    name, hidden, H, KV, hd, ff = m
    es = torch.finfo(dt).bits // 8
    er = 4 if res_f32 else es
    if kernel == "addnorm":
        return 3.0 * T * hidden * er + T * hidden * es + hidden * 4.0
    if kernel == "swiglu":
        return T * 2.0 * ff * er + T * ff * es
    kvrows = T - T // 7  # counted as fused_bench counts them (half-width cos/sin tables)
    return T * (H + 2.0 * KV) * hd * 4 + T * hd / 2 * 8 + T * H * hd * 4 + kvrows * 2.0 * KV * hd * es


def count_launches(fn):
    try:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:  # the profiler is optional: the column is then empty
        return float("nan")


def time_us(fn, nrot, warmup, reps, inner):
    for i in range(warmup):
        fn(i % nrot)
    torch.cuda.synchronize()
    samples, k = [], 0
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn(k % nrot)
            k += 1
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / inner)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="all", choices=["all", "addnorm", "swiglu", "rope"])
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    ap.add_argument("--residual-f32", action="store_true", help="fp32 residual / GEMM outputs (the engine's layout)")
    ap.add_argument("--models", default="0.6b,1b,8b")
    ap.add_argument("--tokens", default="1,16,256,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--impl", default="eager,compile", help="eager, compile or both")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_fused_bench: no CUDA device")
    if args.reps < 20:
        sys.exit("torch_fused_bench: --reps must be at least 20")
    dev = torch.device("cuda")
    dt = DTYPES[args.dtype]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    kernels = ["addnorm", "swiglu", "rope"] if args.kernel == "all" else [args.kernel]
    names = {"addnorm": "addnorm", "swiglu": "swiglu", "rope": "rope_kv"}
    dts = ("fp32>" if args.residual_f32 and args.dtype != "fp32" else "") + args.dtype
    print(f"# device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; dtype {dts}; "
          f"median of {args.reps} samples after {args.warmup} warm-up calls; buffers rotated over >= 3x L2")
    print("kernel,model,T,n,dtype,impl,us,gb_s,launches,max_abs_diff")
    for kernel in kernels:
        for mid in args.models.split(","):
            m = SHAPES[mid]
            name, hidden, H, KV, hd, ff = m
            for T in (int(t) for t in args.tokens.split(",")):
                nbytes = op_bytes(kernel, m, T, dt, args.residual_f32)
                nrot = max(1, math.ceil(3 * l2 / nbytes))
                sets = make_sets(kernel, m, T, dt, args.residual_f32, nrot, dev)
                # the weight in the residual dtype, as transformers holds it (converted once, outside the timing)
                w = torch.empty(hidden, device=dev).uniform_(0.5, 1.5).to(torch.float32 if args.residual_f32 else dt)
                if kernel == "rope":
                    kc = torch.zeros(nrot * T + 8, KV * hd, dtype=dt, device=dev)
                    vc = torch.zeros_like(kc)
                fns = {"eager": addnorm if kernel == "addnorm" else swiglu if kernel == "swiglu" else rope_kv}
                if "compile" in args.impl:
                    torch._dynamo.reset()  # a fresh cache per shape: no fallback to eager past the recompile limit
                    fns["compile"] = torch.compile(fns["eager"], dynamic=False)
                outs = {}
                cmp = [t.clone() for t in sets[0]]  # set 0 before any timing mutates it (in-place ops)
                for impl in [i for i in ("eager", "compile") if i in args.impl]:
                    f = fns[impl]
                    if kernel == "addnorm":
                        call = lambda i, f=f: f(sets[i][0], sets[i][1], w, dt)
                    elif kernel == "swiglu":
                        call = lambda i, f=f: f(sets[i][0], dt)
                    else:
                        call = lambda i, f=f: f(*sets[i][:3], sets[i][3], sets[i][4], kc, vc, H, KV, hd)
                    # the comparison input: a copy of set 0, so eager and compiled see the same values
                    if kernel == "addnorm":
                        x0, r0 = cmp[0].clone(), cmp[1].clone()
                        outs[impl] = f(x0, r0, w, dt).float()
                    elif kernel == "swiglu":
                        outs[impl] = f(cmp[0], dt).float()
                    else:
                        q0 = cmp[0].clone()
                        f(q0, *cmp[1:3], cmp[3], cmp[4], kc, vc, H, KV, hd)
                        outs[impl] = q0[:, : H * hd].float()
                    diff = (outs[impl] - outs["eager"]).abs().max().item() if impl != "eager" else 0.0
                    est = nbytes / 4.0e12 * 1e6 + 5
                    inner = 1 if est >= 20 else math.ceil(20 / est)
                    us = time_us(call, nrot, args.warmup, args.reps, inner)
                    launches = count_launches(lambda: call(0))
                    n = hidden if kernel == "addnorm" else ff if kernel == "swiglu" else (H + 2 * KV) * hd
                    kdts = args.dtype if kernel == "rope" else dts  # RoPE reads the fp32 qkv rows either way
                    print(f"{names[kernel]},{name},{T},{n},{kdts},torch_{impl},{us:.2f},{nbytes / (us * 1e-6) / 1e9:.1f},"
                          f"{launches},{diff:.3g}", flush=True)
                del sets


if __name__ == "__main__":
    main()
