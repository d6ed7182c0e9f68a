#!/usr/bin/env bash
# build; kv_bench attention v2 vs v4 on the 8B shape; GPU tests of the decode step (step03 fused
# modes with attention v4) and step06's engine; ncu of k_attn_mma; compute-sanitizer on v4
set -u
N=r2; R=/tmp/res/$N; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/$N.tgz -C /tmp/res $N; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( 570 - $(el) )); }
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $OUT/gpu.txt 2>&1; tail -1 $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench build/tests/run_tests > $OUT/build.log 2>&1
echo "build rc $? at $(el) s"; grep -i "error" $OUT/build.log | head
A="--device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv"
run() {  # name, env shape, args...
  local n=$1; local sh=$2; shift 2
  QLINEAR_QTMA_SHAPE="$sh" timeout 60 build/bin/kv_bench $A "$@" > $OUT/kv_$n.csv 2> $OUT/kv_$n.err
  echo "$n [$sh] rc $? at $(el) s: $(grep -a 'decode_batch1:' $OUT/kv_$n.csv | head -1 | sed 's/# decode_batch1: median step //') agree $(grep -a '^[0-9]' $OUT/kv_$n.csv | cut -d, -f13 | tr '\n' ' ')"
}
I4="--quant rtn-int4+lm_head"
run bf16_a2 "" --quant none --attn 2
run bf16_a4 "" --quant none --attn 4
run i4_a2 "" $I4 --attn 2
run i4_a4 "" $I4 --attn 4
run i8_a4 "" --quant rtn-int8+lm_head --attn 4
run i4_a4_o8 "4096x4096:8" $I4 --attn 4
run i4_a4_o8q5 "4096x4096:8,6144x4096:5" $I4 --attn 4
run i4_a2b "" $I4 --attn 2
run i4_a4b "" $I4 --attn 4
run bf16_a4b "" --quant none --attn 4
timeout $(( $(left) > 150 ? 150 : $(left) )) build/tests/run_tests --filter '@(step03/gpu_*|step06_egpu/*)' --jobs 8 > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc $? at $(el) s"; tail -n1 $OUT/gpu_tests.log; grep -a '^\[FAIL\]\|fused-decode\]' $OUT/gpu_tests.log | head -20
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 $NCU --clock-control none --cache-control none --graph-profiling node --set full --import-source no \
  -k regex:k_attn_mma --launch-skip 300 --launch-count 1 -o $OUT/att4_i4 -f \
  build/bin/kv_bench $A $I4 --positions 64 > $OUT/ncu_att4.log 2>&1
echo "ncu rc $? at $(el) s"
$NCU -i $OUT/att4_i4.ncu-rep --page details > $OUT/att4_details.txt 2>&1
grep -a "Duration\|Elapsed Cycles\|SM Active Cycles\|Registers Per\|Executed Instructions  " $OUT/att4_details.txt
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
S="--device cuda --positions 1,130 --reps 1 --no-ladders --csv"
L=$(left); if [ $L -gt 30 ]; then
timeout $(( L > 100 ? 100 : L )) $CS --tool memcheck build/bin/kv_bench $S --preset tinyllama-1.1b > $OUT/memcheck_tinyllama.txt 2>&1
echo "memcheck rc $? at $(el) s: $(tail -n 2 $OUT/memcheck_tinyllama.txt | tr '\n' ' ')"; fi
L=$(left); if [ $L -gt 30 ]; then
timeout $(( L > 100 ? 100 : L )) $CS --tool racecheck --racecheck-report hazard build/bin/kv_bench $S --preset qwen3-0.6b > $OUT/racecheck_qwen3.txt 2>&1
echo "racecheck rc $? at $(el) s: $(tail -n 2 $OUT/racecheck_qwen3.txt | tr '\n' ' ')"; fi
