# step06_quant: weight-only INT8 / INT4 quantization on the CPU: the layout, round-to-nearest and
# GPTQ (quant.c, contract in quant.h), quantized checkpoints (hf_quant.c) and the quantize program.
# Tests: build/tests/run_tests --filter 'step06/*' and 'step06_hf/*'.
PROGS_step06_quant := quantize

# The demo: one tiny test checkpoint (dims multiples of 8, so the GPTQ v1 packing fits; per-row
# groups since its dims are not multiples of 128) quantized three ways, each followed by KL of
# the logits vs fp32 and top-1 agreement on 1024 random tokens (seconds each on the CPU).
STEP06_MODEL = tests/data/models/llama3_tied_rope_f32
STEP06_DEMO = --model $(STEP06_MODEL) --group -1 --calib-tokens 1024 --seq-len 64 --eval-tokens 1024
demo-step06_quant: $(BIN)/quantize
	$(BIN)/quantize $(STEP06_DEMO) --method rtn-int8 --out $(BUILD)/step06_rtn_int8
	$(BIN)/quantize $(STEP06_DEMO) --method rtn-int4 --out $(BUILD)/step06_rtn_int4
	$(BIN)/quantize $(STEP06_DEMO) --method gptq-int4 --out $(BUILD)/step06_gptq_int4

# No GPU benchmark yet (the kernels come later).
bench-step06_quant:
	@echo "step06_quant: no H200 benchmark yet (CPU quantizers only)"
.PHONY: demo-step06_quant bench-step06_quant
