# step07_kernels: fused kernels (fused.cu, their fp32 CPU references in fused_cpu.c, the C
# contract in fused.h; fused_none.c without nvcc) and their ladder (fused_bench); flash attention
# has its own section below. Tests: build/tests/run_tests --filter 'step07/*' and 'step07_gpu/*'.

## fused kernels
PROGS_step07_kernels := fused_bench

# The demo: with a GPU every version of every kernel is checked against the fp32 CPU reference
# and timed at one small shape; without one the program checks the CPU references alone and says
# the CUDA rows are skipped.
demo-step07_kernels: $(BIN)/fused_bench
	$(BIN)/fused_bench --quick

# The H200 results committed under step07_kernels/results/ (the full shape grid).
bench-step07_kernels: $(BIN)/fused_bench
	@mkdir -p step07_kernels/results
	$(BIN)/fused_bench --csv | tee step07_kernels/results/fused_h200.csv
	$(BIN)/fused_bench --residual-f32 --csv | tee step07_kernels/results/fused_h200_residual_f32.csv
	$(BIN)/fused_bench --launches --csv | tee step07_kernels/results/launches.csv
.PHONY: demo-step07_kernels bench-step07_kernels
