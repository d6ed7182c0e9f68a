#!/usr/bin/env bash
# one call: build; k_qtmat GEMM tests; qgemm_bench T = 8, 16 with 1 / 2 strips a unit; batch 16 through llm bench
# (INT4 auto, bf16, INT4 one strip); batch-1 kv_bench on an H200; racecheck of k_qtmat (wide layers test)
set -u
N=${N:-r8}; R=/tmp/res/$N; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/$N.tgz -C /tmp/res $N; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( ${LIM:-585} - $(el) )); }
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $OUT/gpu.txt 2>&1; tail -1 $OUT/gpu.txt
MK="make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown}"
$MK -j16 build/bin/kv_bench build/bin/llm build/bin/qgemm_bench build/tests/run_tests > $OUT/build.log 2>&1
echo "build rc $? at $(el) s"; grep -i "error" $OUT/build.log | head
timeout 120 build/tests/run_tests --filter '@(step06_gpu/gemm*)' --jobs 4 > $OUT/gpu_tests_gemm.log 2>&1
echo "gemm tests rc $? at $(el) s"; tail -n1 $OUT/gpu_tests_gemm.log; grep -a 'FAIL\|Assert' $OUT/gpu_tests_gemm.log | head -10
qg() {  # name, env
  env $2 timeout 60 build/bin/qgemm_bench --T 8,16 --csv $OUT/qg_$1.csv > $OUT/qg_$1.txt 2>&1
  echo "qgemm $1 [$2] rc $? at $(el) s"; grep -a "int4" $OUT/qg_$1.txt | head -12
}
qg sp1 QLINEAR_QTMAT_SP=1
qg sp2 QLINEAR_QTMAT_SP=2
for QQ in rtn-int4+lm_head none rtn-int4+lm_head:1; do
  Q=${QQ%:*}; SP=0; [ "$QQ" != "$Q" ] && SP=${QQ#*:}; N2=$Q; [ $SP != 0 ] && N2=${Q}_sp$SP
  L=$(left); [ $L -gt 50 ] || break
  QLINEAR_QTMAT_SP=$SP timeout $(( L > 100 ? 100 : L - 10 )) build/bin/llm bench --preset llama-3.1-8b --trace nano --num-requests 32 --input-len 128:128 --output-len 256:256 --max-num-seqs 16 --device cuda --quant $Q --json > $OUT/b16_$N2.json 2> $OUT/b16_$N2.err
  echo "b16 $N2 rc $? at $(el) s: $(python3 -c "import json,sys;d=json.load(open('$OUT/b16_$N2.json'));print({k:d[k] for k in d if k!='requests' and not isinstance(d[k],(list,dict))})" 2>&1 | cut -c1-500)"
done
A="--device cuda --preset llama-3.1-8b --positions 1,64,128 --reps 1 --no-ladders --csv"
run() {  # name, args...
  local n=$1; shift
  timeout 40 build/bin/kv_bench $A "$@" > $OUT/kv_$n.csv 2> $OUT/kv_$n.err
  echo "$n rc $? at $(el) s: $(grep -a 'decode_batch1:' $OUT/kv_$n.csv | head -1 | sed 's/# decode_batch1: median step //') agree $(grep -a '^[0-9]' $OUT/kv_$n.csv | cut -d, -f13 | tr '\n' ' ')"
}
if grep -q H200 $OUT/gpu.txt; then
  for q in none rtn-int4+lm_head rtn-int8+lm_head; do [ $(left) -gt 45 ] && run $q --quant $q; done
fi
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
L=$(left); if [ $L -gt 30 ]; then
timeout $(( L - 10 )) $CS --tool racecheck --racecheck-report hazard build/tests/run_tests --filter step06_gpu/gemm_wide_layers_column_chunks -j1 > $OUT/racecheck_qtmat.txt 2>&1
echo "racecheck qtmat rc $? at $(el) s: $(tail -n 3 $OUT/racecheck_qtmat.txt | tr '\n' ' ')"; fi
