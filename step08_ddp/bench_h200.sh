#!/usr/bin/env bash
# bench_h200.sh — step08's training on one GPU (after `make all`), every number the step reports
# for the GPU, into OUTDIR:
#   rate        train --preset small --device cuda (90.2M parameters, bf16 tensor-core GEMMs, fp32
#               master weights and AdamW state) at 64 x 64 and 256 x 64 tokens a step: tokens/s and
#               model TFLOP/s (6 x params x tokens / step time) against cuBLAS's bf16 GEMM ceiling
#               measured in the same run (train prints both: gpu_rate, gpu_ceiling)
#   checkpoints 1000 steps with a checkpoint every 250, sync and async: the training thread's stall
#               as % of the training time (params, m and v downloaded into pinned memory, then
#               written; async on a background thread)
#   resume      600 steps straight vs stopped at 400 and resumed from the checkpoint of step 300:
#               the loss logs (C99 hex floats) of steps 301..600 compared byte for byte
#   NCCL        with MPI and NCCL in the build: the same run under mpirun -np 1 (an NCCL
#               communicator of one rank) gives the loss log of the run without mpirun
# usage: step08_ddp/bench_h200.sh OUTDIR        (BIN=build/bin by default)
set -u -o pipefail
OUT=${1:?usage: bench_h200.sh OUTDIR}
B=${BIN:-build/bin}
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
TR="$B/train --preset small --device cuda --seq 31 --lr 1e-3"
show() { grep -E "^# (gpu_rate|gpu_ceiling|checkpoint|ckpt_stall|ckpt_download|time_split|held_out|replicas|allreduce):" "$1" | cut -c1-260; }
echo "== rate: batch 64 x 64 tokens"
$TR --batch 64 --steps 200 --log-every 50 --eval 20 > "$OUT/train_gpu_small_b64.txt" 2>&1 && show "$OUT/train_gpu_small_b64.txt" \
  || echo "failed: $OUT/train_gpu_small_b64.txt"
echo "== rate: batch 256 x 64 tokens"
$TR --batch 256 --steps 100 --log-every 50 --eval 0 > "$OUT/train_gpu_small_b256.txt" 2>&1 && show "$OUT/train_gpu_small_b256.txt" \
  || echo "failed: $OUT/train_gpu_small_b256.txt"
for mode in sync async; do
  echo "== checkpoints ($mode, every 250 steps of 1000)"
  $TR --batch 64 --steps 1000 --log-every 250 --eval 0 --ckpt-dir "$TMP/ck_$mode" --ckpt-every 250 --keep 2 \
      $([ $mode = async ] && echo --ckpt-async) > "$OUT/train_gpu_ckpt_$mode.txt" 2>&1 && show "$OUT/train_gpu_ckpt_$mode.txt" \
    || echo "failed: $OUT/train_gpu_ckpt_$mode.txt"
  rm -rf "$TMP/ck_$mode"
done
echo "== resume: 600 steps straight vs stopped at 400, resumed from step 300's checkpoint"
R="$TR --batch 64 --steps 600 --log-every 600 --eval 0 --ckpt-every 300"
$R --ckpt-dir "$TMP/full" --loss-log "$TMP/full.log" > "$OUT/resume_gpu_full.txt" 2>&1
$R --ckpt-dir "$TMP/cut" --stop-at 400 --loss-log "$TMP/a.log" > "$OUT/resume_gpu_a.txt" 2>&1
$R --ckpt-dir "$TMP/cut" --resume --loss-log "$TMP/b.log" > "$OUT/resume_gpu_b.txt" 2>&1
{
  echo "# steps 1..400 of the stopped run == the straight run's: $(cmp -s <(head -400 "$TMP/full.log") "$TMP/a.log" && echo yes || echo NO)"
  echo "# steps after the resume: $(wc -l < "$TMP/b.log") (first $(head -1 "$TMP/b.log" | cut -d' ' -f1))"
  echo "# steps 301..600 after the resume == the straight run's, byte for byte: $(cmp -s <(tail -n +301 "$TMP/full.log") "$TMP/b.log" && echo yes || echo NO)"
} | tee "$OUT/resume_gpu.txt"
if command -v mpirun > /dev/null && grep -q "HAVE_NCCL=1" "$B/../gen/build_config" 2> /dev/null; then
  echo "== NCCL: mpirun -np 1 vs no mpirun, 100 steps"
  $TR --batch 64 --steps 100 --log-every 100 --eval 0 --loss-log "$TMP/plain.log" > "$OUT/nccl_plain.txt" 2>&1
  mpirun --allow-run-as-root --oversubscribe -np 1 $TR --batch 64 --steps 100 --log-every 100 --eval 0 \
      --loss-log "$TMP/np1.log" > "$OUT/nccl_np1.txt" 2>&1
  echo "# mpirun -np 1 (NCCL) loss log == plain run's: $(cmp -s "$TMP/plain.log" "$TMP/np1.log" && echo yes || echo NO)" | tee "$OUT/nccl.txt"
  show "$OUT/nccl_np1.txt"
fi
