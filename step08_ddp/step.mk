# step08_ddp: training on the CPU first (train_cpu.c: forward with saved activations, one
# backward per op, AdamW, clipping, the schedule; task_cpu.c: the copy / reverse task) and the
# program that runs it (train.c); export_cpu.c: train --save, the trained model as a Hugging Face
# directory; ckpt.c: checkpoints and the exact resume. Tests: build/tests/run_tests --filter
# '@(step08|step08_ckpt|step08_export|step08_ddp|step08_grad)/*'. ddp.c / ddp_mpi.c: data parallelism over MPI
# ranks (ddp.h); launch.sh: the job under mpirun, restarted from the last checkpoint when it fails.
# train_gpu.cu: the same training step on one GPU (train --device cuda; train_gpu_none.c without nvcc);
# its tests: build/tests/run_tests --filter 'step08_gpu/*' (skipped without a GPU). ddp_nccl.cu: one
# rank per GPU under mpirun, the gradients all-reduced by NCCL (ddp_nccl_none.c without NCCL); its
# tests: build/tests/run_tests --filter '@(step08_nccl/*|step08_gpu/nccl_*)'.
PROGS_step08_ddp := train
# train runs ranks under mpirun (ddp.h): it alone links MPI (the Makefile's MPI_LIBS; empty without MPI)
# and NCCL (ddp_nccl.h, --device cuda under mpirun; NCCL_LIBS is empty without it)
$(BIN)/train: LDLIBS += $(MPI_LIBS) $(NCCL_LIBS)

# The demo: the built-in tiny Llama learns to copy 6 random symbols, then to reverse them (a few
# seconds each on the CPU); each time the engine's forward answers held-out examples with the
# trained weights.
# Then data parallelism: 2 ranks under mpirun, rank 1 killed after step 130, the job restarted from
# the checkpoint of step 100 by launch.sh, which prints the failure timeline.
demo-step08_ddp: $(BIN)/train
	$(BIN)/train --preset tiny --task copy --steps 300 --log-every 25
	$(BIN)/train --preset tiny --task reverse --steps 600 --log-every 50
	@if command -v mpirun >/dev/null && [ "$(HAVE_MPI)" = 1 ]; then \
	  rm -rf $(BUILD)/demo_ddp && set -x && \
	  step08_ddp/launch.sh --np 2 --max-restarts 1 --kill-rank 1 --kill-after-step 130 --log-dir $(BUILD)/demo_ddp/launch -- \
	    $(BIN)/train --preset tiny --task copy --steps 300 --log-every 50 --ckpt-dir $(BUILD)/demo_ddp/ckpt --ckpt-every 50; \
	else echo "demo-step08_ddp: the 2-rank run skipped (no mpirun, or a build without MPI)"; fi

# On a GPU machine: the training rate against the GEMM ceiling, checkpoint overhead, the exact
# resume and (with MPI + NCCL) the NCCL path of one rank; results into step08_ddp/results/h200/.
bench-step08_ddp: $(BIN)/train
	@if [ "$(HAVE_CUDA)" = 1 ] && nvidia-smi > /dev/null 2>&1; then BIN=$(BIN) step08_ddp/bench_h200.sh step08_ddp/results/h200; \
	else echo "bench-step08_ddp: needs a CUDA build and a GPU (skipped)"; fi
.PHONY: demo-step08_ddp bench-step08_ddp
