#!/usr/bin/env bash
# bench_engine_h200.sh — step06's quantized projections in the engine, on a GPU machine (after
# `make all`): the same Llama-3.1-8B-shaped random model (--preset: weights made on the host as
# random integers and scales for INT8 / INT4, bf16 on the device for the baseline) in three
# formats, in one run:
#   batch-1 decode   step03's kv_bench: the CUDA-graph decode step, qlinear_gpu_gemv at every
#                    projection; headline "decode_batch1" (median step over positions 1..128 ->
#                    tok/s, GB/s counting the bytes the quantized projections take as stored)
#   batch 16         step04's batch_bench: 32 requests of 128 prompt + 256 output tokens through
#                    16 seats (qlinear_gpu_gemm for the steps of several rows); output tok/s
#   step06_quant/bench_engine_h200.sh OUTDIR          (BIN=build/bin by default; QUANTS="none rtn-int8 rtn-int4";
#   QGEMV="1 4 5 6": batch-1 decode once per quantized GEMV rung, kv_bench --qgemv, default 1)
set -u -o pipefail
OUT=${1:?usage: bench_engine_h200.sh OUTDIR}
B=${BIN:-build/bin}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv \
    > "$OUT/gpu_state_engine_h200.txt" 2>&1
for q in ${QUANTS:-none rtn-int8 rtn-int4}; do
  for v in $([ "$q" = none ] && echo 1 || echo ${QGEMV:-1}); do  # QGEMV="1 4 5 6": the quantized GEMV rungs
    tag=${q}$([ "$q" = none ] || [ "${QGEMV:-1}" = 1 ] || echo "_qgemv$v")
    echo "== kv_bench (batch-1 decode), Llama-3.1-8B shape, --quant $q --qgemv $v"
    $B/kv_bench --device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --quant "$q" --qgemv "$v" \
        > "$OUT/kv_bench_8b_${tag}_h200.txt" 2>&1 \
      && grep -E "^# (quant|qgemv|weight_bytes|precision|decode_batch1):" "$OUT/kv_bench_8b_${tag}_h200.txt" \
      || echo "kv_bench --quant $q --qgemv $v failed (see $OUT/kv_bench_8b_${tag}_h200.txt)"
  done
done
for q in ${QUANTS:-none rtn-int8 rtn-int4}; do
  echo "== batch_bench (16 seats), Llama-3.1-8B shape, --quant $q"
  $B/batch_bench --preset llama-3.1-8b --trace nano --num-requests 32 --input-len 128:128 --output-len 256:256 \
      --max-num-seqs 16 --device cuda --quant "$q" --json \
      2> "$OUT/batch_bench_8b_s16_${q}_h200.txt" > "$OUT/batch_bench_8b_s16_${q}_h200.json" \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print({k: s[k] for k in ("quant","weight_bytes","output_tok_s","tpot_ms_p50","steps")})' \
           "$OUT/batch_bench_8b_s16_${q}_h200.json" \
    || echo "batch_bench --quant $q failed (see $OUT/batch_bench_8b_s16_${q}_h200.txt)"
done
