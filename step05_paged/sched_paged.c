// sched_paged.c — see sched_paged.h. Block ids and tables come from kv_blocks.c; a request's table
// is the one of its index in the scheduler's request array.
#include "step05_paged/sched_paged.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"

int paged_init(Scheduler *s, char *err, int errlen) {
    const SchedConfig *c = &s->cfg;
    if (c->policy != POLICY_CONTINUOUS)
        return errf(err, errlen, "paged KV (block_size %d) runs continuous batching only: static batching keeps step04's slots",
                    c->block_size);
    long nb = c->num_blocks;
    if (nb == 0) {  // the same KV tokens as step04's budget, plus the null block
        nb = s->cfg.kv_tokens / c->block_size;
        nb = (nb < 1 ? 1 : nb) + 1;
    }
    if (nb < 2 || nb > (1L << 30)) return errf(err, errlen, "num_blocks = %ld: need 2 .. 2^30 (block 0 is the null block)", nb);
    if (kvb_init(&s->blocks, (int)nb, c->block_size, c->prefix_cache != 0, err, errlen) != 0) return -1;
    s->cfg.num_blocks = (int)nb;
    s->paged = 1;
    return 0;
}

void paged_free(Scheduler *s) {
    if (!s->paged) return;
    kvb_free(&s->blocks);
}

int paged_can_ever_fit(const Scheduler *s, const Request *r) {
    long cap = (long)r->num_prompt + r->max_tokens;
    if (cap > s->cfg.max_len) cap = s->cfg.max_len;
    const long B = s->cfg.block_size;
    return (cap - 1 + B - 1) / B <= s->cfg.num_blocks - 1;
}

static long chunk(const Request *r, long budget) {
    const long rem = r->num_tokens - r->num_computed;
    return rem < budget ? rem : budget;
}

// The tokens of 0 .. upto-1 a block may be keyed by: a token still on the device (final/'s
// overlapped loop: r->pending) is not known yet, so its block is keyed at a later step's commit.
static int known(const Request *r, int upto) {
    const int k = r->num_tokens - r->pending;
    return upto < k ? upto : k;
}

int paged_admit(Scheduler *s, int i, long budget) {
    KvBlocks *kv = &s->blocks;
    Request *r = &s->reqs[i];
    const int cached = kvb_lookup(kv, i, r->tokens, r->num_tokens - r->pending);
    if (cached < 0) die("paged_admit: request %d already holds blocks", i);
    r->num_computed = cached;
    const int upto = cached + (int)chunk(r, budget);
    if (kvb_allocate(kv, i, upto) != 0) {
        kvb_free_seq(kv, i);  // the hits go back (cached again): admission waits
        r->num_computed = 0;
        return -1;
    }
    // hash the full blocks of this step's tokens now, so a request admitted later in this very step
    // already hits them (the forward writes every row's K/V of a layer before any attention of it)
    kvb_commit(kv, i, r->tokens, known(r, upto));
    s->st.prefix_query_tokens += r->num_tokens;
    s->st.prefix_hit_tokens += cached;
    return 0;
}

int paged_grow(Scheduler *s, int i, long budget) {
    Request *r = &s->reqs[i];
    const int upto = r->num_computed + (int)chunk(r, budget);
    if (kvb_allocate(&s->blocks, i, upto) != 0) return -1;
    kvb_commit(&s->blocks, i, r->tokens, known(r, upto));
    return 0;
}

int paged_preempt_newest(Scheduler *s) {
    const int i = s->running[--s->n_running];
    Request *r = &s->reqs[i];
    kvb_free_seq(&s->blocks, i);
    r->num_computed = 0;
    r->status = REQ_WAITING;
    r->slot = -1;
    // the head of the waiting queue: [w_head, n_reqs) waits, and every running request left it
    // earlier, so w_head >= 1 here; victims taken newest first keep their admission order there
    s->waiting[--s->w_head] = i;
    s->st.preemptions++;
    return i;
}

void paged_release(Scheduler *s, Request *r) {
    kvb_free_seq(&s->blocks, r->slot);
    r->slot = -1;
}

void paged_account(Scheduler *s, long *used, long *allocated) {
    const KvBlocks *kv = &s->blocks;
    const int B = kv->block_size;
    // Rows written in each block, a shared block once. Only full blocks are ever shared (a table
    // takes another's block through a prefix hit, and only full, committed blocks are keyed), and
    // the running requests hold every block in use, so: each table's rows, minus B for every
    // table entry beyond a block's first holder. O(running) per step; walking every table's blocks
    // (and kvb_counts scanning the pool) took ~15x longer at 256 sequences on a 39,071-block pool.
    // The tests count the rows block by block after every step.
    long u = 0, held = 0;
    for (int k = 0; k < s->n_running; k++) {
        const int i = s->running[k];
        const KvTable *t = kvb_table(kv, i);
        if (!t) continue;
        const long cap = (long)t->n * B, nc = s->reqs[i].num_computed;
        u += nc < cap ? nc : cap;
        held += t->n;
    }
    const KvBlockCounts c = kvb_counts(kv);
    u -= (held - c.in_use) * B;
    if (c.in_use > s->st.peak_blocks_used) s->st.peak_blocks_used = c.in_use;
    *used = u;
    *allocated = (long)c.in_use * B;
}
