# step05_paged: no programs yet. The KV block manager (kv_blocks.c) goes into
# build/lib/libstep05_paged.a, which the tests link (tests/test_step05_paged.c).
PROGS_step05_paged :=

# `make step05` builds the library, since there is no program to build yet.
step05 step05_paged: $(LIB)/libstep05_paged.a

demo-step05_paged:
	@echo "step05_paged: no program yet (the KV block manager is tested by: $(BUILD)/tests/run_tests --filter 'step05/*')"

bench-step05_paged:
	@echo "step05_paged: no benchmark yet"
.PHONY: demo-step05_paged bench-step05_paged
