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

# ---- batch_bench: nano-vllm's workload (256 requests, prompt and output 100..1024 tokens, random ids,
# greedy, ignore EOS) through continuous and static batching at the same max_num_seqs, on random-weight
# Qwen3-0.6B and Llama-3.1-8B shapes (bf16 weights generated on the device: --preset). Files:
#   batch_bench_<shape>_<policy>_s<seqs>_h200.json   --json: every request's output ids, TTFT, E2E; the summary
#   batch_bench_<shape>_<policy>_s<seqs>_h200.txt    progress lines, then the summary as "key: value" lines
#   timeline_<shape>_<policy>_s<seqs>_h200.csv       per request: arrival, first scheduled, first token, finish
# max_num_seqs 32 and 64: with 256 requests static batching forms 8 or 4 batches (at 256 both policies
# would run the same single batch). The schedule does not depend on the device: static needs
# 7922 steps against continuous' 5117 at 32 seats (1.55x), 4063 against 2767 at 64 (1.47x), and
# computes its padding as a padded batch does (prompts padded to the batch's longest, finished
# members' rows until the batch ends: 507267 and 516609 rows against continuous' 292701).
# SEQS="64" picks others; BUDGET the token budget per step.
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv \
    > "$OUT/gpu_state_batch_bench_h200.txt" 2>&1
for shape in qwen3-0.6b llama-3.1-8b; do
  for seqs in ${SEQS:-32 64}; do
    for policy in continuous static; do
      tag="${shape}_${policy}_s${seqs}"
      echo "== batch_bench --trace nano, $shape, $policy, max_num_seqs $seqs"
      $B/batch_bench --preset "$shape" --trace nano --device cuda --policy "$policy" --max-num-seqs "$seqs" \
          --max-num-batched-tokens "${BUDGET:-8192}" --json --timeline "$OUT/timeline_${tag}_h200.csv" \
          2> "$OUT/batch_bench_${tag}_h200.txt" > "$OUT/batch_bench_${tag}_h200.json" \
        || echo "batch_bench $tag failed (see $OUT/batch_bench_${tag}_h200.txt)"
      python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print("\n".join(f"{k}: {v}" for k,v in s.items()))' \
          "$OUT/batch_bench_${tag}_h200.json" >> "$OUT/batch_bench_${tag}_h200.txt" 2>/dev/null \
        && grep -E "^(output_tok_s|total_tok_s|ttft_ms_p50|ttft_ms_p99|tpot_ms_p50|tpot_ms_p99|idle_slot_share|steps|rows_computed|padding_rows):" \
               "$OUT/batch_bench_${tag}_h200.txt"
    done
  done
done

# ---- batch_bench: what the token budget trades (TTFT vs inter-token latency), Poisson arrivals at
# 20 requests/s, 200 requests, prompts 100..1024, outputs 100..512, Qwen3-0.6B shape, 64 seats.
#   batch_bench_qwen3-0.6b_poisson_b<budget>_h200.json
for budget in ${BUDGETS:-256 2048 8192}; do
  echo "== batch_bench --trace poisson, qwen3-0.6b, budget $budget"
  $B/batch_bench --preset qwen3-0.6b --trace poisson --rate 20 --num-requests 200 --input-len 100:1024 \
      --output-len 100:512 --device cuda --max-num-seqs 64 --max-num-batched-tokens "$budget" --json \
      2>/dev/null > "$OUT/batch_bench_qwen3-0.6b_poisson_b${budget}_h200.json" \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print({k: round(s[k], 2) for k in ("output_tok_s","ttft_ms_p50","ttft_ms_p99","itl_ms_p50","itl_ms_p99","tpot_ms_p99")})' \
           "$OUT/batch_bench_qwen3-0.6b_poisson_b${budget}_h200.json" \
    || echo "batch_bench poisson budget $budget failed"
done
