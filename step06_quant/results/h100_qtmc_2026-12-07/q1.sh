#!/usr/bin/env bash
# build; the chain tests; kv_bench bf16 / INT4+lm_head chain off/on (twice); then the step06 GPU tests
set -u
R=/tmp/res/q1; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/q1.tgz -C /tmp/res q1; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
source .devdeps/env.sh
{ nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv; } > $OUT/gpu.txt 2>&1
head -12 $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench build/bin/qgemm_bench build/tests/run_tests > $OUT/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -i "error" $OUT/build.log | head; tail -n2 $OUT/build.log
timeout 200 build/tests/run_tests --filter '@(step06_gpu/gemv_chain*|step06_egpu/decode_chain*)' --jobs 2 --verbose > $OUT/chain_tests.log 2>&1
echo "chain tests rc $? at $(( $(date +%s) - T0 )) s"; grep -a "chain\]\|Synthesis\|FAIL\|fail" $OUT/chain_tests.log | head -30
KB="build/bin/kv_bench --device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv"
i=0
for q in "none" "rtn-int4+lm_head --qchain 0" "rtn-int4+lm_head --qchain 1" "rtn-int4+lm_head --qchain 0" "rtn-int4+lm_head --qchain 1" "none"; do
  i=$((i+1)); timeout 120 $KB --quant $q > $OUT/kv_$i.csv 2> $OUT/kv_$i.err
  echo "kv $i ($q) rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1' $OUT/kv_$i.csv | head -2 | tr '\n' ' ')"
done
for ns in 3 2; do
  QLINEAR_CHAIN_NS=$ns timeout 120 $KB --quant rtn-int4+lm_head --qchain 1 > $OUT/kv_ns$ns.csv 2> $OUT/kv_ns$ns.err
  echo "kv ns $ns rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1' $OUT/kv_ns$ns.csv | head -1)"
done
timeout $(( 560 - ($(date +%s) - T0) )) build/tests/run_tests --filter '@(step06_gpu/*|step06_egpu/*)' --jobs 8 > $OUT/gpu_tests.log 2>&1
echo "step06 gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -n4 $OUT/gpu_tests.log
