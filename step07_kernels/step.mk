# step07_kernels: fused kernels (fused.cu, their fp32 CPU references in fused_cpu.c, the C
# contract in fused.h; fused_none.c without nvcc) and their ladder (fused_bench); flash attention
# has its own section below. Tests: build/tests/run_tests --filter 'step07/*' and 'step07_gpu/*'.
# Each section adds its programs with PROGS_step07_kernels += ... and its own recipes to the
# double-colon targets demo-step07_kernels:: and bench-step07_kernels:: (make runs them in order).

## fused kernels
PROGS_step07_kernels += fused_bench

# The demo: with a GPU every version of every kernel is checked against the fp32 CPU reference
# and timed at one small shape (Llama-3.2-1B, T = 1 and 256); without one the program checks the
# CPU references alone and says the CUDA rows are skipped.
demo-step07_kernels:: $(BIN)/fused_bench
	$(BIN)/fused_bench --quick

# The H200 results committed under step07_kernels/results/: the full grid (3 shapes x T = 1, 16,
# 256, 4096) in bf16, the same in the engine's fp32-residual layout, the launch counts.
bench-step07_kernels:: $(BIN)/fused_bench
	@mkdir -p step07_kernels/results
	set -o pipefail; $(BIN)/fused_bench --csv | tee step07_kernels/results/fused_h200.csv
	set -o pipefail; $(BIN)/fused_bench --residual-f32 --csv | tee step07_kernels/results/fused_h200_residual_f32.csv
	set -o pipefail; $(BIN)/fused_bench --launches --csv | tee step07_kernels/results/launches.csv
.PHONY: demo-step07_kernels bench-step07_kernels

## flash attention
# flash_attn.cu (the ladder; flash_attn_none.c without nvcc), flash_attn_cpu.c (the tile plan and
# the fp32 CPU reference), flash_bench (validate every version, then time it). Tests:
# build/tests/run_tests --filter 'step07_flash/*' and 'step07_flash_gpu/*'.
PROGS_step07_kernels += flash_bench

# The demo: one small case (with a GPU every version is checked against the fp32 CPU reference,
# then timed; without one the program says the rows need a GPU).
demo-step07_flash: $(BIN)/flash_bench
	$(BIN)/flash_bench --case qwen06b_1k --reps 10
demo-step07_kernels:: demo-step07_flash

# The H200 table committed under step07_kernels/results/ (every case, bf16, then fp16 for Llama-3.1-8B).
bench-step07_flash: $(BIN)/flash_bench
	@mkdir -p step07_kernels/results
	$(BIN)/flash_bench --csv > step07_kernels/results/flash_h200.csv
	$(BIN)/flash_bench --case llama8b_4k --dtype fp16 --csv > step07_kernels/results/flash_h200_fp16.csv
# make bench-h200 runs it with the fused kernels' table
bench-step07_kernels:: bench-step07_flash
.PHONY: demo-step07_flash bench-step07_flash
