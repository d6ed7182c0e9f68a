#!/usr/bin/env bash
# build at HEAD (fp16 scales); kv_bench new vs old (3cc5c7e with a 48 KB ring = the commit before); step06 GPU tests; ncu per-kernel times
set -u
N=q6; R=/tmp/res/$N; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/$N.tgz -C /tmp/res $N; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
source .devdeps/env.sh
{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv; } > $OUT/gpu.txt 2>&1
tail -2 $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench build/tests/run_tests > $OUT/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -i "error" $OUT/build.log | head; tail -n2 $OUT/build.log
A="--device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv"
run() {  # name, binary, quant
  timeout 120 env $2 $A --quant $3 > $OUT/kv_$1.csv 2> $OUT/kv_$1.err
  echo "kv $1 rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1' $OUT/kv_$1.csv | head -1)"
}
run bf16 build/bin/kv_bench none
run new_i4 build/bin/kv_bench rtn-int4+lm_head
run new_i8 build/bin/kv_bench rtn-int8+lm_head
run new_i4b build/bin/kv_bench rtn-int4+lm_head
run bf16b build/bin/kv_bench none
timeout 200 build/tests/run_tests --filter '@(step06_gpu/*|step06_egpu/*)' --jobs 8 > $OUT/gpu_tests.log 2>&1
echo "step06 gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -n1 $OUT/gpu_tests.log; grep -a '^\[FAIL\]' $OUT/gpu_tests.log
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu /opt/nvidia/nsight-compute/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
left=$(( 575 - ($(date +%s) - T0) ))
[ $left -gt 40 ] && timeout $left $NCU --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum \
    --launch-skip 4000 --launch-count 340 --csv build/bin/kv_bench $A --quant rtn-int4+lm_head --positions 64 > $OUT/ncu_i4.csv 2> $OUT/ncu_i4.err
echo "ncu rc $? at $(( $(date +%s) - T0 )) s, $(wc -l < $OUT/ncu_i4.csv) lines"
