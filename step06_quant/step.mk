# step06_quant: weight-only INT8 / INT4 quantization on the CPU: the layout, round-to-nearest and
# GPTQ (quant.c, contract in quant.h). Tests: build/tests/run_tests --filter 'step06/*'.
PROGS_step06_quant :=

# The demo: the quantizer tests, verbose (pack/unpack, RTN vs brute force, GPTQ's layer error
# below RTN's on correlated calibration data; a second each). The quantize program comes next.
demo-step06_quant: $(TEST_BIN)
	$(TEST_BIN) --filter 'step06/*' --verbose

# No GPU benchmark yet (the kernels come later).
bench-step06_quant:
	@echo "step06_quant: no H200 benchmark yet (CPU quantizers only)"
.PHONY: demo-step06_quant bench-step06_quant
