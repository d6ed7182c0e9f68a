#!/usr/bin/env bash
# bench_multigpu.sh — step08's data parallelism over the GPUs of one machine (after `make all`
# with MPI and NCCL), every number the multi-GPU measurement asks for, into OUTDIR:
#   scaling     preset small, 64 x 64 tokens per GPU (the global batch grows with the ranks):
#               tokens/s on 1 GPU, then on 2 (and 4, 8 when there are as many), with the gradient
#               buckets all-reduced as their layers finish (default) and all at once after the
#               backward (--bucket-kb 0): scaling efficiency = tok/s(N) / (N x tok/s(1)), and the
#               all-reduce wait the overlap left exposed, as train prints it (allreduce:)
#   kill        2 ranks under launch.sh, a checkpoint every 100 steps, rank 1 SIGKILLed after step
#               230: detection, recovery time (kill -> first completed step after the resume),
#               steps lost, and the loss log after the resume against an uninterrupted 2-rank run
#   checkpoints 2 ranks, every 250 steps of 1000, sync and async: the stall as % of training time
# usage: step08_ddp/bench_multigpu.sh OUTDIR        (BIN=build/bin; NGPUS: the GPUs to use, default all)
set -u -o pipefail
OUT=${1:?usage: bench_multigpu.sh OUTDIR}
B=${BIN:-build/bin}
N=${NGPUS:-$(nvidia-smi -L | wc -l)}
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
L="step08_ddp/launch.sh"
TR="$B/train --preset small --device cuda --seq 31 --lr 1e-3 --eval 0"
show() { grep -E "^# (gpu_rate|allreduce|checkpoint|replicas|train_time):" "$1" | cut -c1-260; }
rate() { grep -oE "gpu_rate: [0-9]+ tokens/s" "$1" | grep -oE "[0-9]+" | head -1; }
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
echo "== 1 GPU, batch 64"
$TR --batch 64 --steps 300 --log-every 300 > "$OUT/scale_1gpu.txt" 2>&1; show "$OUT/scale_1gpu.txt"
r1=$(rate "$OUT/scale_1gpu.txt")
for n in 2 4 8; do
  [ "$n" -le "$N" ] || break
  for kb in 64 0; do
    f="$OUT/scale_${n}gpu_bucket${kb}.txt"
    echo "== $n GPUs, global batch $((64 * n)), --bucket-kb $kb"
    $L --np $n -- $TR --batch $((64 * n)) --steps 300 --log-every 300 --bucket-kb $kb > "$f" 2>&1; show "$f"
    rn=$(rate "$f")
    [ -n "$r1" ] && [ -n "$rn" ] && echo "# scaling efficiency $n GPUs (bucket-kb $kb): $rn / ($n x $r1) = $(echo "scale=3; $rn / ($n * $r1)" | bc)" | tee -a "$OUT/scaling.txt"
  done
done
[ "$N" -ge 2 ] || { echo "one GPU: no multi-GPU runs"; exit 0; }
echo "== kill rank 1 after step 230 (2 GPUs, checkpoint every 100)"
$L --np 2 --max-restarts 1 --kill-rank 1 --kill-after-step 230 --log-dir "$TMP/kill" -- \
   $TR --batch 128 --steps 400 --log-every 100 --ckpt-dir "$TMP/ck_kill" --ckpt-every 100 --loss-log "$TMP/kill.log" > "$OUT/kill_2gpu.txt" 2>&1
grep -E "launch:|recovery|steps lost" "$OUT/kill_2gpu.txt" | tail -8
$L --np 2 -- $TR --batch 128 --steps 400 --log-every 400 --loss-log "$TMP/straight.log" > "$OUT/kill_2gpu_straight.txt" 2>&1
echo "# loss log of steps 201..400 after the resume == the uninterrupted 2-GPU run's: $(cmp -s <(tail -n 200 "$TMP/straight.log") <(tail -n 200 "$TMP/kill.log") && echo yes || echo NO)" | tee "$OUT/kill_2gpu_bits.txt"
for mode in sync async; do
  echo "== checkpoints ($mode), 2 GPUs, every 250 steps of 1000"
  $L --np 2 -- $TR --batch 128 --steps 1000 --log-every 500 --ckpt-dir "$TMP/ck_$mode" --ckpt-every 250 --keep 2 \
     $([ $mode = async ] && echo --ckpt-async) > "$OUT/ckpt_2gpu_$mode.txt" 2>&1; show "$OUT/ckpt_2gpu_$mode.txt"
  rm -rf "$TMP/ck_$mode"
done
