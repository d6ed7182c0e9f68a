// batch_bench.c — a whole workload through the scheduler and the batched runner: static vs
// continuous batching on the same requests, and what the token budget trades; step04's KV slots
// vs step05's paged KV (block pool, prefix caching, preemption) at the same KV budget. The body is
// bench_main.c (bench_main.h), shared with final/'s `llm bench`; its top comment has the examples
// and says how every number is measured.
#include "cpu_env.h"
#include "step04_batching/bench_main.h"

int main(int argc, char **argv) {
    cpu_env_init(argv);
    return bench_main(argc, argv, NULL);
}
