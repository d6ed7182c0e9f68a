# step04_batching: programs (main in step04_batching/<name>.c), demo and H200 benchmark recipes.
PROGS_step04_batching := $(patsubst step04_batching/%.c,%,$(wildcard step04_batching/batch_bench.c step04_batching/batch_scan.c))
