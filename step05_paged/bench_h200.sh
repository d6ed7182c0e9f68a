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
#     8-11 the acceptance shapes with v2 partitions of 512 and 2048 keys (1024 is the default)
#   paged_prefill_ladder_h200.csv   paged_attn_bench --op prefill tables: the fused prefill kernel, its
#                                SIMT kernel and the gather + GEMM path on one layer's chunks (64 x 64
#                                rows after 1024 cached positions, 8 x 512 from 0), Qwen3-0.6B heads
#                                (16 / 8, head_dim 128, bf16), block size 16, then 1 and 256
#   (E2E=1, the default) the engine end to end with batch_bench, random-weight Qwen3-0.6B (bf16, made
#   on the device), greedy:
#   bb_nano_slots_s16_h200.json    --trace nano, step04 slots: 16 sequences x 4096 positions
#   bb_nano_paged_b16_h200.json    --trace nano, step05 paged: the same KV tokens (4097 blocks of 16,
#                                  the null block included), up to 256 sequences
#                                  (acceptance: peak_running >= 3x, output_tok_s higher)
#   bb_prefix_on_h200.json, bb_prefix_off_h200.json    64 requests, a shared 1024-token prefix + 64
#                                  own ids, 64 output tokens, prefix cache on / off (acceptance:
#                                  ttft_ms_p50 >= 5x lower with it)
#   bb_prefix_on_outputs.jsonl, bb_prefix_off_outputs.jsonl    their output ids (identical: cmp below)
#   bb_prefix_bi_on_h200.json, bb_prefix_bi_off_h200.json (+ _outputs.jsonl)    the same pair with
#                                  --batch-invariant (a row's arithmetic never depends on the batch it
#                                  rides in, so the outputs are identical: the acceptance's pair)
#   (the first pair with the default prompt path, --prefill-attn fused: every chunk of a step in one
#   paged prefill launch per layer)
#   bb_prefix_on_gather_h200.json, bb_prefix_off_gather_h200.json    the same with --prefill-attn
#                                  gather (per sequence: a gather through the table + the GEMM path)
set -u -o pipefail
OUT=${1:?usage: bench_h200.sh OUTDIR}
B=${BIN:-build/bin}
mkdir -p "$OUT"
L="$OUT/paged_attn_ladder_h200.csv"
if [ "${LADDER:-1}" = 1 ]; then  # LADDER=0: only the end-to-end runs below
: > "$L"
run() { echo "== paged_attn_bench $*"; "$B/paged_attn_bench" "$@" --csv 2>&1 | tee -a "$L"; echo >> "$L"; }
run --batch 32 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16
run --batch 32 --context 32768 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16
run --batch 32 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 1 --dtype bf16
run --batch 32 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 256 --dtype bf16
run --batch 256 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16
run --batch 4 --context 32768 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16
run --batch 16 --context 2000 --heads 16 --kv-heads 2 --head-dim 64 --block-size 16 --dtype fp16
for part in 512 2048; do
  run --batch 32 --context 4096 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16 --part $part
  run --batch 32 --context 32768 --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16 --part $part
done
P="$OUT/paged_prefill_ladder_h200.csv"
: > "$P"
for bs in 16 1 256; do
  echo "== paged_attn_bench --op prefill --block-size $bs"
  "$B/paged_attn_bench" --op prefill --heads 16 --kv-heads 8 --head-dim 128 --block-size "$bs" --dtype bf16 --csv 2>&1 | tee -a "$P"
  echo >> "$P"
done
fi

[ "${E2E:-1}" = 1 ] || exit 0
bb() { tag=$1; shift; echo "== batch_bench $*"; "$B/batch_bench" --preset qwen3-0.6b --device cuda --json "$@" \
         > "$OUT/bb_${tag}_h200.json" 2> "$OUT/bb_${tag}_h200.log" || echo "batch_bench $tag failed (see $OUT/bb_${tag}_h200.log)"
       python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print("\n".join(f"  {k}: {v}" for k,v in s.items() if k in ("kv_layout","prefill_attn","peak_running","output_tok_s","total_tok_s","ttft_ms_p50","prefix_hit_rate","preemptions","kv_unused_frac","num_blocks","block_size")))' \
         "$OUT/bb_${tag}_h200.json" || true; }
bb nano_slots_s16 --trace nano --max-num-seqs 16 --max-model-len 4096
bb nano_paged_b16 --trace nano --kv paged --block-size 16 --num-blocks 4097 --max-num-seqs 256 --max-model-len 4096
PFX=(--trace nano --num-requests 64 --shared-prefix 1024 --input-len 64:64 --output-len 64:64 --kv paged --block-size 16)
bb prefix_on "${PFX[@]}" --prefix-cache on --outputs "$OUT/bb_prefix_on_outputs.jsonl"
bb prefix_off "${PFX[@]}" --prefix-cache off --outputs "$OUT/bb_prefix_off_outputs.jsonl"
bb prefix_on_gather "${PFX[@]}" --prefix-cache on --prefill-attn gather --outputs "$OUT/bb_prefix_on_gather_outputs.jsonl"
bb prefix_off_gather "${PFX[@]}" --prefix-cache off --prefill-attn gather --outputs "$OUT/bb_prefix_off_gather_outputs.jsonl"
bb prefix_bi_on "${PFX[@]}" --prefix-cache on --batch-invariant --outputs "$OUT/bb_prefix_bi_on_outputs.jsonl"
bb prefix_bi_off "${PFX[@]}" --prefix-cache off --batch-invariant --outputs "$OUT/bb_prefix_bi_off_outputs.jsonl"
for p in "" _gather _bi; do
  on="$OUT/bb_prefix_on${p}_outputs.jsonl" off="$OUT/bb_prefix_off${p}_outputs.jsonl"
  [ "$p" = _bi ] && on="$OUT/bb_prefix_bi_on_outputs.jsonl" off="$OUT/bb_prefix_bi_off_outputs.jsonl"
  if cmp -s "$on" "$off"; then echo "prefix cache on/off${p}: outputs identical"
  else echo "prefix cache on/off${p}: OUTPUTS DIFFER"; fi
done
if cmp -s "$OUT/bb_prefix_on_outputs.jsonl" "$OUT/bb_prefix_on_gather_outputs.jsonl"; then echo "fused/gather prefill: outputs identical"
else echo "fused/gather prefill: outputs differ (bf16 rounding differs between the paths; compare by vLLM's rule)"; fi
