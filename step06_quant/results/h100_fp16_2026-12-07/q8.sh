#!/usr/bin/env bash
# build; attention v2 vs v3 (bf16, INT4+lm, INT8+lm); step06 GPU tests with the 56 KB ring
set -u
N=q8; R=/tmp/res/$N; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/$N.tgz -C /tmp/res $N; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $OUT/gpu.txt 2>&1; tail -1 $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench build/tests/run_tests > $OUT/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -i "error" $OUT/build.log | head
A="--device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv"
run() {  # name, args...
  local n=$1; shift
  timeout 60 build/bin/kv_bench $A "$@" > $OUT/kv_$n.csv 2> $OUT/kv_$n.err
  echo "$n rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1:' $OUT/kv_$n.csv | head -1 | sed 's/# decode_batch1: median step //') agree $(grep -a '^[0-9]' $OUT/kv_$n.csv | cut -d, -f13 | tr '\n' ' ')"
}
run bf16_a2 --quant none --attn 2
run bf16_a3 --quant none --attn 3
run i4_a2 --quant rtn-int4+lm_head --attn 2
run i4_a3 --quant rtn-int4+lm_head --attn 3
run i8_a2 --quant rtn-int8+lm_head --attn 2
run i8_a3 --quant rtn-int8+lm_head --attn 3
run i4_a2b --quant rtn-int4+lm_head --attn 2
run i4_a3b --quant rtn-int4+lm_head --attn 3
run bf16_a3b --quant none --attn 3
run bf16_a2b --quant none --attn 2
left=$(( 480 - ($(date +%s) - T0) ))
timeout $left build/tests/run_tests --filter '@(step06_gpu/*|step06_egpu/*)' --jobs 8 > $OUT/gpu_tests.log 2>&1
echo "step06 gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -n1 $OUT/gpu_tests.log; grep -a '^\[FAIL\]' $OUT/gpu_tests.log
