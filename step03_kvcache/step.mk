# step03_kvcache: programs (main in step03_kvcache/<name>.c), demo and H200 benchmark recipes.
PROGS_step03_kvcache := generate kv_bench sample_bench

STEP03_DEMO_MODEL ?= tests/data/models/llama_mha_bf16
STEP03_DEVICE = $(shell nvidia-smi -L >/dev/null 2>&1 && [ "$(HAVE_CUDA)" = 1 ] && echo cuda || echo cpu)

demo-step03_kvcache: $(BIN)/generate $(BIN)/kv_bench $(BIN)/sample_bench
	@echo "== $(STEP03_DEMO_MODEL) is a tiny test checkpoint with RANDOM weights: its text is noise; the numbers and the checks are the lesson"
	$(BIN)/generate --model $(STEP03_DEMO_MODEL) --prompt "The quick brown fox" --max-new-tokens 24 --device $(STEP03_DEVICE)
	$(BIN)/generate --model $(STEP03_DEMO_MODEL) --prompt "The quick brown fox" --max-new-tokens 24 --temperature 0.8 --top-p 0.9 --seed 7 --device $(STEP03_DEVICE)
	$(BIN)/kv_bench --device cpu --preset tiny
	$(BIN)/sample_bench --tokens 5

# The H200 results committed under step03_kvcache/results/ (bench_h200.sh says what each file is).
bench-step03_kvcache: $(BIN)/generate $(BIN)/kv_bench
	step03_kvcache/bench_h200.sh step03_kvcache/results
.PHONY: demo-step03_kvcache bench-step03_kvcache
