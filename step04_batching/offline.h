// offline.h — the engine loop of step04 over a fixed list of requests (batch_bench, the tests).
// defines: OfflineOpts, OfflineStats, offline_run
//
//   while not every request finished:
//     plan   = sched_schedule(now)              (nothing arrived yet: wait for the next arrival)
//     batch  = batch_from_plan(plan)
//     runner_forward(batch) -> argmax (greedy rows) and/or logits (when a row samples)
//     token  = argmax, or sample_keyed(request, position, logits row)
//     sched_update(plan, tokens, now)
// Both KV layouts: step04's slots, or step05's paged blocks (a Scheduler with block_size > 0 and
// a runner_new_*_paged runner of the same pool).
// final/'s engine is this loop with requests arriving from a server instead of a list.
#pragma once
#include "step04_batching/batch.h"
#include "step04_batching/scheduler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int real_clock;  // 1: wall clock (sleeps until an arrival when idle); 0: simulated, each step = step_s
    double step_s;   // simulated clock: seconds a step takes (default 1e-3)
    int progress;    // a progress line on stderr every ~2 s
    // called for every sampling row with its logits on the host (the loop then always copies
    // logits); ctx is passed through
    void (*on_logits)(void *ctx, const Request *r, const float *logits, int vocab);
    // called after every step's sched_update with the step's plan and its end time (engine clock)
    void (*on_step)(void *ctx, const Scheduler *s, const SchedPlan *plan, double t_s);
    void *ctx;
} OfflineOpts;

typedef struct {
    double wall_s;        // engine start (arrival time 0) to the last finish (engine clock)
    double forward_s;     // inside runner_forward (host wall clock)
    double device_s;      // CUDA: the forwards' device time (events from the upload to the last kernel)
    // the same for the decode steps alone (every sequence of the step one new row); the rest are
    // the steps with prompt chunks
    long decode_steps;
    double decode_forward_s, decode_device_s;
    long steps, logit_copies;  // steps; steps whose logits were copied to the host
    long overlapped_steps;     // steps launched while the one before was still running (final/'s engine with
                               // asynchronous scheduling; step04's offline loop: 0)
    double *itl_ms;       // (n_itl) every inter-token gap of every request (ms), malloc'ed
    long n_itl;
} OfflineStats;

// Runs every request of s to completion. 0, or -1 when a forward failed (message on stderr).
// The caller frees st->itl_ms.
int offline_run(Runner *r, int vocab, Scheduler *s, const OfflineOpts *o, OfflineStats *st);

#ifdef __cplusplus
}
#endif
