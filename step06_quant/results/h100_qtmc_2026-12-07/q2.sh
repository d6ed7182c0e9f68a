#!/usr/bin/env bash
# build; kv_bench INT4+lm_head: chain off, and on with 1, 2, 4 layers a kernel, tiles two at a time, 2 stages; chain tests
set -u
R=/tmp/res/q2; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/q2.tgz -C /tmp/res q2; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench build/tests/run_tests > $OUT/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -i "error" $OUT/build.log | head
KB="build/bin/kv_bench --device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv --quant rtn-int4+lm_head"
run() { local tag=$1; shift; env "$@" timeout 100 $KB > $OUT/kv_$tag.csv 2> $OUT/kv_$tag.err; echo "$tag rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1:' $OUT/kv_$tag.csv)"; }
run off QLINEAR_CHAIN=0
run ph4 QLINEAR_CHAIN=1 QLINEAR_CHAIN_DEBUG=1
run ph1 QLINEAR_CHAIN=1 QLINEAR_CHAIN_PH=1
run ph2 QLINEAR_CHAIN=1 QLINEAR_CHAIN_PH=2
run ph4n2 QLINEAR_CHAIN=1 QLINEAR_CHAIN_N2=1
run ph1n2 QLINEAR_CHAIN=1 QLINEAR_CHAIN_PH=1 QLINEAR_CHAIN_N2=1
run ph1ns2 QLINEAR_CHAIN=1 QLINEAR_CHAIN_PH=1 QLINEAR_CHAIN_NS=2
run off2 QLINEAR_CHAIN=0
grep -a "qlinear_gpu_gemv_chain" $OUT/kv_ph4.err | sort | uniq -c | head
timeout 150 build/tests/run_tests --filter '@(step06_gpu/gemv_chain*|step06_egpu/decode_chain*)' --jobs 2 --verbose > $OUT/chain_tests.log 2>&1
echo "chain tests rc $? at $(( $(date +%s) - T0 )) s"; grep -a "chain\]\|Synthesis\|FAIL\|Assert\|----" $OUT/chain_tests.log | head -30
