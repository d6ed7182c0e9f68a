#!/usr/bin/env bash
# bench_engine_h200.sh — step06's targets measured in one run, after `make all` on a GPU machine: the
# Llama-3.1-8B shape with random weights (--preset: random integers and scales for INT8 / INT4, bf16
# on the device for the baseline), bf16 against INT8 and INT4 with the lm_head quantized too, one run
# after the other on one GPU:
#   batch-1 decode   kv_bench: the CUDA-graph decode step; "decode_batch1" = the median step over
#                    positions 1..128 (CUDA events), tok/s = 1 / that step
#   batch B          llm bench: the engine (paged KV, CUDA graphs, continuous batching), 2B requests
#                    of 128 prompt + 256 output tokens through B seats; output tok/s over the whole run
# then summary.txt: each format's numbers and its ratio to bf16 in the same run (the step's aims:
# batch 1 INT4 >= 3.0x, INT8 >= 1.7x; batch 16 INT4 >= 2.5x).
#
#   step06_quant/bench_engine_h200.sh OUTDIR
#     BIN=build/bin  PRESET=llama-3.1-8b  DEVICE=cuda (cpu with PRESET=tiny runs the script's own check)
#     QUANTS="none rtn-int8+lm_head rtn-int4+lm_head"  (none = bf16, first: the ratios' base)
#     BATCHES="16" ("16 64" adds batch 64)  REPEAT=1 (2: every batch-1 run twice, the formats interleaved)
#     QGEMV=V: batch 1 with the quantized GEMV's rung V (kv_bench --qgemv; unset: the engine's default)
set -u -o pipefail
OUT=${1:?usage: bench_engine_h200.sh OUTDIR}
B=${BIN:-build/bin}
PRESET=${PRESET:-llama-3.1-8b}
DEV=${DEVICE:-cuda}
QUANTS=${QUANTS:-none rtn-int8+lm_head rtn-int4+lm_head}
POS=128 REQ_IN=128 REQ_OUT=256
[ "$PRESET" = tiny ] && POS=16 REQ_IN=16 REQ_OUT=16  # the CPU check: short
mkdir -p "$OUT"
if [ "$DEV" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit,memory.used \
      --format=csv > "$OUT/gpu_state.txt" 2>&1
fi
for r in $(seq 1 "${REPEAT:-1}"); do
  for q in $QUANTS; do
    f="$OUT/kv_bench_${q}_r$r.csv"
    echo "== batch 1: kv_bench --preset $PRESET --quant $q (run $r)"
    $B/kv_bench --device "$DEV" --preset "$PRESET" --positions 1,$((POS / 2)),$POS --reps 1 --no-ladders --csv --quant "$q" \
        ${QGEMV:+--qgemv "$QGEMV"} > "$f" 2> "${f%.csv}.err" \
      && grep -a "^# decode_batch1:" "$f" || echo "kv_bench --quant $q failed (see ${f%.csv}.err)"
  done
done
for b in ${BATCHES:-16}; do
  for q in $QUANTS; do
    f="$OUT/llm_bench_b${b}_${q}.json"
    echo "== batch $b: llm bench --preset $PRESET --quant $q"
    $B/llm bench --preset "$PRESET" --trace nano --num-requests $((2 * b)) --input-len $REQ_IN:$REQ_IN \
        --output-len $REQ_OUT:$REQ_OUT --max-num-seqs "$b" --device "$DEV" --quant "$q" --json > "$f" 2> "${f%.json}.err" \
      || echo "llm bench --quant $q failed (see ${f%.json}.err)"
  done
done
python3 - "$OUT" "${BATCHES:-16}" "${REPEAT:-1}" $QUANTS <<'EOF' | tee "$OUT/summary.txt"
import json, re, sys
out, batches, repeat, quants = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4:]
def step_ms(q, r):
    try:
        for line in open(f"{out}/kv_bench_{q}_r{r}.csv", errors="replace"):
            m = re.match(r"# decode_batch1: median step ([0-9.]+) ms", line)
            if m:
                return float(m.group(1))
    except OSError:
        pass
    return None
base = quants[0]
print(f"batch-1 decode (kv_bench, median step; x = {base}'s step / this step, run by run)")
for q in quants:
    ms = [step_ms(q, r) for r in range(1, repeat + 1)]
    cells = []
    for r, v in enumerate(ms, 1):
        b0 = step_ms(base, r)
        cells.append("failed" if v is None else f"{v:.4f} ms {1e3 / v:7.1f} tok/s" + (f" {b0 / v:5.2f}x" if b0 else ""))
    print(f"  {q:24s} " + " | ".join(cells))
for b in batches:
    print(f"batch {b} (llm bench, output tok/s over the run; x = {base}'s)")
    tok = {}
    for q in quants:
        try:
            s = json.load(open(f"{out}/llm_bench_b{b}_{q}.json"))["summary"]
            tok[q] = s["output_tok_s"]
            x = f"{tok[q] / tok[base]:5.2f}x" if base in tok else ""
            print(f"  {q:24s} {tok[q]:9.1f} tok/s  tpot p50 {s['tpot_ms_p50']:.3f} ms  {x}  ({s.get('device', '')})")
        except (OSError, KeyError, ValueError):
            print(f"  {q:24s} failed")
EOF
