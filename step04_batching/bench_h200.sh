#!/usr/bin/env bash
# bench_h200.sh — step04 on a GPU machine (after `make all`); results into OUTDIR.
#   step04_batching/bench_h200.sh OUTDIR          (BIN=build/bin by default)
set -u -o pipefail
OUT=${1:?usage: bench_h200.sh OUTDIR}
B=${BIN:-build/bin}
mkdir -p "$OUT"

# ---- the batch scaling table and the batched prefill (batch_scan, random weights made on the device)
echo "== batch scan: Llama-3.1-8B shape, random bf16 weights, context 256"
$B/batch_scan --preset llama-3.1-8b --context 256 --csv 2>&1 | tee "$OUT/batch_scan_8b_h200.csv"
echo "== batch scan: Qwen3-0.6B shape, random bf16 weights, context 256"
$B/batch_scan --preset qwen3-0.6b --context 256 --csv 2>&1 | tee "$OUT/batch_scan_qwen3_0.6b_h200.csv"
echo "== one 2048-token prompt through the batched path, Llama-3.1-8B shape"
$B/batch_scan --preset llama-3.1-8b --prefill 2048 --steps 10 2>&1 | tee "$OUT/prefill_8b_h200.txt"
