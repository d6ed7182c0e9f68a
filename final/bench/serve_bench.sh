#!/usr/bin/env bash
# serve_bench.sh — `llm serve` measured with vLLM's own benchmark client (`vllm bench serve`), as
# vLLM's server is measured: random 1024-token text prompts to /v1/completions, streamed, with
# stream_options.include_usage, ignore_eos and max_tokens 128, at each concurrency in a list.
#   bash final/bench/serve_bench.sh MODEL_DIR RESULT_DIR [extra `llm serve` options...]
#   env: CONCURRENCY ("1 16 64 256"), NUM_PROMPTS (default 4 x the concurrency, at least 64),
#        IN_LEN (1024), OUT_LEN (128), PORT (8000), LLM (build/bin/llm), DEVICE (cuda),
#        READY_TIMEOUT (600 s), PYTHON (python3: one that imports vllm),
#        SERVER (llm, or vllm: `vllm serve MODEL_DIR --max-model-len 4096` with the extra options instead,
#        measured by the same client loop; results vllm_serve_c<C>.json, log vllm_serve.log)
# It starts `llm serve --model MODEL_DIR --device $DEVICE` (or `vllm serve`) on 127.0.0.1:$PORT,
# waits for /health, runs the client once per concurrency (TTFT, TPOT, ITL and end-to-end latency, p50 and
# p99 of each; results: RESULT_DIR/<server>_serve_c<C>.json,
# the client's --save-result files), keeps the server's /metrics, then SIGTERMs the server (which
# drains) and waits for it. The server's log is RESULT_DIR/<server>_serve.log. MODEL_DIR needs a
# tokenizer: the client makes its prompts with it. Both servers, one after the other, on one GPU:
#   bash final/bench/serve_bench.sh DIR out/ --max-model-len 4096 && SERVER=vllm bash final/bench/serve_bench.sh DIR out/
set -uo pipefail
MODEL=${1:?usage: serve_bench.sh MODEL_DIR RESULT_DIR [llm serve options]}
OUT=${2:?usage: serve_bench.sh MODEL_DIR RESULT_DIR [llm serve options]}
shift 2
CONCURRENCY=${CONCURRENCY:-"1 16 64 256"}
PORT=${PORT:-8000}
LLM=${LLM:-build/bin/llm}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
SERVER=${SERVER:-llm}
LOG="$OUT/${SERVER}_serve.log"

case "$SERVER" in
llm) "$LLM" serve --model "$MODEL" --device "$DEVICE" --host 127.0.0.1 --port "$PORT" "$@" >"$LOG" 2>&1 & ;;
vllm) # its own process group (setsid), so that its engine-core processes stop with it
    setsid "$PYTHON" -m vllm.entrypoints.cli.main serve "$MODEL" --host 127.0.0.1 --port "$PORT" --max-model-len 4096 "$@" \
        >"$LOG" 2>&1 & ;;
*) echo "SERVER must be llm or vllm (got $SERVER)" >&2; exit 2 ;;
esac
SPID=$!
stop_server() {
    local who="$SPID"
    [ "$SERVER" = vllm ] && who="-$SPID"  # the whole process group
    if kill -0 "$SPID" 2>/dev/null; then
        kill -TERM -- "$who"
        for _ in $(seq 1 60); do kill -0 "$SPID" 2>/dev/null || break; sleep 1; done
        kill -0 "$SPID" 2>/dev/null && { echo "$SERVER serve did not drain within 60 s: killed"; kill -KILL -- "$who"; }
    fi
    wait "$SPID" 2>/dev/null
}
trap stop_server EXIT
trap 'exit 143' TERM INT

t0=$(date +%s)
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
    if ! kill -0 "$SPID" 2>/dev/null; then echo "$SERVER serve exited at start; its log:"; tail -40 "$LOG"; exit 1; fi
    if (($(date +%s) - t0 > ${READY_TIMEOUT:-600})); then echo "$SERVER serve not ready; its log:"; tail -40 "$LOG"; exit 1; fi
    sleep 1
done
echo "$SERVER serve ready after $(($(date +%s) - t0)) s ($LOG)"

rc=0
for C in $CONCURRENCY; do
    N=${NUM_PROMPTS:-$((4 * C > 64 ? 4 * C : 64))}
    echo "== concurrency $C, $N prompts"
    "$PYTHON" -m vllm.entrypoints.cli.main bench serve --backend openai \
        --base-url "http://127.0.0.1:$PORT" --model "$MODEL" \
        --dataset-name random --random-input-len "${IN_LEN:-1024}" --random-output-len "${OUT_LEN:-128}" \
        --num-prompts "$N" --max-concurrency "$C" --ignore-eos \
        --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
        --save-result --result-dir "$OUT" --result-filename "${SERVER}_serve_c$C.json" || rc=$?
done
curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/${SERVER}_serve_metrics.txt"
echo "bench rc=$rc; results in $OUT; /metrics in $OUT/${SERVER}_serve_metrics.txt"
exit $rc
