#!/usr/bin/env bash
# build (f8f3df5 + knobs QLINEAR_QTMA_NS / _NS_GU + a temporary DBG_SKIP); stage-count sweep; skip-a-kernel timings
set -u
N=q7; R=/tmp/res/$N; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/$N.tgz -C /tmp/res $N; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $OUT/gpu.txt 2>&1; tail -1 $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench > $OUT/build.log 2>&1
echo "build rc $? at $(( $(date +%s) - T0 )) s"; grep -i "error" $OUT/build.log | head
A="--device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv"
run() {  # name, env..., quant last
  local n=$1; shift; local q=${@: -1}; local e=("${@:1:$#-1}")
  timeout 60 env "${e[@]}" build/bin/kv_bench $A --quant $q > $OUT/kv_$n.csv 2> $OUT/kv_$n.err
  echo "$n rc $? at $(( $(date +%s) - T0 )) s: $(grep -a 'decode_batch1:' $OUT/kv_$n.csv | head -1 | sed 's/# decode_batch1: median step //')"
}
run bf16 X=1 none
run d48 X=1 rtn-int4+lm_head
run r56 QLINEAR_QTMA_RING_KB=56 rtn-int4+lm_head
for gu in 2 3 4; do for ns in 4 5 6 8; do run gu${gu}_ns${ns} QLINEAR_QTMA_NS_GU=$gu QLINEAR_QTMA_NS=$ns rtn-int4+lm_head; done; done
for sk in 2 1 4 8 16 6; do run skip$sk QLINEAR_QTMA_RING_KB=56 DBG_SKIP=$sk rtn-int4+lm_head; done
run skipbf2 DBG_SKIP=2 none
run r56b QLINEAR_QTMA_RING_KB=56 rtn-int4+lm_head
run bf16b X=1 none
