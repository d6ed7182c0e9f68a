# step08_ddp: training on the CPU first (train_cpu.c: forward with saved activations, one
# backward per op, AdamW, clipping, the schedule; task_cpu.c: the copy / reverse task) and the
# program that runs it (train.c); export_cpu.c: train --save, the trained model as a Hugging Face
# directory; ckpt.c: checkpoints and the exact resume. Tests: build/tests/run_tests --filter
# '@(step08|step08_ckpt|step08_export)/*'.
PROGS_step08_ddp := train
# train runs ranks under mpirun (ddp.h): it alone links MPI (the Makefile's MPI_LIBS; empty without MPI)
$(BIN)/train: LDLIBS += $(MPI_LIBS)

# The demo: the built-in tiny Llama learns to copy 6 random symbols, then to reverse them (a few
# seconds each on the CPU); each time the engine's forward answers held-out examples with the
# trained weights.
demo-step08_ddp: $(BIN)/train
	$(BIN)/train --preset tiny --task copy --steps 300 --log-every 25
	$(BIN)/train --preset tiny --task reverse --steps 600 --log-every 50

# Nothing measured on the H200 yet: data parallelism over GPUs is a later piece of this step.
bench-step08_ddp:
	@echo "step08_ddp: no GPU benchmark yet (the CPU training core has no H200 numbers to commit)"
.PHONY: demo-step08_ddp bench-step08_ddp
