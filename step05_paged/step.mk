# step05_paged: the KV block manager (kv_blocks.c), the paged attention kernels
# (paged_attention.cu, their CPU references in paged_attention_cpu.c) and their ladder
# (paged_attn_bench). Tests: build/tests/run_tests --filter 'step05/*' and 'step05_gpu/*'.
PROGS_step05_paged := paged_attn_bench

# The demo: the ladder at a small shape. Without a GPU it runs the fp32 CPU reference alone
# (and says the CUDA rows are skipped); with one, every kernel is checked against it and timed.
# Then the engine: the same 64 requests through step04's slots and step05's blocks at one KV
# budget (2048 positions: 16 slots of 128, or 128 blocks of 16), and a shared 256-token prefix
# with the prefix cache off and on (the built-in tiny model on the CPU, seconds each).
STEP05_DEMO = --preset tiny --trace nano --num-requests 64 --input-len 8:64 --output-len 8:64 --max-model-len 128 --device cpu
STEP05_PREFIX = --preset tiny --trace nano --num-requests 64 --shared-prefix 256 --input-len 16:16 --output-len 8:8 --device cpu --kv paged
demo-step05_paged: $(BIN)/paged_attn_bench $(BIN)/batch_bench
	$(BIN)/paged_attn_bench --batch 4 --context 1000 --heads 8 --kv-heads 2 --head-dim 64 --block-size 16 --reps 5
	$(BIN)/batch_bench $(STEP05_DEMO) --max-num-seqs 16 --steps-csv $(BUILD)/step05_steps_slots.csv
	$(BIN)/batch_bench $(STEP05_DEMO) --kv paged --max-num-seqs 64 --num-blocks 129 --steps-csv $(BUILD)/step05_steps_paged.csv
	$(BIN)/batch_bench $(STEP05_PREFIX) --prefix-cache off
	$(BIN)/batch_bench $(STEP05_PREFIX) --prefix-cache on

# The H200 results committed under step05_paged/results/ (bench_h200.sh says what each file is).
bench-step05_paged: $(BIN)/paged_attn_bench
	BIN=$(BIN) step05_paged/bench_h200.sh step05_paged/results
.PHONY: demo-step05_paged bench-step05_paged
