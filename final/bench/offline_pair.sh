#!/usr/bin/env bash
# offline_pair.sh — the engine and vLLM on one offline workload, each run several times, around each
# other, so that the ratio is of medians measured under the same conditions:
#
#   bash final/bench/offline_pair.sh MODEL_DIR REQUESTS.jsonl OUT_DIR [N]
#
# Order: the engine N times (`llm bench --requests ... --device cuda --max-num-seqs 256
# --max-num-batched-tokens 16384 --max-model-len 4096 --json`, a fresh process each: loading, warm-up,
# then the timed run), vLLM once started and timed N times (`peer_bench.py --engine vllm --repeat N`:
# one warm-up generate(), then N timed generate() calls of all the requests, vLLM's prefix cache emptied
# before each so that no call finds the prompts of the one before it cached: the engine's timed run
# never does), the engine N times again.
# N defaults to 3. Writes OUT_DIR/engine_<k>.json (k = 1 .. 2N), vllm.json, summary.txt: every run's
# output tok/s, each side's median, and the ratio of the medians. env: LLM (build/bin/llm), PYTHON
# (python3: one that imports vllm for its part), ENGINE_OPTS (extra `llm bench` options), DEVICE (cuda).
set -euo pipefail
M=${1:?usage: offline_pair.sh MODEL_DIR REQUESTS.jsonl OUT_DIR [N]}
REQ=${2:?usage: offline_pair.sh MODEL_DIR REQUESTS.jsonl OUT_DIR [N]}
OUT=${3:?usage: offline_pair.sh MODEL_DIR REQUESTS.jsonl OUT_DIR [N]}
N=${4:-3}
LLM=${LLM:-build/bin/llm}
PYTHON=${PYTHON:-python3}
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "N must be a positive integer (got $N)" >&2; exit 2; }
[ -f "$REQ" ] || { echo "no request file $REQ" >&2; exit 2; }
mkdir -p "$OUT"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
engine() {
    local k=$1
    # shellcheck disable=SC2086
    "$LLM" bench --model "$M" --requests "$REQ" --device "${DEVICE:-cuda}" --max-num-seqs 256 --max-num-batched-tokens 16384 \
        --max-model-len 4096 --json ${ENGINE_OPTS:-} > "$OUT/engine_$k.json" 2> "$OUT/engine_$k.err"
    echo "engine run $k: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['output_tok_s'])" "$OUT/engine_$k.json") output tok/s"
}
for k in $(seq 1 "$N"); do engine "$k"; done
"$PYTHON" "$here/peer_bench.py" --engine vllm --model-dir "$M" --requests "$REQ" --repeat "$N" --max-model-len 4096 \
    --out "$OUT/vllm.json" > "$OUT/vllm.log" 2>&1 || { echo "vLLM failed; its log:"; tail -20 "$OUT/vllm.log"; exit 1; }
echo "vLLM: $(tail -1 "$OUT/vllm.log")"
for k in $(seq $((N + 1)) $((2 * N))); do engine "$k"; done
python3 - "$OUT" "$N" > "$OUT/summary.txt" <<'EOF'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
eng = [json.load(open(f"{out}/engine_{k}.json"))["summary"]["output_tok_s"] for k in range(1, 2 * n + 1)]
v = json.load(open(f"{out}/vllm.json"))["results"]
vl = v.get("runs_output_tok_s", [v["output_tok_s"]])
me, mv = statistics.median(eng), statistics.median(vl)
print(f"engine output tok/s, runs 1..{n} before vLLM, {n + 1}..{2 * n} after: " + ", ".join(f"{x:,.0f}" for x in eng))
print(f"vLLM output tok/s, {len(vl)} timed generate() calls: " + ", ".join(f"{x:,.0f}" for x in vl))
print(f"median engine {me:,.0f} / median vLLM {mv:,.0f} = {me / mv:.3f}x "
      f"(engine min..max {min(eng):,.0f}..{max(eng):,.0f}; vLLM {min(vl):,.0f}..{max(vl):,.0f})")
EOF
cat "$OUT/summary.txt"
