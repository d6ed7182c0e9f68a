#!/usr/bin/env bash
# build kv_bench; compute-sanitizer racecheck (and memcheck) of k_attn_mma only, 1 to 130 positions
set -u
N=r3; R=/tmp/res/$N; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/$N.tgz -C /tmp/res $N; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .devdeps/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1; tail -1 $OUT/gpu.txt
make CUDA_ARCHS=90 NO_MPI=1 NO_NCCL=1 COMMIT=${COMMIT:-unknown} -j16 build/bin/kv_bench > $OUT/build.log 2>&1
echo "build rc $? at $(el) s"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
S="--device cuda --positions ${POS:-1,130} --reps 1 --no-ladders --csv"
for P in qwen3-0.6b llama-3.2-1b; do
timeout ${RT:-100} $CS --tool racecheck --racecheck-report hazard --kernel-name kns=k_attn_mma build/bin/kv_bench $S --preset $P > $OUT/racecheck_$P.txt 2>&1
echo "racecheck $P rc $? at $(el) s: $(tail -n 2 $OUT/racecheck_$P.txt | tr '\n' ' ')"
done
[ -n "${NOMEM:-}" ] || timeout 60 $CS --tool memcheck --kernel-name kns=k_attn_mma build/bin/kv_bench $S --preset qwen3-0.6b > $OUT/memcheck_qwen3.txt 2>&1
echo "memcheck qwen3 rc $? at $(el) s: $(tail -n 1 $OUT/memcheck_qwen3.txt)"
