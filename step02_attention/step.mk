# step02_attention: programs (main in step02_attention/<name>.c), demo and H200 benchmark recipes.
PROGS_step02_attention := forward attn_bench

# The demo checkpoint: a tiny random-weight Llama with GQA (tests/data/models/README.md).
STEP02_DEMO_MODEL ?= tests/data/models/llama_gqa_bf16
STEP02_DEMO_IDS ?= 1,15043,29892,920,526,366,29973
STEP02_DEVICE := $(shell $(BIN)/forward --help >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)

demo-step02_attention: $(BIN)/forward $(BIN)/attn_bench
	$(BIN)/forward --model $(STEP02_DEMO_MODEL) --ids $(STEP02_DEMO_IDS) --device $(STEP02_DEVICE) --reps 3
	$(BIN)/attn_bench --device cpu --tmax 256

# The H200 tables committed under step02_attention/results/ (random weights, made on the device).
bench-step02_attention: $(BIN)/forward $(BIN)/attn_bench
	mkdir -p step02_attention/results
	$(BIN)/attn_bench --device cuda --ceiling-tflops 753 --csv | tee step02_attention/results/attn_bench_h200.csv
.PHONY: demo-step02_attention bench-step02_attention
