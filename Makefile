# Makefile — the one entry point.
#   make                 build every program into build/bin/ (CUDA parts when nvcc is found)
#   make step01          build one step's programs: step01 .. step08 (later steps get a
#                        target as each one lands: a stepNN/step.mk names its programs)
#   make test            install missing deps, build, run the Criterion tests and the notebooks
#   make test SANITIZE=1 the CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   make demo            install missing deps, build, run every step with its defaults
#   make bench-h200      the GPU benchmarks whose tables are committed under stepNN/results/
#   make gpu-sanitize    on a GPU machine: the GPU tests under compute-sanitizer memcheck (with leak
#                        check), racecheck and synccheck; one line per tool, fails on any error
#                        (GPU_SANITIZE_FILTER='@(*/gpu_*|step04_gpu/*|step05_gpu/*|step06_gpu/*|step06_egpu/*|step07_gpu/*|step08_gpu/*)', GPU_SANITIZE_TOOLS="memcheck racecheck synccheck",
#                        GPU_SANITIZE_JOBS=8: each test in its own sanitized process, 8 at a time)
#   make clean
# Knobs: CUDA_ARCHS="75 80 86 89 90" (or native), NO_CUDA=1, NO_MPI=1, NO_NCCL=1, NOTEBOOKS=0, COMMIT=<hash>.
SHELL := /bin/bash
comma := ,
.DEFAULT_GOAL := all

ifeq ($(origin CC),default)
CC := gcc
endif
SANITIZE   ?= 0
NOTEBOOKS  ?= 1
CUDA_ARCHS ?= 75 80 86 89 90
BUILD      ?= build
NPROC      := $(shell nproc 2>/dev/null || echo 2)

# ---- CUDA: found with command -v, or at the usual place; skipped (and said so) otherwise
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CUDA_SKIP_REASON :=
ifeq ($(NVCC),)
CUDA_SKIP_REASON := nvcc not found (install the CUDA Toolkit or put nvcc on PATH)
endif
ifeq ($(NO_CUDA),1)
NVCC :=
CUDA_SKIP_REASON := NO_CUDA=1
endif
ifeq ($(SANITIZE),1)
NVCC :=
CUDA_SKIP_REASON := SANITIZE=1 builds the CPU code only
BUILD := build/asan
endif
HAVE_CUDA := $(if $(NVCC),1,0)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))

OBJ := $(BUILD)/obj
LIB := $(BUILD)/lib
BIN := $(BUILD)/bin
GEN := $(BUILD)/gen

# ---- libraries (pkg-config names; tools/install-deps.sh installs the Debian packages)
PKGS := jansson openblas oniguruma libutf8proc libxxhash libmicrohttpd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
OPENBLAS_LIBDIR := $(shell pkg-config --variable=libdir openblas 2>/dev/null)
ifeq ($(PKG_LIBS),)
PKG_LIBS := -ljansson -lopenblas -lonig -lutf8proc -lxxhash -lmicrohttpd
endif

# ---- MPI (step08's data parallelism on CPU ranks): OpenMPI's flags from pkg-config, else from the
# mpicc wrapper (`mpicc --showme:compile/link`); only the programs that run ranks link it (their
# step.mk adds $(MPI_LIBS)). Without it those programs still build and run one rank, and say so
# when started by mpirun. NO_MPI=1 builds without it.
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null || mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell pkg-config --libs ompi-c 2>/dev/null || mpicc --showme:link 2>/dev/null)
ifeq ($(NO_MPI),1)
MPI_CFLAGS :=
MPI_LIBS :=
endif
HAVE_MPI := $(if $(strip $(MPI_LIBS)),1,0)
MPI_SKIP_REASON := $(if $(filter 1,$(NO_MPI)),NO_MPI=1,MPI not found: no pkg-config ompi-c and no mpicc (Debian: apt-get install libopenmpi-dev openmpi-bin))

# ---- NCCL (step08's data parallelism over GPUs: ddp_nccl.cu): nccl.h among CUDA's headers or in
# /usr/include, libnccl.so in CUDA's lib64 or the system's library dir; only with CUDA. Found:
# HAVE_NCCL=1 and train (and the test binary) link -lnccl; else ddp_nccl_none.c says NCCL is not
# available. NO_NCCL=1 builds without it.
NCCL_HDR := $(firstword $(wildcard $(if $(CUDA_HOME),$(CUDA_HOME)/include/nccl.h) /usr/include/nccl.h))
NCCL_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(if $(CUDA_HOME),$(CUDA_HOME)/lib64/libnccl.so) \
               /usr/lib/x86_64-linux-gnu/libnccl.so /usr/lib/aarch64-linux-gnu/libnccl.so /usr/lib64/libnccl.so))))
HAVE_NCCL := $(if $(and $(filter 1,$(HAVE_CUDA)),$(NCCL_HDR),$(NCCL_LIBDIR),$(if $(filter 1,$(NO_NCCL)),,yes)),1,0)
NCCL_LIBS := $(if $(filter 1,$(HAVE_NCCL)),-L$(NCCL_LIBDIR) -Wl$(comma)-rpath$(comma)$(NCCL_LIBDIR) -lnccl)
NCCL_SKIP_REASON := $(if $(filter 1,$(NO_NCCL)),NO_NCCL=1,$(if $(filter 1,$(HAVE_CUDA)),nccl.h or libnccl.so not found (Debian: apt-get install libnccl-dev),no CUDA))

COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)

OPT := -O3 -march=native
SANFLAGS :=
ifeq ($(SANITIZE),1)
OPT := -O1 -g -march=native
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
endif
CFLAGS := $(OPT) -std=gnu11 -Wall -Wextra -Werror -fopenmp -MMD -MP $(SANFLAGS) \
          -Icommon -I. -I$(GEN) $(PKG_CFLAGS) -DHAVE_CUDA=$(HAVE_CUDA) \
          $(MPI_CFLAGS) -DHAVE_MPI=$(HAVE_MPI) -DHAVE_NCCL=$(HAVE_NCCL) -DBUILD_BIN_DIR=\"$(BIN)\"
LDFLAGS := -fopenmp $(SANFLAGS) $(if $(OPENBLAS_LIBDIR),-Wl$(comma)-rpath$(comma)$(OPENBLAS_LIBDIR))
LDLIBS := $(PKG_LIBS) -lm -lpthread -ldl


ifeq ($(HAVE_CUDA),1)
ifeq ($(CUDA_ARCHS),native)
GENCODE := -arch=native
else
# arch 90 is built as sm_90a so Hopper-only instructions (wgmma, setmaxnreg) are available;
# PTX of the newest arch rides along so newer GPUs can JIT it.
cuda_sm = $(if $(filter 90,$(1)),90a,$(1))
GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(call cuda_sm,$(a)),code=sm_$(call cuda_sm,$(a))) \
           -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
endif
NVCCFLAGS := -O3 -std=c++17 $(GENCODE) -lineinfo -MMD -MP -Icommon -I. -I$(GEN) -DHAVE_CUDA=1 -DHAVE_NCCL=$(HAVE_NCCL) \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter --expt-relaxed-constexpr
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
endif

# ---- sources: common/ and each step dir may have a step.mk naming its programs
# (PROGS_<dir> := a b  ->  <dir>/a.c is the main of build/bin/a); every other .c/.cu of the
# dir goes into build/lib/lib<dir>.a (libcommon.a for common/). Programs and tests link all
# libraries. A step may use earlier steps' code, with two planned exceptions: step04's scheduler
# and runner take step05's paged KV as an option (step05_paged/kv_blocks.h, paged_attention.h,
# sched_paged.h), so that step05 generalizes step04's engine instead of copying it; with the
# default slot layout none of step05's code runs. And a projection of step02's model may be one
# of step06's quantized weights (step06_quant/quant.h on the CPU, qlinear_gpu.h on the GPU), which
# step02-04's forwards run where it is set; step06's qmodel.c is what sets it (step03's generate
# and kv_bench and step04's batch_bench load their model through it, for --quant and quantized
# directories), so a dense model runs none of step06's code. common/ depends on no step
# (model_load only marks a quantized checkpoint and leaves its packed projections to step06).
STEP_DIRS := $(patsubst %/step.mk,%,$(sort $(wildcard step*/step.mk final/step.mk)))
DIRS := common $(STEP_DIRS)
include $(wildcard common/step.mk step*/step.mk final/step.mk)

ALL_LIBS := $(foreach d,$(STEP_DIRS),$(LIB)/lib$(d).a) $(LIB)/libcommon.a
ALL_PROGS :=

define DIR_template
$(1)_MAINS := $$(addprefix $(1)/,$$(addsuffix .c,$$(PROGS_$(1))))
$(1)_SRC := $$(filter-out $$($(1)_MAINS),$$(wildcard $(1)/*.c)) $$(if $$(filter 1,$$(HAVE_CUDA)),$$(wildcard $(1)/*.cu))
$(LIB)/lib$(1).a: $$($(1)_SRC:%=$(OBJ)/%.o)
ALL_PROGS += $$(addprefix $(BIN)/,$$(PROGS_$(1)))
$(sort $(firstword $(subst _, ,$(1))) $(1)): $$(addprefix $(BIN)/,$$(PROGS_$(1)))
	@echo "built $(1): $$(PROGS_$(1)) $$(if $$(filter 1,$$(HAVE_CUDA)),(CPU + CUDA),(CPU only: CUDA skipped, $$(CUDA_SKIP_REASON)))"
.PHONY: $(sort $(firstword $(subst _, ,$(1))) $(1))
$$(foreach p,$$(PROGS_$(1)),$$(eval $(BIN)/$$(p): $(OBJ)/$(1)/$$(p).c.o $$(ALL_LIBS)))
endef
$(foreach d,$(DIRS),$(eval $(call DIR_template,$(d))))

$(LIB)/%.a:
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^

$(BIN)/%:
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) -Wl,--start-group $(ALL_LIBS) -Wl,--end-group $(LDLIBS)

$(OBJ)/%.c.o: %.c $(GEN)/build_config | $(GEN)/build_info.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(OBJ)/%.cu.o: %.cu $(GEN)/build_config | $(GEN)/build_info.h
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MF $(@:.o=.d) -c $< -o $@

# What every object depends on besides its sources: with or without CUDA (the *_none.c stubs
# compile to nothing with it), the architectures, the compilers. Rewritten only when one of them
# changes, so switching NO_CUDA=1 / CUDA_ARCHS in the same build dir rebuilds what it must.
$(GEN)/build_config: FORCE
	@mkdir -p $(@D)
	@echo 'HAVE_CUDA=$(HAVE_CUDA) CUDA_ARCHS=$(CUDA_ARCHS) CC=$(CC) NVCC=$(NVCC) HAVE_MPI=$(HAVE_MPI) HAVE_NCCL=$(HAVE_NCCL)' > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@
	@rm -f $@.tmp

# Rewritten only when the commit changes, so nothing rebuilds needlessly.
$(GEN)/build_info.h: FORCE
	@mkdir -p $(@D)
	@echo '#define BUILD_COMMIT "$(COMMIT)"' > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@
	@rm -f $@.tmp

# ---- tests: every tests/test_*.c (and the helpers they share, tests/*_util.c) in one Criterion binary
TEST_SRC := $(wildcard tests/test_*.c tests/*_util.c)
TEST_BIN := $(BUILD)/tests/run_tests
$(TEST_BIN): $(TEST_SRC:%=$(OBJ)/%.o) $(ALL_LIBS)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) -Wl,--start-group $(ALL_LIBS) -Wl,--end-group -lcriterion $(LDLIBS)
# with NCCL, test_step08_nccl.c drives ddp_nccl.h itself (its communicator of one rank; ddp.h's MPI side)
ifeq ($(HAVE_NCCL),1)
$(TEST_BIN): LDLIBS += $(NCCL_LIBS) $(MPI_LIBS)
endif

all: $(ALL_PROGS) $(TEST_BIN)
	@echo "== built into $(BIN): $(notdir $(ALL_PROGS))"
	@if [ "$(HAVE_CUDA)" = 1 ]; then echo "== CUDA: built with $(NVCC) for $(CUDA_ARCHS)"; \
	 else echo "== CUDA: skipped ($(CUDA_SKIP_REASON)); the programs run their CPU versions only"; fi
	@if [ "$(HAVE_MPI)" = 1 ]; then echo "== MPI: train runs ranks under mpirun ($(strip $(MPI_LIBS)))"; \
	 else echo "== MPI: skipped ($(MPI_SKIP_REASON)); train runs one rank only"; fi
	@if [ "$(HAVE_NCCL)" = 1 ]; then echo "== NCCL: train --device cuda runs one rank per GPU under mpirun ($(NCCL_HDR), $(NCCL_LIBDIR))"; \
	 else echo "== NCCL: skipped ($(NCCL_SKIP_REASON)); train --device cuda runs one process only"; fi

deps:
	@bash tools/install-deps.sh $(if $(filter 0,$(NOTEBOOKS)),--no-python)

SAN_ENV := $(if $(filter 1,$(SANITIZE)),ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=exitcode=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
# With SANITIZE=1 the GPU-only suites are left out: they skip without a GPU (compute-sanitizer
# checks them on one: make gpu-sanitize). Criterion's own runner process leaks 48 bytes inside
# libcriterion now and then; tools/sanitizer_log_check.sh names that report and fails on every other
# (leaks are judged from the log: LSAN_OPTIONS=exitcode=0).
SAN_FILTER := $(if $(filter 1,$(SANITIZE)),--filter '!(step04_gpu/*|step05_gpu/*|step06_gpu/*|step06_egpu/*|step07_gpu/*|step08_gpu/*)')
# check: build and run the Criterion tests only (no dependency install, no notebooks).
# With SANITIZE=1 any sanitizer report (a leak too, which Criterion alone would not count) fails.
check:
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@set -o pipefail; $(SAN_ENV) $(TEST_BIN) $(SAN_FILTER) --jobs 2 --verbose=0 2>&1 | tee $(BUILD)/tests/last.log
ifeq ($(SANITIZE),1)
	@if ! bash tools/sanitizer_log_check.sh $(BUILD)/tests/last.log; then echo "== sanitizers reported problems (above)"; exit 1; \
	 else echo "== sanitizers: clean"; fi
endif

test: deps
	@$(MAKE) --no-print-directory check
ifeq ($(NOTEBOOKS),1)
ifneq ($(SANITIZE),1)
	python3 tools/run_notebooks.py notebooks
endif
else
	@echo "== notebooks: skipped (NOTEBOOKS=0)"
endif

demo: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@$(MAKE) --no-print-directory $(addprefix demo-,$(STEP_DIRS))

bench-h200: all $(addprefix bench-,$(STEP_DIRS))

clean:
	rm -rf build

# ---- gpu-sanitize: tools/gpu_sanitize.sh runs the GPU tests once plainly (they must run, not skip,
# and pass), then under each compute-sanitizer tool; logs in $(BUILD)/gpu-sanitize/.
GPU_SANITIZE_FILTER ?= @(*/gpu_*|step04_gpu/*|step05_gpu/*|step06_gpu/*|step06_egpu/*|step07_gpu/*|step08_gpu/*)
GPU_SANITIZE_TOOLS ?= memcheck racecheck synccheck
COMPUTE_SANITIZER ?= $(or $(shell command -v compute-sanitizer 2>/dev/null),$(if $(CUDA_HOME),$(CUDA_HOME)/bin/compute-sanitizer,/usr/local/cuda/bin/compute-sanitizer))
gpu-sanitize:
	@if [ "$(HAVE_CUDA)" != 1 ]; then echo "gpu-sanitize: cannot run: this build has no CUDA code ($(CUDA_SKIP_REASON))" >&2; exit 1; fi
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@COMPUTE_SANITIZER="$(COMPUTE_SANITIZER)" GPU_SANITIZE_OUT="$(BUILD)/gpu-sanitize" \
	  bash tools/gpu_sanitize.sh $(TEST_BIN) '$(GPU_SANITIZE_FILTER)' $(GPU_SANITIZE_TOOLS)

# ---- fuzz: libFuzzer targets under ASan+UBSan (clang). `make fuzz` runs each FUZZ_SECONDS
# (default 60; FUZZ_SECONDS=600 for a ten-minute run); inputs found go to build/fuzz/corpus.
FUZZ_CC ?= $(shell command -v clang-14 2>/dev/null || command -v clang 2>/dev/null)
FUZZ_SECONDS ?= 60
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Icommon $(PKG_CFLAGS)
build/fuzz/fuzz_tokenizer: tests/fuzz/fuzz_tokenizer.c common/tokenizer.c common/check.c common/tokenizer.h
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ $(PKG_LIBS) -lpthread -lm
build/fuzz/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c common/safetensors.c common/check.c common/safetensors.h
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ $(PKG_LIBS) -lpthread -lm
build/fuzz/fuzz_request: tests/fuzz/fuzz_request.c final/api.c common/tokenizer.c common/check.c final/api.h
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) -I. $(filter %.c,$^) -o $@ $(PKG_LIBS) -lpthread -lm
build/fuzz/fuzz_chat: tests/fuzz/fuzz_chat_template.c common/chat_template.c common/chat_template.h
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ $(PKG_LIBS) -lpthread -lm
# FUZZ_TARGETS picks which to run: make fuzz FUZZ_TARGETS=safetensors (default: all of them).
FUZZ_TARGETS ?= tokenizer safetensors request chat
fuzz: $(addprefix fuzz-,$(FUZZ_TARGETS))
fuzz-tokenizer: build/fuzz/fuzz_tokenizer
	@mkdir -p build/fuzz/corpus
	build/fuzz/fuzz_tokenizer -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 -artifact_prefix=build/fuzz/ build/fuzz/corpus tests/fuzz/seeds
# The safetensors seeds (small valid files) and dictionary are written by the fuzzer binary.
fuzz-safetensors: build/fuzz/fuzz_safetensors
	@mkdir -p build/fuzz/corpus_safetensors build/fuzz/seeds_safetensors
	FUZZ_WRITE_SEEDS=build/fuzz/seeds_safetensors build/fuzz/fuzz_safetensors
	build/fuzz/fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 -artifact_prefix=build/fuzz/safetensors- -dict=build/fuzz/seeds_safetensors.dict build/fuzz/corpus_safetensors build/fuzz/seeds_safetensors

# The request parser of llm serve (final/api.c): the first byte picks the endpoint, the rest is the body.
fuzz-request: build/fuzz/fuzz_request
	@mkdir -p build/fuzz/corpus_request
	build/fuzz/fuzz_request -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -print_final_stats=1 -artifact_prefix=build/fuzz/request- build/fuzz/corpus_request tests/fuzz/seeds_request

# The chat-template renderer: the input is the template; the seeds are the real ones under tests/data.
fuzz-chat: build/fuzz/fuzz_chat
	@mkdir -p build/fuzz/corpus_chat
	build/fuzz/fuzz_chat -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -timeout=10 -print_final_stats=1 -artifact_prefix=build/fuzz/chat- build/fuzz/corpus_chat tests/data/chat_templates

FORCE:
.PHONY: all check test demo deps clean gpu-sanitize fuzz fuzz-tokenizer fuzz-safetensors fuzz-request fuzz-chat bench-h200 FORCE
.SECONDARY:

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
