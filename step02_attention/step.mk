# step02_attention: programs (main in step02_attention/<name>.c), demo and H200 benchmark recipes.
PROGS_step02_attention := forward attn_bench

# The demo checkpoint: the tiny random-weight Llama (MHA, bf16) that has a tokenizer.json
# (tests/data/models/README.md); on the GPU when one is usable, else on the CPU.
STEP02_DEMO_MODEL ?= tests/data/models/llama_mha_bf16
STEP02_DEVICE = $(shell nvidia-smi -L >/dev/null 2>&1 && [ "$(HAVE_CUDA)" = 1 ] && echo cuda || echo cpu)

demo-step02_attention: $(BIN)/forward $(BIN)/attn_bench
	@echo "== $(STEP02_DEMO_MODEL) is a tiny test checkpoint with RANDOM weights: its text is noise; the numbers and the checks are the lesson"
	$(BIN)/forward --model $(STEP02_DEMO_MODEL) --ids-npy $(STEP02_DEMO_MODEL)/goldens/prompt_T33.npy \
	    --device $(STEP02_DEVICE) --logits-out $(BUILD)/step02_demo_logits.npy --reps 3
	$(BIN)/forward --model $(STEP02_DEMO_MODEL) --prompt "The quick brown fox" --device $(STEP02_DEVICE)
	$(BIN)/attn_bench --device cpu --tmax 256

# The H200 results committed under step02_attention/results/: the step02 tests, a random-weight
# Llama-3.1-8B-shaped bf16 checkpoint (transformers, made on the device) checked against
# transformers and timed at T = 2048, and the attention bench (bench_h200.sh says what each file is).
bench-step02_attention: $(BIN)/forward $(BIN)/attn_bench
	step02_attention/bench_h200.sh step02_attention/results
.PHONY: demo-step02_attention bench-step02_attention
