# step05_paged: the KV block manager (kv_blocks.c), the paged attention kernels
# (paged_attention.cu, their CPU references in paged_attention_cpu.c) and their ladder
# (paged_attn_bench). Tests: build/tests/run_tests --filter 'step05/*' and 'step05_gpu/*'.
PROGS_step05_paged := paged_attn_bench

# The demo: the ladder at a small shape. Without a GPU it runs the fp32 CPU reference alone
# (and says the CUDA rows are skipped); with one, every kernel is checked against it and timed.
demo-step05_paged: $(BIN)/paged_attn_bench
	$(BIN)/paged_attn_bench --batch 4 --context 1000 --heads 8 --kv-heads 2 --head-dim 64 --block-size 16 --reps 5

# The H200 results committed under step05_paged/results/ (bench_h200.sh says what each file is).
bench-step05_paged: $(BIN)/paged_attn_bench
	BIN=$(BIN) step05_paged/bench_h200.sh step05_paged/results
.PHONY: demo-step05_paged bench-step05_paged
