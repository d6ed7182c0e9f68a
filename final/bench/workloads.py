#!/usr/bin/env python3
"""The offline workloads of final/'s benchmarks as request files (one JSON object per line, the
format of `llm bench --requests` and step04's batch_bench: prompt_ids, max_tokens, temperature,
ignore_eos), so that this engine, vLLM and transformers run exactly the same requests.

  nano   nano-vllm's bench.py: random.seed(0); 256 prompts of U[100, 1024] ids drawn from
         randint(0, 10000), then 256 max_tokens of U[100, 1024]; temperature 0.6, ignore EOS.
         The draws are made in bench.py's order, so the lengths (and the 133,966 output tokens)
         are the ones vLLM and nano-vllm report for their own runs of it.
  fixed  1000 requests of exactly 1024 prompt ids (randint(0, 10000), random.seed(0)) and 128
         output tokens, temperature 0.6, ignore EOS: the 1024-in / 128-out shape of the serving
         benchmark, offline.
  prefill  1000 requests of 1024 prompt ids (the same draws as fixed) and 1 output token: every step
         of the run is a prompt-chunk step, so the runner's prefill time and TFLOP/s are measured
         apart from decode (prefill_flops.py turns `llm bench --json`'s prefill_device_s into TFLOP/s).

usage: python3 final/bench/workloads.py nano|fixed|prefill OUT.jsonl [--vocab N]
--vocab N keeps ids below N (an id >= N is replaced by one drawn from random.Random(1); only for
models with fewer than 10001 ids, such as the test checkpoints: the benchmarks' models have more).
"""
import json
import random
import sys


def nano():
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)]
    outs = [random.randint(100, 1024) for _ in range(256)]
    return [dict(prompt_ids=p, max_tokens=m, temperature=0.6, ignore_eos=True) for p, m in zip(prompts, outs)]


def fixed(n=1000, n_in=1024, n_out=128):
    random.seed(0)
    return [dict(prompt_ids=[random.randint(0, 10000) for _ in range(n_in)], max_tokens=n_out, temperature=0.6,
                 ignore_eos=True) for _ in range(n)]


def main(argv):
    if len(argv) < 3 or argv[1] not in ("nano", "fixed", "prefill"):
        sys.exit(__doc__)
    reqs = nano() if argv[1] == "nano" else fixed() if argv[1] == "fixed" else fixed(n_out=1)
    if "--vocab" in argv:
        v = int(argv[argv.index("--vocab") + 1])
        rng = random.Random(1)
        for r in reqs:
            r["prompt_ids"] = [t if t < v else rng.randrange(v) for t in r["prompt_ids"]]
    with open(argv[2], "w") as f:
        for r in reqs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    n_in = sum(len(r["prompt_ids"]) for r in reqs)
    n_out = sum(r["max_tokens"] for r in reqs)
    print(f"{argv[2]}: {len(reqs)} requests, {n_in} prompt tokens, {n_out} output tokens", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
