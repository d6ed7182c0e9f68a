# step04_batching: programs (main in step04_batching/<name>.c), demo and H200 benchmark recipes.
PROGS_step04_batching := batch_bench batch_scan

# The demo: the same 64 requests (scaled-down nano trace) through continuous and static batching
# on the CPU with the built-in tiny model, 16 sequences at a time (a few seconds).
STEP04_DEMO = --preset tiny --trace nano --num-requests 64 --input-len 8:64 --output-len 8:64 --max-num-seqs 16 --device cpu
demo-step04_batching: $(BIN)/batch_bench
	$(BIN)/batch_bench $(STEP04_DEMO) --policy continuous --timeline $(BUILD)/step04_timeline_continuous.csv
	$(BIN)/batch_bench $(STEP04_DEMO) --policy static --timeline $(BUILD)/step04_timeline_static.csv

# The H200 results committed under step04_batching/results/ (bench_h200.sh says what each file is).
bench-step04_batching: $(addprefix $(BIN)/,$(PROGS_step04_batching))
	BIN=$(BIN) step04_batching/bench_h200.sh step04_batching/results
.PHONY: demo-step04_batching bench-step04_batching
