# final: the engine of steps 04-07 put together. engine.c (engine.h): step04's loop on a thread of
# its own, requests submitted from other threads through a bounded queue, tokens read back through
# per-request streams, cancels, metrics; llm (llm.c): its command line, `llm generate`, `llm bench` and
# `llm serve`, the OpenAI-compatible server (server.c over libmicrohttpd, api.c: requests and responses).
# Tests: run_tests --filter 'final_engine/*' (the CPU runner, against step04's offline loop and the
# transformers goldens, and llm bench against batch_bench) and 'final_server/*' (llm serve driven by
# the openai client and curl).
PROGS_final := llm

FINAL_DEMO_MODEL ?= tests/data/models/llama_mha_bf16
FINAL_DEVICE = $(shell nvidia-smi -L >/dev/null 2>&1 && [ "$(HAVE_CUDA)" = 1 ] && echo cuda || echo cpu)
demo-final: $(BIN)/llm
	@echo "== $(FINAL_DEMO_MODEL) is a tiny test checkpoint with RANDOM weights: its text is noise"
	$(BIN)/llm generate --model $(FINAL_DEMO_MODEL) --prompt "The quick brown fox" --max-tokens 24 --device $(FINAL_DEVICE)
	$(BIN)/llm generate --model $(FINAL_DEMO_MODEL) --prompt "The quick brown fox" --max-tokens 24 --temperature 0.8 --top-p 0.9 --seed 7 --device $(FINAL_DEVICE)
	$(BIN)/llm bench --preset tiny --trace nano --num-requests 64 --input-len 8:64 --output-len 8:64 --max-num-seqs 16 --device cpu
bench-final:
	@echo "final: no H200 results yet (llm bench against vLLM is the next step)"
.PHONY: demo-final bench-final
