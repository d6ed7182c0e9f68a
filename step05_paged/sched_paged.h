// sched_paged.h — the paged-KV part of step04's scheduler (scheduler.h), over step05's block pool
// (kv_blocks.h). scheduler.c keeps the rule (who runs, in which order, the token budget, finishing);
// these calls are what changes when the KV memory is blocks instead of slots.
// defines: paged_init, paged_free, paged_can_ever_fit, paged_admit, paged_grow, paged_preempt_newest,
//          paged_release, paged_account
#pragma once
#include "step04_batching/scheduler.h"

#ifdef __cplusplus
extern "C" {
#endif

// The pool for s->cfg (block_size, num_blocks, prefix_cache). 0, or -1 + err.
int paged_init(Scheduler *s, char *err, int errlen);
void paged_free(Scheduler *s);
// 1 if request r, alone in the pool, has room for every token it may compute: min(prompt +
// max_tokens, max_len) - 1 positions (the last token is sampled, never computed).
int paged_can_ever_fit(const Scheduler *s, const Request *r);
// Admission of request i (waiting, no blocks): its cached prefix (num_computed = the hit), then
// the blocks of its first chunk of min(num_tokens - num_computed, budget) tokens, whose full
// blocks are committed at once. 0, or -1 when the blocks are not there (nothing changed, the
// lookup's hits given back).
int paged_admit(Scheduler *s, int i, long budget);
// Running request i: the blocks of its next min(num_tokens - num_computed, budget) tokens,
// committed at once. 0, or -1 when the pool is out of blocks (nothing changed).
int paged_grow(Scheduler *s, int i, long budget);
// Preemption by recompute of the newest running request: blocks freed, num_computed = 0, back to
// the head of the waiting queue. Returns its index.
int paged_preempt_newest(Scheduler *s);
void paged_release(Scheduler *s, Request *r);  // finish: the blocks go back to the pool
// After sched_update: KV tokens written (a shared block's rows counted once) and allocated
// (blocks in use x B) by the running requests; blocks in use into the stats' peak.
void paged_account(Scheduler *s, long *used, long *allocated);

#ifdef __cplusplus
}
#endif
