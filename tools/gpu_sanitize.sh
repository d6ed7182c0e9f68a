#!/usr/bin/env bash
# gpu_sanitize.sh — the GPU tests under NVIDIA compute-sanitizer, one tool after the other:
#   memcheck --leak-check full   invalid or misaligned device accesses, and device memory (cudaMalloc,
#                                cuBLAS workspaces, ...) still allocated when a test process ends
#   racecheck                    shared-memory data races inside a kernel. Every kernel is checked,
#                                cuBLAS's too; each hazard is attributed to the kernel it was found in,
#                                and the verdict counts the project's kernels: racecheck reports
#                                cuBLAS's warp-specialized GEMMs (nvjet*, ...: RACECHECK_LIBRARY) as
#                                potential hazards, which are listed but are not the project's code.
#                                (Leaving those kernels out with --kernel-name-exclude would be faster,
#                                but compute-sanitizer 2025.3 then stops every test with "Internal
#                                Sanitizer Error: failed to handle a hardware exception".)
#   synccheck                    __syncthreads / barrier misuse (divergent or invalid barriers)
# When memcheck finds errors it also sorts them (LOG_DIR/memcheck_kinds.txt, printed): CUDA API
# calls that returned an error, by error and call and by who made the call (the program, or a
# library such as NCCL probing the driver), and invalid device accesses by kernel. API errors
# raised inside NCCL (MEMCHECK_LIBRARY, default libnccl) are listed and not counted as the project's.
# One summary line per tool, the full output in LOG_DIR/<tool>.log; exits 1 on any sanitizer
# error, on a failing test, or when the GPU tests do not really run (no GPU: they would skip).
#
#   make gpu-sanitize                                  (builds first, then calls this script)
#   tools/gpu_sanitize.sh build/tests/run_tests ['@(*/gpu_*|step04_gpu/*|step05_gpu/*|step06_gpu/*|step06_egpu/*)'] [memcheck racecheck synccheck]
# Environment: COMPUTE_SANITIZER (the binary; default: on PATH, else /usr/local/cuda/bin),
#              GPU_SANITIZE_OUT (log directory; default build/gpu-sanitize),
#              GPU_SANITIZE_JOBS (default 1: one sanitized run of all tests; N: each test in its own
#              sanitized process, N at a time; racecheck over every test takes more than 10 minutes
#              in one process on an H200 machine).
#
# How it runs the tests: Criterion starts every test in a child process, so compute-sanitizer gets
# --target-processes all (each child is checked; each prints its own ERROR SUMMARY line, which are
# summed here) and the tests run one at a time (--jobs 1) so the logs do not interleave.
set -uo pipefail

bin=${1:?usage: gpu_sanitize.sh TEST_BINARY [FILTER] [TOOLS...]}
filter=${2:-'@(*/gpu_*|step04_gpu/*|step05_gpu/*|step06_gpu/*|step06_egpu/*)'}
shift $(($# >= 2 ? 2 : $#))
tools=${*:-memcheck racecheck synccheck}
out=${GPU_SANITIZE_OUT:-build/gpu-sanitize}
cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer 2>/dev/null || echo /usr/local/cuda/bin/compute-sanitizer)}

fail() { echo "gpu-sanitize: $*" >&2; exit 1; }
[ -x "$bin" ] || fail "cannot run: no test binary $bin (build it with make first)"
[ -x "$cs" ] || fail "cannot run: compute-sanitizer not found at '$cs' (it comes with the CUDA Toolkit; put it on PATH or set COMPUTE_SANITIZER=/path/to/compute-sanitizer)"
mkdir -p "$out" || fail "cannot create $out"

# A number from Criterion's JSON report: the first (top-level) "key": N.
jnum() { grep -m1 -o "\"$1\": [0-9]*" "$2" | grep -o '[0-9]*$' || echo 0; }

# 1. Without the sanitizer: the GPU tests must run (not skip) and pass, or nothing below means anything.
"$bin" --filter "$filter" --jobs 1 --verbose=0 --json="$out/plain.json" >"$out/plain.log" 2>&1
rc=$?
nskip=$(grep -c '"no CUDA device' "$out/plain.json" 2>/dev/null)
npass=$(jnum passed "$out/plain.json")
if [ "${nskip:-0}" -gt 0 ]; then
    why=$(grep -m1 -o '"no CUDA device[^"]*' "$out/plain.json" | tr -d '"')
    fail "cannot run: $nskip GPU test(s) skip here ($why); this target needs a machine with a CUDA GPU"
fi
[ "$rc" -eq 0 ] || fail "the GPU tests fail even without the sanitizer (rc $rc); see $out/plain.log"
[ "$npass" -gt 0 ] || fail "no test matches --filter '$filter'"
echo "gpu-sanitize: $npass tests match '$filter' and pass without the sanitizer ($("$cs" --version | grep -m1 -o 'Version.*'))"

# The tests that ran and passed, as suite/name filters (for GPU_SANITIZE_JOBS > 1).
njobs=${GPU_SANITIZE_JOBS:-1}
gpu_tests=()
if [ "$njobs" -gt 1 ]; then
    mapfile -t gpu_tests < <(python3 -c '
import json, sys
for s in json.load(open(sys.argv[1]))["test_suites"]:
    for t in s["tests"]:
        if t["status"] == "PASSED": print(s["name"] + "/" + t["name"])' "$out/plain.json") ||
        fail "cannot list the tests of $out/plain.json (python3 is needed for GPU_SANITIZE_JOBS > 1)"
    echo "gpu-sanitize: ${#gpu_tests[@]} tests, $njobs sanitized processes at a time"
fi

# 2. Each tool over the same tests.
# racecheck instruments every kernel: with compute-sanitizer 2025.3 a kernel filter
# (--kernel-name kns=k_, or --kernel-name-exclude of cuBLAS's kernels) stops every test that runs
# a cuBLAS kernel with an "Internal Sanitizer Error" (measured on an H200).
# racecheck runs the whole-model tests on one checkpoint (TEST_MODELS, see tests/golden_util.h):
# the kernels are the same for every model of the test set, and each model costs minutes under
# racecheck's instrumentation (over the 300 s a test may take with all of them, measured on an
# H200). RACECHECK_MODELS= (empty) keeps them all; memcheck and synccheck always run them all.
rc_models=${RACECHECK_MODELS-qwen3_qknorm_bf16}
# Tests that run programs bound each command with `timeout ${TEST_CMD_TIMEOUT:-120}`; a sanitized
# process runs many times slower
export TEST_CMD_TIMEOUT=${TEST_CMD_TIMEOUT:-600}
bad=0
for tool in $tools; do
    case $tool in
    memcheck) opts=(--tool memcheck --leak-check full) ;;
    racecheck) opts=(--tool racecheck --racecheck-report all) ;;
    synccheck) opts=(--tool synccheck) ;;
    *) fail "unknown tool '$tool' (memcheck, racecheck or synccheck)" ;;
    esac
    log="$out/$tool.log" json="$out/$tool.json"
    models=""
    [ "$tool" = racecheck ] && models=$rc_models
    start=$(date +%s)
    # racecheck: no --error-exitcode (a hazard inside cuBLAS would fail the test process); its
    # hazards are counted from the log below, per kernel
    errexit=(--error-exitcode 1)
    [ "$tool" = racecheck ] && errexit=()
    if [ "$njobs" -le 1 ]; then
        TEST_MODELS=$models "$cs" "${opts[@]}" "${errexit[@]}" --target-processes all \
            "$bin" --filter "$filter" --jobs 1 --verbose=0 --json="$json" >"$log" 2>&1
        rc=$?
        passed=$(jnum passed "$json") failed=$(jnum failed "$json") errored=$(jnum errored "$json")
    else
        # GPU_SANITIZE_JOBS=N: every test in its own sanitized process, N at a time (the GPU is
        # shared; what the sanitizer costs is mostly host time), logs concatenated in test order
        d="$out/$tool.d"
        rm -rf "$d" && mkdir -p "$d" || fail "cannot create $d"
        i=0
        for t in "${gpu_tests[@]}"; do
            while [ "$(jobs -rp | wc -l)" -ge "$njobs" ]; do wait -n; done
            n=$(printf '%03d' $i)
            ( TEST_MODELS=$models "$cs" "${opts[@]}" "${errexit[@]}" --target-processes all \
                  "$bin" --filter "$t" --jobs 1 --verbose=0 --json="$d/$n.json" >"$d/$n.log" 2>&1
              r=$?
              # a test that makes no CUDA call at all (common/gpu_info_* when a GPU is present asks
              # nothing the sanitizer hooks): nothing to check, not an error, when the test passed
              if [ "$r" = 255 ] && grep -q 'terminated before first instrumented API call' "$d/$n.log" &&
                  [ "$(jnum passed "$d/$n.json")" -ge 1 ]; then
                  r=0; echo "========= ERROR SUMMARY: 0 errors (no CUDA call to check)" >>"$d/$n.log"
              fi
              echo $r >"$d/$n.rc" ) &
            i=$((i + 1))
        done
        wait
        cat "$d"/*.log >"$log"
        rc=0 passed=0 failed=0 errored=0
        for f in "$d"/*.rc; do [ "$(cat "$f")" = 0 ] || rc=1; done
        for f in "$d"/*.json; do
            passed=$((passed + $(jnum passed "$f"))) failed=$((failed + $(jnum failed "$f"))) errored=$((errored + $(jnum errored "$f")))
        done
    fi
    secs=$(($(date +%s) - start))
    # One "========= ERROR SUMMARY: N error(s)" line (racecheck: "RACECHECK SUMMARY: N hazards
    # displayed (E errors, W warnings)") per process the sanitizer attached to.
    nproc=$(grep -cE '(ERROR|RACECHECK) SUMMARY:' "$log")
    nerr=$(grep -o 'ERROR SUMMARY: [0-9]*' "$log" | awk '{s += $3} END {print s + 0}')
    nleak=$(grep -c 'Leaked [0-9]* bytes' "$log")
    status=clean
    if [ "$tool" = racecheck ]; then
        # the kernel each hazard was found in, from the access lines that follow its report
        grep -A3 'hazard detected' "$log" | grep -o ' at [A-Za-z_][A-Za-z0-9_<>:, ]*+0x' | sed 's/^ at //; s/+0x$//' |
            sort | uniq -c >"$out/racecheck_kernels.txt"
        [ -s "$out/racecheck_kernels.txt" ] && { echo "gpu-sanitize: racecheck hazards by kernel:"; cat "$out/racecheck_kernels.txt"; }
        lib=${RACECHECK_LIBRARY:-nvjet|xmma|cutlass|gemv|gemmSN|splitKreduce|cublas}
        nlib=$(grep -E "$lib" "$out/racecheck_kernels.txt" | awk '{s += $1} END {print s + 0}')
        nown=$(grep -vE "$lib" "$out/racecheck_kernels.txt" | awk '{s += $1} END {print s + 0}')
        nhaz=$(grep -c 'hazard detected' "$log")
        # hazards whose kernel could not be named count as the project's
        nown=$((nhaz - nlib > nown ? nhaz - nlib : nown))
        echo "gpu-sanitize: racecheck: $nhaz hazard report(s); the accesses they name: $nown in the project's kernels, $nlib inside cuBLAS's kernels ($lib)"
        nerr=$nown
    fi
    if [ "$tool" = memcheck ] && [ "$nerr" -gt 0 ]; then
        # what the errors are, so that the summary line attributes them even when only it comes
        # back: CUDA API calls that returned an error (by error and call, and whether the call was
        # made from inside a library such as NCCL: its first host frames name the .so), and
        # device accesses (by the kernel they were found in)
        awk '/Program hit .* on CUDA API call to / {
                 if (cur != "") n[cur " " lib]++
                 e = $0; sub(/.*Program hit /, "", e); sub(/ due to .* on CUDA API call to /, " on ", e); sub(/\.$/, "", e)
                 cur = e; lib = "(from the program)"; frames = 0; next }
             cur != "" && /Host Frame/ { frames++ }
             cur != "" && frames <= 3 && /in [^ ]*\.so/ && !/libcuda\.so|libcudart|libsanitizer|libTreeLauncher/ {
                 l = $0; sub(/.* in /, "", l); sub(/.*\//, "", l); if (lib == "(from the program)") lib = "(inside " l ")" }
             END { if (cur != "") n[cur " " lib]++; for (k in n) printf "%6d  API error: %s\n", n[k], k }' "$log" >"$out/memcheck_kinds.txt"
        grep -A3 -E 'Invalid __(global|shared|local)__|Misaligned|Out-of-range|Address .* is out of bounds' "$log" |
            grep -o ' at [A-Za-z_][A-Za-z0-9_<>:, ()*&]*+0x' | sed 's/^ at /  access error in kernel: /; s/+0x$//' |
            sort | uniq -c >>"$out/memcheck_kinds.txt"
        echo "gpu-sanitize: memcheck's errors by kind ($out/memcheck_kinds.txt):"
        sort -rn "$out/memcheck_kinds.txt" | head -20
        # A CUDA API call that returned an error inside NCCL (MEMCHECK_LIBRARY) is NCCL asking the
        # driver about its own kernels (cudaFuncGetAttributes on an image not built for this GPU,
        # cuGetProcAddress on symbols this driver lacks) and handling the answer: listed, not the
        # project's. It still makes the process exit with --error-exitcode, so rc is judged by the
        # project's errors and the tests' verdicts then.
        mlib=${MEMCHECK_LIBRARY:-libnccl}
        nlib=$(grep -E "API error: .*\(inside ($mlib)" "$out/memcheck_kinds.txt" | awk '{s += $1} END {print s + 0}')
        if [ "$nlib" -gt 0 ]; then
            echo "gpu-sanitize: memcheck: $nlib API error(s) raised inside $mlib, not the project's calls"
            nerr=$((nerr - nlib))
            [ "$nerr" -eq 0 ] && rc=0
        fi
    fi
    nint=$(grep -c 'Internal Sanitizer Error' "$log")
    if [ "$nproc" -eq 0 ]; then
        status="FAILED (no ERROR SUMMARY line: the sanitizer did not check the test processes)"
    elif [ "$nint" -gt 0 ]; then
        status="FAILED ($nint internal sanitizer error(s): the sanitizer itself failed)"
    elif [ "$nerr" -gt 0 ] || [ "$rc" -ne 0 ] || [ "$failed" -gt 0 ] || [ "$errored" -gt 0 ] || [ "$passed" -ne "$npass" ]; then
        status="FAILED"
    fi
    [ "$status" = clean ] || bad=1
    extra=""
    [ "$tool" = memcheck ] && extra=", $nleak leak(s)"
    echo "gpu-sanitize: ${opts[*]}: $nerr error(s)$extra in $nproc process(es); tests $passed passed, $((failed + errored)) failed; rc $rc; ${secs}s: $status (log $log)"
done
if [ "$bad" -ne 0 ]; then
    echo "gpu-sanitize: FAILED: see the logs above (grep -n '=========' on them shows each report)" >&2
    exit 1
fi
echo "gpu-sanitize: clean ($tools)"
