# final: the engine of steps 04-07 put together. So far engine.c (engine.h): step04's loop on a
# thread of its own, requests submitted from other threads through a bounded queue, tokens read
# back through per-request streams, cancels, metrics; tested on the CPU runner against step04's
# offline loop (tests/test_final_engine.c, `run_tests --filter 'final_engine/*'`). The `llm` CLI
# and the server come next; until then there is no program here.
PROGS_final :=

demo-final:
	@echo "final: the engine (build/lib/libfinal.a) is built and tested by make test; its CLI, llm, is not written yet"
bench-final:
	@echo "final: no H200 benchmark yet"
.PHONY: demo-final bench-final
