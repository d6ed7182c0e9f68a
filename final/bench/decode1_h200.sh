#!/usr/bin/env bash
# decode1_h200.sh — batch-1 decode of the engine on a GPU, its variants side by side in one run.
#
#   bash final/bench/decode1_h200.sh MODEL_DIR OUT_DIR [reps]
#
# MODEL_DIR: a Hugging Face directory (tools/make_random_checkpoint.py llama-3.1-8b DIR writes a
# random one of the real shape). For each variant, `reps` times (default 2): `llm generate` of one
# 128-id prompt (ids 0..9999 drawn with seed 0), 256 new tokens, greedy, EOS ignored, CUDA graphs
# on; TPOT = (the last token's step end - the first's) / 255 on the engine's clock. Variants (the
# runner's switches, step04_batching/runner_gpu.cu):
#   unfused      LLM_B1_FUSED=0: the lone decode row as ~9 kernels a layer (RMSNorm, GEMV, SwiGLU apart)
#   fused        LLM_B1_FUSED=1 LLM_PDL=0: step07's batch-1 chain (norms and SwiGLU inside the GEMVs)
#   fused_pdl    LLM_B1_ATTN=0: the chain launched with programmatic dependent launch (sm_90)
#   pdl_part64, pdl_part128   LLM_B1_ATTN=0 LLM_B1_PART=64 / 128: fused_pdl with the paged attention
#                split into partitions of that many keys (paged_decode_v2: more CTAs, and a combine kernel)
#   pdl_fattn    the default: fused_pdl with the RoPE, the K/V write and the paged attention in
#                one kernel (step07's attn_fused2_paged)
# Then step03's own batch-1 decoder on the same directory (kv_bench, the contiguous cache, graphs),
# and step01's roofline --quick for this machine's copy bandwidth in the same run.
# Writes OUT_DIR/decode1_<variant>_<rep>.json, kv_bench.csv, roofline.txt, summary.txt.
set -euo pipefail
M=${1:?usage: decode1_h200.sh MODEL_DIR OUT_DIR [reps]}
OUT=${2:?OUT_DIR}
REPS=${3:-2}
BIN=${BIN:-build/bin}
mkdir -p "$OUT"
ids=$(python3 -c "import random; random.seed(0); print(','.join(str(random.randint(0, 9999)) for _ in range(128)))")
declare -A VARS=([unfused]="LLM_B1_FUSED=0" [fused]="LLM_B1_FUSED=1 LLM_PDL=0" [fused_pdl]="LLM_B1_ATTN=0"
                 [pdl_part64]="LLM_B1_ATTN=0 LLM_B1_PART=64" [pdl_part128]="LLM_B1_ATTN=0 LLM_B1_PART=128"
                 [pdl_fattn]="LLM_B1_ATTN=1")
: > "$OUT/summary.txt"
for v in ${VARIANTS:-unfused fused fused_pdl pdl_part64 pdl_fattn}; do
    for r in $(seq 1 "$REPS"); do
        f="$OUT/decode1_${v}_$r.json"
        env ${VARS[$v]} "$BIN/llm" generate --model "$M" --ids "$ids" --max-tokens 256 --ignore-eos --device cuda \
            --json > "$f" 2> "$OUT/decode1_${v}_$r.err"
        python3 - "$f" "$v" "$r" >> "$OUT/summary.txt" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["tpot_s"]
print(f"{sys.argv[2]:10s} rep {sys.argv[3]}: TPOT {t * 1e3:.4f} ms = {1 / t:.1f} tok/s, TTFT {d['ttft_s'] * 1e3:.2f} ms, "
      f"{len(d['output_ids'])} tokens")
EOF
    done
done
"$BIN/kv_bench" --device cuda --model "$M" --positions 1,128,256,383 --no-ladders --csv > "$OUT/kv_bench.csv" 2> "$OUT/kv_bench.err" || true
"$BIN/roofline" --device cuda --quick --no-save > "$OUT/roofline.txt" 2>&1 || true
cat "$OUT/summary.txt"
