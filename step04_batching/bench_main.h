// bench_main.h — batch_bench's body as a function, so that final/'s `llm bench` runs the same
// workloads, options and report through its engine instead of step04's offline loop.
// defines: BenchLoopFn, BenchHooks, bench_main
//
// bench_main parses batch_bench's command line (argv[0] is the program's name), loads the model,
// builds the requests (--requests FILE.jsonl or --trace), the runner and a Scheduler of them, warms
// the runner up, runs the loop, and prints the table or the --json report (bench_main.c says how
// each number is measured).
#pragma once
#include "step04_batching/offline.h"

#ifdef __cplusplus
extern "C" {
#endif

// A loop with offline_run's contract: run every request of s (sched_init'd over its table, those
// that can never run already finished) to its end on runner r; the requests' tokens, finish
// reasons and times (arrival_s, first_sched_s, first_token_s, finish_s on one clock from time 0 =
// the loop's start), s->st and *st filled as offline_run fills them.
typedef int (*BenchLoopFn)(Runner *r, int vocab, Scheduler *s, const OfflineOpts *o, OfflineStats *st);

typedef struct {
    const char *prog;        // in usage and messages, e.g. "llm bench"
    const char *usage_note;  // printed before the usage (or NULL)
    BenchLoopFn loop;        // NULL: offline_run
    int paged_default;       // 1: paged KV unless --kv slots (batch_bench's default is slots)
} BenchHooks;

// h NULL: batch_bench. Returns the exit code (errors in the options or inputs exit 2 or 1 directly).
int bench_main(int argc, char **argv, const BenchHooks *h);

#ifdef __cplusplus
}
#endif
