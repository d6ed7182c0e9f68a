#!/usr/bin/env bash
# build; QLINEAR_QTMA_SHAPE variants for INT4+lm_head batch 1; ncu of the batch-1 attention
set -u
N=r1; R=/tmp/res/$N; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/$N.tgz -C /tmp/res $N; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $OUT/gpu.txt 2>&1; tail -1 $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench > $OUT/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -i "error" $OUT/build.log | head
A="--device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv"
run() {  # name, env shape, args...
  local n=$1; local sh=$2; shift 2
  QLINEAR_QTMA_SHAPE="$sh" timeout 60 build/bin/kv_bench $A "$@" > $OUT/kv_$n.csv 2> $OUT/kv_$n.err
  echo "$n [$sh] rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1:' $OUT/kv_$n.csv | head -1 | sed 's/# decode_batch1: median step //') agree $(grep -a '^[0-9]' $OUT/kv_$n.csv | cut -d, -f13 | tr '\n' ' ')"
}
I4="--quant rtn-int4+lm_head"
run bf16 "" --quant none
run i4 "" $I4
run o248 "4096x4096:0/248" $I4
run o132 "4096x4096:0/132" $I4
run o4 "4096x4096:4" $I4
run o8 "4096x4096:8" $I4
run d5 "4096x14336:5" $I4
run d4 "4096x14336:4" $I4
run q5 "6144x4096:5" $I4
run q8 "6144x4096:8" $I4
run gu4 "28672x4096:4" $I4
run gu2 "28672x4096:2" $I4
run i4b "" $I4
run bf16b "" --quant none
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
timeout 200 $NCU --clock-control none --cache-control none --graph-profiling node --set full --import-source no \
  -k regex:k_attn_fused2 --launch-skip 300 --launch-count 1 -o $OUT/att_i4 -f \
  build/bin/kv_bench $A $I4 --positions 64 > $OUT/ncu_att.log 2>&1
echo "ncu rc $? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/ncu_att.log
$NCU -i $OUT/att_i4.ncu-rep --page details > $OUT/att_details.txt 2>&1
$NCU -i $OUT/att_i4.ncu-rep --page source --csv --print-source sass > $OUT/att_sass.csv 2>&1
echo "done at $(( $(date +%s) - T0 )) s"; wc -l $OUT/att_sass.csv
