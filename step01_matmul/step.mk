# step01_matmul: programs (main in step01_matmul/<name>.c), demo and H200 benchmark recipes.
PROGS_step01_matmul := account roofline matmul

# roofline first: it writes build/ceilings.json, which account and matmul read.
demo-step01_matmul: $(BIN)/account $(BIN)/roofline $(BIN)/matmul
	$(BIN)/roofline --quick
	$(BIN)/account --preset llama-2-7b --batch 1 --context 4096
	$(BIN)/account --preset llama-3.1-8b --batch 64 --context 4096
	$(BIN)/matmul

bench-step01_matmul: $(BIN)/roofline $(BIN)/matmul
	mkdir -p step01_matmul/results
	$(BIN)/roofline --csv | tee step01_matmul/results/roofline_h200.csv
	$(BIN)/matmul --device cuda --size 4096 --csv | tee step01_matmul/results/matmul_h200.csv
.PHONY: demo-step01_matmul bench-step01_matmul
