#!/usr/bin/env bash
# bench_h200.sh — step03 on a GPU machine in one go: the step02 + step03 tests (goldens of every
# tiny checkpoint on the GPU, GEMV and decode attention vs the CPU), a random-weight
# Llama-3.1-8B-shaped bf16 checkpoint made with transformers, the decode table on it (latency vs
# position with and without the cache, KV bytes, decode bandwidth vs the copy bandwidth measured
# in the same run), generate on it, and the same table for a Qwen3-0.6B shape (random weights).
#   step03_kvcache/bench_h200.sh OUTDIR          (after `make all`; OUTDIR gets <= 7 files)
set -u -o pipefail
OUT=${1:?usage: bench_h200.sh OUTDIR}
CKPT=${CKPT:-/tmp/llama8b}
mkdir -p "$OUT"
B=build/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv \
    > "$OUT/gpu_state_h200.txt" 2>&1

echo "== step02 + step03 tests"
build/tests/run_tests --filter 'step0[23]/*' --verbose 2>&1 | tee "$OUT/tests_step03_h200.log" \
    | grep -E "FAIL|SKIP|greedy-cache|Synthesis|expect|assert" | head -60

echo "== random-weight Llama-3.1-8B-shaped bf16 checkpoint -> $CKPT"
t0=$(date +%s)
timeout 200 python3 tools/make_random_checkpoint.py llama-3.1-8b "$CKPT" --force 2>&1 | tail -2
echo "checkpoint: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/gpu_state_h200.txt"
if [ -f "$CKPT/config.json" ]; then SRC=(--model "$CKPT"); else SRC=(--preset llama-3.1-8b); fi

echo "== 8B decode table (${SRC[*]})"
$B/kv_bench --device cuda "${SRC[@]}" --positions 1,64,128,256,512,1024 --csv 2>&1 | tee "$OUT/kv_bench_8b_h200.csv"

echo "== generate on the 8B shape: cached, then uncached"
[ -f "$CKPT/config.json" ] && { $B/generate --model "$CKPT" --device cuda --ids 128000,791,4062,14198,39935 --max-new-tokens 128 --ignore-eos 2>&1
  $B/generate --model "$CKPT" --device cuda --ids 128000,791,4062,14198,39935 --max-new-tokens 32 --ignore-eos --no-cache 2>&1
} | tee "$OUT/generate_8b_h200.txt" | grep -E "ids|TTFT|TPOT|tok/s|KV"

echo "== Qwen3-0.6B shape (random bf16 weights made on the device)"
$B/kv_bench --device cuda --preset qwen3-0.6b --positions 1,128,512,1024 --csv 2>&1 | tee "$OUT/kv_bench_qwen3_0.6b_h200.csv" | grep -E "decode_batch1|gemv"

echo "== demo: the tiny Llama with a tokenizer, on the GPU"
{ $B/generate --model tests/data/models/llama_mha_bf16 --prompt "The quick brown fox" --max-new-tokens 24 --device cuda
  $B/generate --model tests/data/models/llama_mha_bf16 --prompt "The quick brown fox" --max-new-tokens 24 --device cuda \
      --temperature 0.8 --top-p 0.9 --seed 7 --json --logprobs 3
} 2>&1 | tee "$OUT/demo_step03_h200.txt" | tail -3
