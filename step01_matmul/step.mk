# step01_matmul: programs (main in step01_matmul/<name>.c), demo and H200 benchmark recipes.
PROGS_step01_matmul := account roofline matmul

demo-step01_matmul: $(BIN)/account $(BIN)/roofline $(BIN)/matmul
	$(BIN)/account --preset llama-2-7b --batch 1 --context 4096
	$(BIN)/roofline --quick
	$(BIN)/matmul --size 512

bench-step01_matmul: $(BIN)/roofline $(BIN)/matmul
	mkdir -p step01_matmul/results
	$(BIN)/roofline --csv | tee step01_matmul/results/roofline_h200.csv
	$(BIN)/matmul --size 4096 --csv | tee step01_matmul/results/matmul_h200.csv
.PHONY: demo-step01_matmul bench-step01_matmul
