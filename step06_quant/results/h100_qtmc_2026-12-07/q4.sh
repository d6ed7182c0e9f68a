#!/usr/bin/env bash
# as q3, trimmed to the time left: the chain tests first, then INT4+lm_head chain off / on
set -u
T0=$(date +%s)
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv | tee $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench build/tests/run_tests > /tmp/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -i " error" /tmp/build.log | head
timeout 60 build/tests/run_tests --filter '@(step06_gpu/gemv_chain*|step06_egpu/decode_chain*)' --jobs 2 --verbose > $OUT/chain_tests.log 2>&1
echo "chain tests rc $? at $(( $(date +%s) - T0 )) s"; grep -a "chain\]\|Synthesis\|FAIL" $OUT/chain_tests.log | head -16
KB="build/bin/kv_bench --device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv --quant rtn-int4+lm_head"
run() { local tag=$1; shift; env "$@" timeout 40 $KB > $OUT/kv_$tag.csv 2>/dev/null; echo "$tag rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1:' $OUT/kv_$tag.csv)"; }
run off QLINEAR_CHAIN=0
run ph4 QLINEAR_CHAIN=1
run ph1 QLINEAR_CHAIN=1 QLINEAR_CHAIN_PH=1
run ph4b QLINEAR_CHAIN=1
run offb QLINEAR_CHAIN=0
