#!/usr/bin/env bash
set -u
R=/tmp/res/q3; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/q3.tgz -C /tmp/res q3; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench build/tests/run_tests > $OUT/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -i " error" $OUT/build.log | head
KB="build/bin/kv_bench --device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv"
run() { local tag=$1 q=$2; shift 2; env "$@" timeout 60 $KB --quant $q > $OUT/kv_$tag.csv 2> $OUT/kv_$tag.err; echo "$tag rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1:' $OUT/kv_$tag.csv)"; }
run off rtn-int4+lm_head QLINEAR_CHAIN=0
run ph4 rtn-int4+lm_head QLINEAR_CHAIN=1
run ph1 rtn-int4+lm_head QLINEAR_CHAIN=1 QLINEAR_CHAIN_PH=1
run ph4b rtn-int4+lm_head QLINEAR_CHAIN=1
run offb rtn-int4+lm_head QLINEAR_CHAIN=0
run bf16 none
timeout 90 build/tests/run_tests --filter '@(step06_gpu/gemv_chain*|step06_egpu/decode_chain*)' --jobs 2 --verbose > $OUT/chain_tests.log 2>&1
echo "chain tests rc $? at $(( $(date +%s) - T0 )) s"; grep -a "chain\]\|Synthesis\|FAIL" $OUT/chain_tests.log | head -16
