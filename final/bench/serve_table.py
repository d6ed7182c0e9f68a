#!/usr/bin/env python3
"""The serving benchmark's results as one Markdown table: every <server>_serve_c<C>.json that
serve_bench.sh left in RESULT_DIR (vLLM's `bench serve --save-result` files), a row per concurrency
and server, then each server's output throughput as a ratio of the other's.

  python3 final/bench/serve_table.py RESULT_DIR [--base vllm]

Latencies are in ms, p50 / p99. A percentile the client was not asked for (serve_bench.sh asks for
TTFT, TPOT, ITL and E2EL at 50 and 99) prints as "-"; p50 falls back on the client's median.
"""
import argparse
import glob
import json
import os
import re
import sys

METRICS = ["ttft", "tpot", "itl", "e2el"]


def pct(d, m, p):
    v = d.get(f"p{p}_{m}_ms")
    if v is None and p == 50:
        v = d.get(f"median_{m}_ms")
    return "-" if v is None else f"{v:,.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result_dir")
    ap.add_argument("--base", default="vllm", help="the server the others are divided by (default vllm)")
    a = ap.parse_args()
    runs = {}
    for f in glob.glob(os.path.join(a.result_dir, "*_serve_c*.json")):
        m = re.fullmatch(r"(.+)_serve_c(\d+)\.json", os.path.basename(f))
        if m:
            runs[(int(m.group(2)), m.group(1))] = json.load(open(f))
    if not runs:
        sys.exit(f"serve_table.py: no <server>_serve_c<C>.json in {a.result_dir}")
    print("| C | prompts | server | output tok/s | " + " | ".join(x.upper() for x in METRICS) + " | completed | failed |")
    print("|---" * (6 + len(METRICS)) + "|")
    for (c, srv) in sorted(runs):
        d = runs[(c, srv)]
        lat = " | ".join(f"{pct(d, m, 50)} / {pct(d, m, 99)}" for m in METRICS)
        print(f"| {c} | {d.get('num_prompts', '-')} | {srv} | {d['output_throughput']:,.0f} | {lat} | "
              f"{d.get('completed', '-')} | {d.get('failed', '-')} |")
    ratios = []
    for (c, srv) in sorted(runs):
        if srv != a.base and (c, a.base) in runs:
            ratios.append(f"C={c}: {srv} {runs[(c, srv)]['output_throughput'] / runs[(c, a.base)]['output_throughput']:.2f}x")
    if ratios:
        print(f"\noutput tok/s against {a.base}: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
