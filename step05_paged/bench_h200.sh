#!/usr/bin/env bash
# bench_h200.sh — step05's kernel ladder on a GPU machine (after `make all`); results into OUTDIR.
#   step05_paged/bench_h200.sh OUTDIR          (BIN=build/bin by default)
# Files:
#   paged_attn_ladder_h200.csv   paged_attn_bench tables, one after the other (each with its own
#                                "# key: value" header: shape, device, copy bandwidth, the v1/v2 rule):
#     1-2  the acceptance shape: bf16, 32 query / 8 kv heads, head_dim 128, batch 32, block size 16,
#          context 4096 and 32768 (paged decode alone >= 80% of the copy bandwidth, KV bytes read / time)
#     3-4  the same at 4096 with block sizes 1 and 256 (what the block table costs)
#     5    batch 256 at 4096 (the rule picks v1: 2048 CTAs fill the chip without splitting)
#     6    batch 4 at 32768 (few CTAs: v2's split is what keeps the SMs busy)
#     7    fp16, head_dim 64, 16 query / 2 kv heads (GQA group 8), batch 16, context 2000, block size 16
set -u -o pipefail
OUT=${1:?usage: bench_h200.sh OUTDIR}
B=${BIN:-build/bin}
mkdir -p "$OUT"
L="$OUT/paged_attn_ladder_h200.csv"
: > "$L"
run() { echo "== paged_attn_bench $*"; "$B/paged_attn_bench" "$@" --csv 2>&1 | tee -a "$L"; echo >> "$L"; }
run --batch 32 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16
run --batch 32 --context 32768 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16
run --batch 32 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 1 --dtype bf16
run --batch 32 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 256 --dtype bf16
run --batch 256 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16
run --batch 4 --context 32768 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16
run --batch 16 --context 2000 --heads 16 --kv-heads 2 --head-dim 64 --block-size 16 --dtype fp16
# 8-9  the acceptance shapes with v2 partitions of 256 and 1024 keys (512 is the default)
run --batch 32 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16 --part 256
run --batch 32 --context 32768 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16 --part 1024
