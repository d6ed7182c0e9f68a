# step08_ddp: training on the CPU first (train_cpu.c: forward with saved activations, one
# backward per op, AdamW, clipping, the schedule; task_cpu.c: the copy / reverse task).
# Tests: build/tests/run_tests --filter 'step08/*'.
PROGS_step08_ddp :=

demo-step08_ddp:
	@echo "step08_ddp: no program yet (the training core is tested by build/tests/run_tests --filter 'step08/*')"

# Nothing measured on the H200 yet: data parallelism over GPUs is a later piece of this step.
bench-step08_ddp:
	@echo "step08_ddp: no GPU benchmark yet"
.PHONY: demo-step08_ddp bench-step08_ddp
