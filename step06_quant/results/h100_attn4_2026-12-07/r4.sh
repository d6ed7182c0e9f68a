#!/usr/bin/env bash
# racecheck: is the sanitizer error v4's? v2 under the same command; v4 without PDL (--fused 1)
set -u
N=r4; R=/tmp/res/$N; mkdir -p $R; REAL_OUT=$OUT; OUT=$R
trap 'tar -czf $REAL_OUT/$N.tgz -C /tmp/res $N; ls -la $REAL_OUT' EXIT
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .devdeps/env.sh
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
S="--device cuda --positions 1,4 --reps 1 --no-ladders --csv --preset qwen3-0.6b"
timeout 50 $CS --tool racecheck --racecheck-report hazard --kernel-name kns=k_attn_fused2 build/bin/kv_bench $S --attn 2 > $OUT/rc_v2.txt 2>&1
echo "v2 rc $? at $(el) s: $(grep -a 'SUMMARY\|Internal\|error' $OUT/rc_v2.txt | head -3 | tr '\n' ' ')"
timeout 50 $CS --tool racecheck --racecheck-report hazard --kernel-name kns=k_attn_mma build/bin/kv_bench $S --attn 4 --fused 1 > $OUT/rc_v4_f1.txt 2>&1
echo "v4 fused1 rc $? at $(el) s: $(grep -a 'SUMMARY\|Internal\|error' $OUT/rc_v4_f1.txt | head -3 | tr '\n' ' ')"
