# step06_quant: weight-only INT8 / INT4 quantization: the layout, round-to-nearest and GPTQ (quant.c,
# contract in quant.h), quantized checkpoints (hf_quant.c), the quantize program; on the GPU the
# kernels' layout built at load (qlinear_pack.c) and the quantized GEMV / GEMM (qlinear_gpu.cu,
# contract in qlinear_gpu.h; qlinear_gpu_none.c without nvcc) and their benchmark (qgemm_bench).
# Tests: build/tests/run_tests --filter 'step06/*', 'step06_hf/*', 'step06_pack/*', 'step06_gpu/*'.
PROGS_step06_quant := quantize qgemm_bench

# The demo: one tiny test checkpoint (dims multiples of 8, so the GPTQ v1 packing fits; per-row
# groups since its dims are not multiples of 128) quantized three ways, each followed by KL of
# the logits vs fp32 and top-1 agreement on 1024 random tokens (seconds each on the CPU).
STEP06_MODEL = tests/data/models/llama3_tied_rope_f32
STEP06_DEMO = --model $(STEP06_MODEL) --group -1 --calib-tokens 1024 --seq-len 64 --eval-tokens 1024
demo-step06_quant: $(BIN)/quantize
	$(BIN)/quantize $(STEP06_DEMO) --method rtn-int8 --out $(BUILD)/step06_rtn_int8
	$(BIN)/quantize $(STEP06_DEMO) --method rtn-int4 --out $(BUILD)/step06_rtn_int4
	$(BIN)/quantize $(STEP06_DEMO) --method gptq-int4 --out $(BUILD)/step06_gptq_int4

# The quantized kernels vs bf16 on the Llama-3.1-8B layer shapes, T = 1, 16, 64 (INT4 g128 sym;
# then asym with act-order), CSVs under step06_quant/results/.
bench-step06_quant: $(BIN)/qgemm_bench
	@mkdir -p step06_quant/results
	$(BIN)/qgemm_bench --csv step06_quant/results/qgemm_h200.csv
	$(BIN)/qgemm_bench --asym --act-order --csv step06_quant/results/qgemm_h200_asym_act.csv
.PHONY: demo-step06_quant bench-step06_quant
