// test_step05_paged.c — step05's KV block manager (kv_blocks.h), on the CPU.
//
// A randomized simulation drives the manager as a scheduler would (requests arriving with random
// prompts, many sharing prefixes, prefill in chunks, growing by decode tokens, finishing, being
// preempted and re-admitted from scratch, pools small enough to run out), for block sizes 1, 16
// and 256, prefix caching on and off, xxHash and a deliberately colliding hash; kvb_validate runs
// after every operation. The test keeps its own record of which (request, position) wrote every
// K/V slot, so a prefix hit is checked against the tokens themselves, not against the hashes:
// every cached position must have been computed for exactly the same prefix. Hand-made cases pin
// the prefix hit counts (against an independent longest-common-prefix computation), the last
// token never being covered, hash collisions (a constant hash, and one that ignores the parent),
// the LRU eviction order, the slot mapping, a refused allocation changing nothing, and the
// validator catching each kind of corruption.
//
// The engine with paged KV (scheduler.h with block_size > 0, runner_new_cpu_paged, offline_run):
// driven by a fake model, after every step (schedule and update) for block sizes 1, 16, 256,
// prefix caching on/off, several budgets and pools down to a few blocks: kvb_validate, and the
// block accounting recomputed from the requests alone (every running request's table covers
// exactly its computed + scheduled tokens; ref_cnt(b) = tables holding b; free + cached + in use =
// total; every hashed block of a table full, its chain key recomputed from the request's own
// tokens, its stored ids equal to them; a request not running holds nothing; every ref 0 at the
// end), no admission in a step that preempted, and every request ending with exactly the fake
// model's tokens (or FINISH_ERROR exactly when it can never fit). With the tiny test model on the
// CPU: every logits row bit-identical to step04's slot runner for block sizes 1, 16, 256, prefix
// cache on and off on shared-prefix prompts (hits counted), pools so small that requests are
// preempted and recomputed, and a request that can never fit ending with an error while the
// others finish; a request admitted after another in the same step hits that one's blocks; a
// cancelled request gives its blocks back. batch_bench: --outputs identical to the slot run for
// block sizes 1, 16, 256, a tight pool and a shared prefix (hits with the cache, none without),
// every --steps-csv row's blocks adding up, and the memory comparison at one KV budget.
// The fused prefill (paged_prefill.h): its tile plan, its CPU reference against the per-row decode
// reference, and its tensor-core kernel emulated lane by lane (ldmatrix and mma.sync from the PTX
// ISA's fragment tables, the kernel's own index formulas) against that reference. The decode
// kernels' work order (paged_decode_order, longest context first): sorted, ties by row, every
// item kept whole.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_util.h"
#include "golden_util.h"
#include "model.h"
#include "rng.h"
#include "step04_batching/batch.h"
#include "step04_batching/offline.h"
#include "step04_batching/scheduler.h"
#include "step05_paged/kv_blocks.h"
#include "step05_paged/paged_attention.h"
#include "step05_paged/paged_prefill.h"

static const int BLOCK_SIZES[] = {1, 16, 256};

#define VALID(kv)                                                             \
    do {                                                                      \
        char verr_[256] = "";                                                 \
        int vrc_ = kvb_validate((kv), verr_, sizeof verr_);                   \
        cr_assert_eq(vrc_, 0, "invariant broken (line %d): %s", __LINE__, verr_); \
    } while (0)

static int rnd(Rng *r, int n) { return (int)(rng_u32(r) % (uint32_t)n); }

// hashes for the collision tests
static uint64_t hash_constant(uint64_t parent, const int *tokens, int n) {
    (void)parent, (void)tokens, (void)n;
    return 7;
}
static uint64_t hash_ignores_parent(uint64_t parent, const int *tokens, int n) {
    (void)parent, (void)n;
    return (uint64_t)tokens[0];
}
static uint64_t hash_weak(uint64_t parent, const int *tokens, int n) {  // 4 keys: collisions everywhere
    return (kvb_block_hash(parent, tokens, n) ^ (uint64_t)tokens[0]) & 3;
}

// ---------------------------------------------------------------- helpers

// Run one request alone: look up, allocate and compute its prompt, decode until it holds
// total tokens (the last one sampled, not computed), commit as it goes, finish. Returns the hit.
static int run_alone(KvBlocks *kv, int id, const int *tokens, int n_prompt, int total) {
    const int cached = kvb_lookup(kv, id, tokens, n_prompt);
    VALID(kv);
    cr_assert_eq(kvb_allocate(kv, id, n_prompt), 0, "request %d: prompt of %d does not fit", id, n_prompt);
    kvb_commit(kv, id, tokens, n_prompt);
    VALID(kv);
    for (int n = n_prompt + 1; n < total; n++) {  // token n-1 sampled, now computed
        cr_assert_eq(kvb_allocate(kv, id, n), 0);
        kvb_commit(kv, id, tokens, n);
        VALID(kv);
    }
    kvb_free_seq(kv, id);
    VALID(kv);
    return cached;
}

static int lcp(const int *a, int na, const int *b, int nb) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

// ---------------------------------------------------------------- basics

Test(step05, init_rejects_bad_sizes) {
    KvBlocks kv;
    char err[128];
    cr_expect_eq(kvb_init(&kv, 1, 16, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "num_blocks") != NULL, "%s", err);
    cr_expect_eq(kvb_init(&kv, 8, 0, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "block_size") != NULL, "%s", err);
    cr_assert_eq(kvb_init(&kv, 2, 16, 1, err, sizeof err), 0, "%s", err);
    cr_expect_eq(kvb_num_free(&kv), 1, "one usable block next to the null block");
    VALID(&kv);
    kvb_free(&kv);
}

// The default pool (no --num-blocks): max_num_seqs x max_len tokens rounded down to blocks, never
// fewer blocks than one whole sequence needs (rounded up), + the null block.
Test(step05, default_pool_holds_one_whole_sequence) {
    cr_expect_eq(kvb_default_blocks(1, 220, 16), 15.0, "14 blocks hold 220 positions, + the null block");
    cr_expect_eq(kvb_default_blocks(1, 256, 16), 17.0);
    cr_expect_eq(kvb_default_blocks(8, 64, 16), 33.0);
    cr_expect_eq(kvb_default_blocks(3, 100, 16), 19.0, "floor(300 / 16) = 18 >= ceil(100 / 16) = 7");
    cr_expect_eq(kvb_default_blocks(24, 64, 256), 7.0, "floor(1536 / 256) = 6 >= 1");
    cr_expect_eq(kvb_default_blocks(1, 300, 256), 3.0, "ceil(300 / 256) = 2 > floor(300 / 256) = 1");
    for (int seqs = 1; seqs <= 9; seqs++)
        for (int len = 2; len <= 70; len++)
            for (int B = 1; B <= 33; B += 4) {
                const int nb = (int)kvb_default_blocks(seqs, len, B);
                const long tok = (long)(nb - 1) * B, all = (long)seqs * len;  // usable positions (block 0 is null)
                cr_assert_geq(tok, len, "%d seqs, max_len %d, B %d: %d blocks do not hold one sequence", seqs, len, B, nb);
                cr_assert_gt(tok + B, all, "%d seqs, max_len %d, B %d: %d blocks, over a block short", seqs, len, B, nb);
                cr_assert_leq(tok, all > len + B - 1 ? all : len + B - 1, "%d seqs, max_len %d, B %d: %d blocks, too many", seqs,
                              len, B, nb);
            }
}

Test(step05, null_block_is_never_handed_out) {
    for (size_t bi = 0; bi < 3; bi++) {
        const int B = BLOCK_SIZES[bi];
        KvBlocks kv;
        cr_assert_eq(kvb_init(&kv, 9, B, 0, NULL, 0), 0);
        // take every block, one request per block
        for (int id = 0; id < 8; id++) cr_assert_eq(kvb_allocate(&kv, id, B), 0);
        cr_expect_eq(kvb_allocate(&kv, 8, 1), -1, "pool exhausted");
        int seen[9] = {0};
        for (int id = 0; id < 8; id++) {
            const KvTable *t = kvb_table(&kv, id);
            cr_assert_eq(t->n, 1);
            cr_expect_neq(t->blocks[0], 0, "block 0 handed out");
            cr_expect_eq(seen[t->blocks[0]]++, 0, "block %d handed out twice", t->blocks[0]);
        }
        VALID(&kv);
        for (int id = 0; id < 8; id++) kvb_free_seq(&kv, id);
        VALID(&kv);
        cr_expect_eq(kvb_counts(&kv).in_use, 0);
        kvb_free(&kv);
    }
}

// Slots of several interleaved requests, from the blocks the test saw each one get.
Test(step05, slot_mapping_matches_an_independent_computation) {
    for (size_t bi = 0; bi < 3; bi++) {
        const int B = BLOCK_SIZES[bi], NB = 40, NR = 5;
        KvBlocks kv;
        cr_assert_eq(kvb_init(&kv, NB, B, 0, NULL, 0), 0);
        Rng r;
        rng_seed(&r, 500 + B);
        int len[5] = {0}, got[5][40], n_got[5] = {0};
        for (int round = 0; round < 12; round++)
            for (int id = 0; id < NR; id++) {
                const int grow = 1 + rnd(&r, 2 * B);
                const int before = kvb_table(&kv, id) ? kvb_table(&kv, id)->n : 0;
                if (kvb_allocate(&kv, id, len[id] + grow) != 0) continue;
                len[id] += grow;
                const KvTable *t = kvb_table(&kv, id);
                for (int i = before; i < t->n; i++) got[id][n_got[id]++] = t->blocks[i];  // the new ones
                VALID(&kv);
            }
        // every covered position: block it was given * B + offset; all slots distinct, none in block 0
        char *used = calloc((size_t)NB * B, 1);
        for (int id = 0; id < NR; id++) {
            cr_assert_eq(n_got[id], (len[id] + B - 1) / B, "request %d: %d tokens in %d blocks", id, len[id], n_got[id]);
            for (int pos = 0; pos < n_got[id] * B; pos++) {
                const long want = (long)got[id][pos / B] * B + pos % B;
                const long s = kvb_slot(&kv, id, pos);
                cr_assert_eq(s, want, "B %d request %d pos %d: slot %ld, want %ld", B, id, pos, s, want);
                cr_assert(s >= B && s < (long)NB * B, "slot %ld outside the usable pool", s);
                cr_assert_eq(used[s]++, 0, "slot %ld given twice", s);
            }
            cr_expect_eq(kvb_slot(&kv, id, n_got[id] * B), -1, "past the table");
            cr_expect_eq(kvb_slot(&kv, id, -1), -1);
        }
        free(used);
        cr_expect_eq(kvb_slot(&kv, 99, 0), -1, "no such request");
        kvb_free(&kv);
    }
}

// A snapshot of everything observable, to show a refused allocation changed nothing.
typedef struct {
    int n_free, n_cached, lru_head, lru_tail, ht_n, tn, *ref, *free_stack, *next, *tblocks;
    unsigned *epoch;
} Snap;
static void snap(const KvBlocks *kv, int id, Snap *s) {
    const size_t n = (size_t)kv->num_blocks;
    s->n_free = kv->n_free, s->n_cached = kv->n_cached, s->lru_head = kv->lru_head, s->lru_tail = kv->lru_tail;
    s->ht_n = kv->ht_n;
    s->ref = malloc(n * sizeof(int)), memcpy(s->ref, kv->ref, n * sizeof(int));
    s->free_stack = malloc(n * sizeof(int)), memcpy(s->free_stack, kv->free_stack, n * sizeof(int));
    s->next = malloc(n * sizeof(int)), memcpy(s->next, kv->next, n * sizeof(int));
    s->epoch = malloc(n * sizeof(unsigned)), memcpy(s->epoch, kv->epoch, n * sizeof(unsigned));
    const KvTable *t = kvb_table(kv, id);
    s->tn = t ? t->n : 0;
    s->tblocks = malloc((size_t)(s->tn + 1) * sizeof(int));
    if (s->tn) memcpy(s->tblocks, t->blocks, (size_t)s->tn * sizeof(int));
}
static void snap_expect_same(const KvBlocks *kv, int id, const Snap *a) {
    Snap b;
    snap(kv, id, &b);
    const size_t n = (size_t)kv->num_blocks;
    cr_expect(a->n_free == b.n_free && a->n_cached == b.n_cached && a->lru_head == b.lru_head &&
                  a->lru_tail == b.lru_tail && a->ht_n == b.ht_n && a->tn == b.tn,
              "counts changed");
    cr_expect(memcmp(a->ref, b.ref, n * sizeof(int)) == 0, "ref counts changed");
    cr_expect(memcmp(a->free_stack, b.free_stack, (size_t)a->n_free * sizeof(int)) == 0, "free list changed");
    cr_expect(memcmp(a->next, b.next, n * sizeof(int)) == 0, "LRU changed");
    cr_expect(memcmp(a->epoch, b.epoch, n * sizeof(unsigned)) == 0, "blocks were handed out");
    cr_expect(memcmp(a->tblocks, b.tblocks, (size_t)a->tn * sizeof(int)) == 0, "table changed");
    free(b.ref), free(b.free_stack), free(b.next), free(b.epoch), free(b.tblocks);
}
static void snap_free(Snap *s) { free(s->ref), free(s->free_stack), free(s->next), free(s->epoch), free(s->tblocks); }

Test(step05, refused_allocation_changes_nothing) {
    for (size_t bi = 0; bi < 3; bi++) {
        const int B = BLOCK_SIZES[bi];
        KvBlocks kv;
        cr_assert_eq(kvb_init(&kv, 11, B, 1, NULL, 0), 0);  // 10 usable
        int *tok = malloc((size_t)12 * B * sizeof(int));
        for (int i = 0; i < 12 * B; i++) tok[i] = i;
        // request 0 computes 3 full blocks and finishes: 3 cached; request 1 holds 4; 3 free
        run_alone(&kv, 0, tok, 3 * B, 3 * B);
        cr_assert_eq(kvb_allocate(&kv, 1, 4 * B), 0);
        cr_assert_eq(kvb_num_free(&kv), 6);
        cr_expect(kvb_can_allocate(&kv, 6) && !kvb_can_allocate(&kv, 7));
        Snap s;
        snap(&kv, 1, &s);
        cr_expect_eq(kvb_blocks_needed(&kv, 1, 11 * B), 7);
        cr_expect_eq(kvb_allocate(&kv, 1, 11 * B), -1, "7 blocks needed, 6 to take");
        snap_expect_same(&kv, 1, &s);
        snap_free(&s);
        snap(&kv, 2, &s);
        cr_expect_eq(kvb_allocate(&kv, 2, 6 * B + 1), -1, "a new request needing 7");
        snap_expect_same(&kv, 2, &s);
        snap_free(&s);
        cr_expect_eq(kv.st.alloc_fail, 2);
        VALID(&kv);
        cr_expect_eq(kvb_allocate(&kv, 1, 10 * B), 0, "exactly the 6 left (3 of them evicted)");
        cr_expect_eq(kvb_num_free(&kv), 0);
        cr_expect_eq(kv.st.evictions, 3);
        VALID(&kv);
        kvb_free_seq(&kv, 1);
        VALID(&kv);
        free(tok);
        kvb_free(&kv);
    }
}

// ---------------------------------------------------------------- prefix caching

// Requests run one after another on a pool that never evicts: each one's hit must be what an
// independent computation says (the longest common prefix with any earlier request's computed
// tokens, whole blocks, never the last prompt token), and the hashed blocks must be the distinct
// full-block prefixes computed so far.
Test(step05, prefix_hits_match_an_independent_count) {
    for (size_t bi = 0; bi < 3; bi++) {
        const int B = BLOCK_SIZES[bi], NR = 24, MAXLEN = 5 * B + 3;
        KvBlocks kv;
        cr_assert_eq(kvb_init(&kv, NR * 6 + 2, B, 1, NULL, 0), 0);
        Rng r;
        rng_seed(&r, 77 + B);
        int fam[3][5 * 256 + 3];
        for (int f = 0; f < 3; f++)
            for (int i = 0; i < MAXLEN; i++) fam[f][i] = 1000 * f + i;
        int tok[24][5 * 256 + 3], np[24], total[24];
        long want_hits = 0, want_query = 0;
        for (int q = 0; q < NR; q++) {
            // a family prefix of random length, then tokens of its own
            const int f = rnd(&r, 3), shared = rnd(&r, MAXLEN - 1);
            np[q] = 1 + rnd(&r, MAXLEN - 2);
            if (q == 5) np[q] = np[4], memcpy(tok[q], tok[4], sizeof tok[4]);  // exactly a cached prompt again
            else {
                for (int i = 0; i < np[q]; i++) tok[q][i] = i < shared ? fam[f][i] : 100000 + q * 10000 + i;
            }
            total[q] = np[q] + 1 + rnd(&r, 3);
            for (int i = np[q]; i < total[q]; i++) tok[q][i] = 200000 + q * 10000 + i;
            if (q == 5) total[q] = total[4], memcpy(tok[q], tok[4], sizeof tok[4]);
            // independent: an earlier request computed its first total - 1 tokens
            int best = 0;
            for (int e = 0; e < q; e++) {
                const int l = lcp(tok[q], np[q], tok[e], total[e] - 1);
                if (l > best) best = l;
            }
            if (best > np[q] - 1) best = np[q] - 1;
            const int want = best / B * B;
            const int got = run_alone(&kv, q, tok[q], np[q], total[q]);
            cr_assert_eq(got, want, "B %d request %d (prompt %d): %d tokens cached, want %d", B, q, np[q], got, want);
            cr_assert(got < np[q], "the last prompt token is covered");
            want_hits += want;
            want_query += np[q];
            // the hashed blocks: distinct prefixes tok[e][0 .. (i+1)B) with (i+1)B <= total[e] - 1
            int distinct = 0;
            for (int e = 0; e <= q; e++)
                for (int i = 0; (i + 1) * B <= total[e] - 1; i++) {
                    int dup = 0;
                    for (int d = 0; d < e && !dup; d++)
                        dup = (i + 1) * B <= total[d] - 1 && lcp(tok[e], (i + 1) * B, tok[d], (i + 1) * B) == (i + 1) * B;
                    distinct += !dup;
                }
            cr_assert_eq(kvb_counts(&kv).hashed, distinct, "B %d after request %d: %d hashed blocks, want %d", B, q,
                         kvb_counts(&kv).hashed, distinct);
            cr_assert_eq(kvb_counts(&kv).in_use, 0);
        }
        cr_expect_eq(kv.st.hit_tokens, want_hits);
        cr_expect_eq(kv.st.query_tokens, want_query);
        cr_expect_eq(kv.st.queries, NR);
        cr_expect_eq(kv.st.evictions, 0);
        kvb_free(&kv);
    }
}

Test(step05, hit_never_covers_the_last_token) {
    for (size_t bi = 0; bi < 3; bi++) {
        const int B = BLOCK_SIZES[bi];
        KvBlocks kv;
        cr_assert_eq(kvb_init(&kv, 12, B, 1, NULL, 0), 0);
        int *tok = malloc((size_t)4 * B * sizeof(int));
        for (int i = 0; i < 4 * B; i++) tok[i] = 3 * i + 1;
        run_alone(&kv, 0, tok, 3 * B, 4 * B);  // 3 full blocks cached
        cr_expect_eq(kvb_lookup(&kv, 1, tok, 3 * B), 2 * B, "a prompt of exactly the cached 3 blocks: 2 hit");
        cr_expect_eq(kvb_table(&kv, 1)->n, 2);
        VALID(&kv);
        kvb_free_seq(&kv, 1);
        cr_expect_eq(kvb_lookup(&kv, 2, tok, 3 * B + 1), 3 * B, "one token more: all 3");
        kvb_free_seq(&kv, 2);
        cr_expect_eq(kvb_lookup(&kv, 3, tok, 1), 0);
        kvb_free_seq(&kv, 3);
        cr_expect_eq(kvb_lookup(&kv, 4, tok, B), 0, "a one-block prompt computes its block");
        kvb_free_seq(&kv, 4);
        VALID(&kv);
        free(tok);
        kvb_free(&kv);
    }
}

Test(step05, prefix_cache_off_never_hits) {
    KvBlocks kv;
    cr_assert_eq(kvb_init(&kv, 12, 4, 0, NULL, 0), 0);
    int tok[16];
    for (int i = 0; i < 16; i++) tok[i] = i;
    cr_expect_eq(run_alone(&kv, 0, tok, 12, 16), 0);
    cr_expect_eq(run_alone(&kv, 1, tok, 12, 16), 0);
    cr_expect_eq(kvb_counts(&kv).hashed, 0);
    cr_expect_eq(kvb_counts(&kv).free, 11);
    kvb_free(&kv);
}

// Hash collisions: a constant hash gives every block the same key; the tokens must still be
// compared (no sharing), and one block per key is cached.
Test(step05, colliding_hash_never_shares_a_block) {
    KvBlocks kv;
    cr_assert_eq(kvb_init(&kv, 20, 4, 1, NULL, 0), 0);
    kvb_set_hash_fn(&kv, hash_constant);
    int a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b[9] = {9, 9, 9, 9, 5, 6, 7, 8, 9};
    run_alone(&kv, 0, a, 9, 9);
    cr_expect_eq(kvb_counts(&kv).hashed, 1, "block 1 of a has the same key as block 0: not cached");
    cr_expect_eq(kvb_lookup(&kv, 1, b, 9), 0, "same key, other tokens: a miss");
    cr_expect_eq(kvb_table(&kv, 1)->n, 0);
    kvb_free_seq(&kv, 1);
    cr_expect_eq(kvb_lookup(&kv, 2, a, 9), 4, "a again: its first block");
    kvb_free_seq(&kv, 2);
    VALID(&kv);
    kvb_free(&kv);

    // a key that ignores the parent: block [5 6 7 8] cached under [1 2 3 4] must not be reused
    // after [9 9 9 9], though its own tokens and key match
    cr_assert_eq(kvb_init(&kv, 20, 4, 1, NULL, 0), 0);
    kvb_set_hash_fn(&kv, hash_ignores_parent);
    int c[9] = {2, 9, 9, 9, 5, 6, 7, 8, 9};
    run_alone(&kv, 0, a, 9, 9);  // caches [1 2 3 4] (key 1) and [5 6 7 8] under it (key 5)
    run_alone(&kv, 1, c, 9, 9);  // caches [2 9 9 9] (key 2); its [5 6 7 8] finds key 5 taken
    cr_expect_eq(kvb_counts(&kv).hashed, 3);
    cr_expect_eq(kvb_lookup(&kv, 2, c, 9), 4, "[2 9 9 9] hits; [5 6 7 8] was computed after [1 2 3 4]");
    kvb_free_seq(&kv, 2);
    cr_expect_eq(kvb_lookup(&kv, 3, a, 9), 8, "under its own parent it hits");
    kvb_free_seq(&kv, 3);
    VALID(&kv);
    kvb_free(&kv);
}

// A cached block names its parent by (block, epoch): when the parent is evicted and its block
// reused for another prefix with the same key, the child must not be reached through it.
// Key = the block's first token (ignores the parent), so only the epoch tells them apart.
Test(step05, evicted_parent_is_not_mistaken_for_its_successor) {
    KvBlocks kv;
    cr_assert_eq(kvb_init(&kv, 1 + 4, 4, 1, NULL, 0), 0);  // 4 usable
    kvb_set_hash_fn(&kv, hash_ignores_parent);
    int r1[5] = {1, 2, 3, 4, 9}, r2[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 9}, r3[5] = {1, 0, 0, 0, 7};
    int r5[9] = {1, 0, 0, 0, 5, 6, 7, 8, 9};
    run_alone(&kv, 0, r1, 5, 5);   // X = [1 2 3 4] cached
    run_alone(&kv, 1, r2, 4, 10);  // computes [1 2 3 4] again (X has it: chains on X), then Z = [5 6 7 8] under X
    cr_assert_eq(kvb_counts(&kv).cached, 2);
    const int X = kv.lru_head, Z = kv.lru_tail;
    cr_assert_eq(kv.parent[Z], X, "Z chained on X");
    cr_assert_eq(kvb_allocate(&kv, 4, 8), 0);  // filler: takes the 2 free blocks
    cr_assert_eq(kvb_lookup(&kv, 3, r3, 5), 0);
    cr_assert_eq(kvb_allocate(&kv, 3, 4), 0);  // evicts the least recent: X
    cr_assert_eq(kvb_table(&kv, 3)->blocks[0], X, "X reused");
    kvb_commit(&kv, 3, r3, 4);  // X now caches [1 0 0 0] under the same key 1
    kvb_free_seq(&kv, 3);
    kvb_free_seq(&kv, 4);
    VALID(&kv);
    cr_expect_eq(kvb_lookup(&kv, 5, r5, 9), 4, "[1 0 0 0] hits; Z was computed after [1 2 3 4], not after it");
    kvb_free_seq(&kv, 5);
    VALID(&kv);
    kvb_free(&kv);
}

// LRU: blocks are cached in release order, a finished request's last block first; a hit makes
// blocks most recent again; allocation takes the free list first, then the least recent.
Test(step05, lru_evicts_least_recently_used_first) {
    const int B = 4;
    KvBlocks kv;
    cr_assert_eq(kvb_init(&kv, 1 + 7, B, 1, NULL, 0), 0);  // 7 usable
    int t[3][9];
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < 9; i++) t[q][i] = 100 * q + i;
    int blk[3][2];
    for (int q = 0; q < 3; q++) {
        cr_assert_eq(kvb_lookup(&kv, q, t[q], 9), 0);
        cr_assert_eq(kvb_allocate(&kv, q, 8), 0);
        kvb_commit(&kv, q, t[q], 8);
        blk[q][0] = kvb_table(&kv, q)->blocks[0];
        blk[q][1] = kvb_table(&kv, q)->blocks[1];
    }
    VALID(&kv);
    kvb_free_seq(&kv, 1);
    kvb_free_seq(&kv, 0);
    kvb_free_seq(&kv, 2);
    cr_assert_eq(kvb_lookup(&kv, 3, t[0], 9), 8, "request 0's blocks hit");
    kvb_free_seq(&kv, 3);
    VALID(&kv);
    // least recent first: 1's tail, 1's head, 2's tail, 2's head, 0's tail, 0's head
    const int order[6] = {blk[1][1], blk[1][0], blk[2][1], blk[2][0], blk[0][1], blk[0][0]};
    cr_assert_eq(kvb_counts(&kv).free, 1);
    cr_assert_eq(kvb_counts(&kv).cached, 6);
    int other[28];
    for (int i = 0; i < 28; i++) other[i] = 5000 + i;
    cr_assert_eq(kvb_lookup(&kv, 4, other, 28), 0);
    cr_assert_eq(kvb_allocate(&kv, 4, B), 0);
    cr_expect_eq(kv.st.evictions, 0, "the free block goes first");
    for (int k = 0; k < 6; k++) {
        cr_assert_eq(kvb_allocate(&kv, 4, (k + 2) * B), 0);
        const KvTable *tb = kvb_table(&kv, 4);
        cr_expect_eq(tb->blocks[tb->n - 1], order[k], "eviction %d took block %d, want %d", k, tb->blocks[tb->n - 1],
                     order[k]);
        cr_expect_eq(kv.st.evictions, k + 1);
        VALID(&kv);
    }
    cr_expect_eq(kvb_counts(&kv).hashed, 0, "evicted blocks drop their keys");
    kvb_free_seq(&kv, 4);
    cr_expect_eq(kvb_lookup(&kv, 5, t[0], 9), 0, "request 0's prefix is gone");
    kvb_free_seq(&kv, 5);
    VALID(&kv);
    kvb_free(&kv);
}

// The validator must be able to fail: each corruption is named.
Test(step05, validate_names_each_violation) {
    KvBlocks kv;
    int tok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    char err[256];
    struct { const char *what, *expect; } cases[] = {
        {"ref", "held by"}, {"null", "null block"}, {"token", "recompute"}, {"free twice", "free"},
        {"leak", "leaked"}, {"key", "keyed differently"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cr_assert_eq(kvb_init(&kv, 10, 4, 1, NULL, 0), 0);
        run_alone(&kv, 0, tok, 9, 9);  // 2 cached
        cr_assert_eq(kvb_lookup(&kv, 1, tok, 9), 8);
        cr_assert_eq(kvb_allocate(&kv, 1, 12), 0);
        VALID(&kv);
        const KvTable *t = kvb_table(&kv, 1);
        const int b0 = t->blocks[0], b2 = t->blocks[2];
        switch (c) {
        case 0: kv.ref[b2]++; break;
        case 1: kv.tables[1].blocks[2] = 0; break;
        case 2: kv.tokens[b0 * 4 + 1] ^= 1; break;
        case 3: kv.free_stack[1] = kv.free_stack[0]; break;
        case 4: kv.ref[b2] = 0, kv.tables[1].n = 2; break;
        case 5: kv.key[b0] ^= 1; break;
        }
        err[0] = 0;
        cr_expect_eq(kvb_validate(&kv, err, sizeof err), -1, "%s not caught", cases[c].what);
        cr_expect(strstr(err, cases[c].expect) != NULL, "%s: message '%s' lacks '%s'", cases[c].what, err, cases[c].expect);
        kvb_free(&kv);
    }
}

// ---------------------------------------------------------------- the simulation

typedef struct {
    int *tok, n_prompt, total;  // the whole sequence is fixed in advance (a fake model)
    int num_tokens, num_computed;
    int state;  // 0 not arrived, 1 waiting, 2 running, 3 done
} SimReq;

typedef struct {
    int B, num_blocks, n_reqs, prefix_cache, chunk;
    KvBlockHashFn hash;
    uint64_t seed;
} SimCfg;

typedef struct {
    long preemptions, refusals, hit_tokens, steps, evictions;
} SimOut;

static void sim_preempt(KvBlocks *kv, SimReq *q, int id, int *waiting, int *nw, int *running, int *nr, int at) {
    kvb_free_seq(kv, id);
    VALID(kv);
    q[id].num_computed = 0;
    q[id].state = 1;
    memmove(running + at, running + at + 1, (size_t)(*nr - at - 1) * sizeof(int));
    (*nr)--;
    memmove(waiting + 1, waiting, (size_t)*nw * sizeof(int));  // head of waiting
    waiting[0] = id;
    (*nw)++;
}

static SimOut simulate(const SimCfg *c) {
    SimOut o = {0};
    KvBlocks kv;
    char err[128];
    cr_assert_eq(kvb_init(&kv, c->num_blocks, c->B, c->prefix_cache, err, sizeof err), 0, "%s", err);
    if (c->hash) kvb_set_hash_fn(&kv, c->hash);
    Rng r;
    rng_seed(&r, c->seed);
    const int B = c->B, usable_tokens = (c->num_blocks - 1) * B;
    // prompts: a few shared prefixes, a small vocabulary (so equal blocks happen by chance too)
    const int longest = B >= 256 ? 3 * B + 8 : 6 * B + 8;  // a few blocks each (B = 256: decode is long)
    const int maxlen = usable_tokens < longest ? usable_tokens : longest;
    int *fam = malloc((size_t)4 * maxlen * sizeof(int));
    for (int i = 0; i < 4 * maxlen; i++) fam[i] = rnd(&r, 5);
    SimReq *q = calloc((size_t)c->n_reqs, sizeof *q);
    for (int i = 0; i < c->n_reqs; i++) {
        q[i].total = 2 + rnd(&r, maxlen - 1);  // <= maxlen: fits the pool alone
        q[i].n_prompt = 1 + rnd(&r, q[i].total - 1);
        q[i].tok = malloc((size_t)q[i].total * sizeof(int));
        const int f = rnd(&r, 4), shared = rnd(&r, 3) ? rnd(&r, q[i].total + 1) : 0;
        for (int p = 0; p < q[i].total; p++) q[i].tok[p] = p < shared ? fam[f * maxlen + p] : rnd(&r, 5);
        q[i].num_tokens = q[i].n_prompt;
    }
    // who wrote each K/V slot: (request, position); a hit must read only slots written for its prefix
    int *w_req = malloc((size_t)c->num_blocks * B * sizeof(int)), *w_pos = malloc((size_t)c->num_blocks * B * sizeof(int));
    for (long s = 0; s < (long)c->num_blocks * B; s++) w_req[s] = w_pos[s] = -1;
    int *waiting = malloc((size_t)c->n_reqs * sizeof(int)), *running = malloc((size_t)c->n_reqs * sizeof(int));
    int *sched_n = malloc((size_t)c->n_reqs * sizeof(int));
    int nw = 0, nr = 0, arrived = 0, done = 0;
    long query_tokens = 0;
    while (done < c->n_reqs) {
        cr_assert(o.steps < 200000, "no progress");
        o.steps++;
        for (int k = 1 + rnd(&r, 2); k > 0 && arrived < c->n_reqs; k--) waiting[nw++] = arrived, q[arrived++].state = 1;
        // running requests first, in admission order; the newest is preempted when blocks run out
        int preempted = 0, n_sched = 0;
        for (int i = 0; i < nr; i++) {
            const int id = running[i];
            const int left = q[id].num_tokens - q[id].num_computed;
            const int n = left < c->chunk ? left : c->chunk;
            while (kvb_allocate(&kv, id, q[id].num_computed + n) != 0) {
                VALID(&kv);
                o.preemptions++;
                preempted = 1;
                const int victim = nr - 1;
                sim_preempt(&kv, q, running[victim], waiting, &nw, running, &nr, victim);
                if (victim == i) goto next_running;  // preempted itself
            }
            VALID(&kv);
            sched_n[id] = n;
            n_sched++;
            continue;
        next_running:
            break;
        }
        // a random forced preemption now and then
        if (nr > 0 && rnd(&r, 23) == 0) {
            sim_preempt(&kv, q, running[nr - 1], waiting, &nw, running, &nr, nr - 1);
            o.preemptions++;
            preempted = 1;
        }
        // admissions, only in a step that preempted nobody
        while (!preempted && nw > 0) {
            const int id = waiting[0];
            SimReq *x = &q[id];
            const int cached = kvb_lookup(&kv, id, x->tok, x->num_tokens);
            query_tokens += x->num_tokens;
            VALID(&kv);
            cr_assert(cached >= 0 && cached % B == 0 && cached < x->num_tokens, "cached %d of %d", cached, x->num_tokens);
            if (!c->prefix_cache) cr_assert_eq(cached, 0);
            for (int p = 0; p < cached; p++) {  // every cached position was computed for this very prefix
                const long s = kvb_slot(&kv, id, p);
                cr_assert(s >= B, "cached position %d at slot %ld", p, s);
                const int wr = w_req[s];
                cr_assert(wr >= 0 && w_pos[s] == p, "request %d pos %d: slot %ld holds (%d, %d)", id, p, s, wr, w_pos[s]);
                cr_assert(lcp(x->tok, p + 1, q[wr].tok, p + 1) == p + 1,
                          "request %d pos %d: cached K/V was computed for another prefix (by request %d)", id, p, wr);
            }
            const int left = x->num_tokens - cached;
            const int n = left < c->chunk ? left : c->chunk;
            const int need = kvb_blocks_needed(&kv, id, cached + n);
            cr_assert_eq(need, (cached + n + B - 1) / B - cached / B);
            if (!kvb_can_allocate(&kv, need)) {
                cr_assert(need > kvb_counts(&kv).free + kvb_counts(&kv).cached);
                cr_assert_eq(kvb_allocate(&kv, id, cached + n), -1);
                kvb_free_seq(&kv, id);
                VALID(&kv);
                o.refusals++;
                break;
            }
            cr_assert_eq(kvb_allocate(&kv, id, cached + n), 0);
            VALID(&kv);
            o.hit_tokens += cached;
            x->num_computed = cached;
            x->state = 2;
            memmove(waiting, waiting + 1, (size_t)(nw - 1) * sizeof(int));
            nw--;
            running[nr++] = id;
            sched_n[id] = n;
            n_sched++;
        }
        // the "forward": each scheduled request writes its new positions (never into a shared block)
        for (int i = 0; i < nr; i++) {
            const int id = running[i];
            SimReq *x = &q[id];
            for (int p = x->num_computed; p < x->num_computed + sched_n[id]; p++) {
                const long s = kvb_slot(&kv, id, p);
                cr_assert(s >= B && s < (long)c->num_blocks * B, "request %d pos %d: slot %ld", id, p, s);
                cr_assert_eq(kv.ref[s / B], 1, "request %d writes pos %d into block %ld shared by %d", id, p, s / B,
                             kv.ref[s / B]);
                w_req[s] = id, w_pos[s] = p;
            }
            x->num_computed += sched_n[id];
            if (x->num_computed == x->num_tokens) x->num_tokens++;  // sampled
            kvb_commit(&kv, id, x->tok, x->num_computed);
            VALID(&kv);
        }
        for (int i = 0; i < nr; i++) {
            const int id = running[i];
            if (q[id].num_tokens < q[id].total) continue;
            kvb_free_seq(&kv, id);
            VALID(&kv);
            q[id].state = 3;
            done++;
            memmove(running + i, running + i + 1, (size_t)(nr - i - 1) * sizeof(int));
            nr--, i--;
        }
    }
    VALID(&kv);
    const KvBlockCounts cnt = kvb_counts(&kv);
    cr_assert_eq(cnt.in_use, 0, "quiescent but %d blocks in use", cnt.in_use);
    cr_assert_eq(cnt.free + cnt.cached, cnt.total);
    cr_assert_eq(kv.st.query_tokens, query_tokens);
    cr_assert_eq(kv.st.hit_tokens >= o.hit_tokens, 1);
    o.evictions = kv.st.evictions;
    for (int i = 0; i < c->n_reqs; i++) free(q[i].tok);
    free(q), free(fam), free(w_req), free(w_pos), free(waiting), free(running), free(sched_n);
    kvb_free(&kv);
    return o;
}

Test(step05, random_simulation_keeps_every_invariant) {
    long preempt = 0, refusals = 0, hits = 0, evictions = 0, runs = 0;
    for (size_t bi = 0; bi < 3; bi++) {
        const int B = BLOCK_SIZES[bi];
        const int pools[2] = {8, 24};
        for (int pi = 0; pi < 2; pi++)
            for (int pc = 0; pc < 2; pc++)
                for (int h = 0; h < (pc ? 3 : 1); h++) {
                    KvBlockHashFn fns[3] = {NULL, hash_weak, hash_constant};
                    SimCfg c = {B, pools[pi], B == 256 ? 20 : 60, pc, B == 1 ? 3 : B + 5, fns[h],
                                (uint64_t)(1000 * B + 10 * pi + 3 * pc + h)};
                    const SimOut o = simulate(&c);
                    preempt += o.preemptions, refusals += o.refusals, hits += o.hit_tokens, evictions += o.evictions;
                    runs++;
                    if (pc && h == 0) cr_expect_gt(o.hit_tokens, 0, "B %d pool %d: no prefix hit at all", B, pools[pi]);
                }
    }
    cr_log_info("step05 simulation: %ld runs, %ld preemptions, %ld refused admissions, %ld hit tokens, %ld evictions",
                runs, preempt, refusals, hits, evictions);
    cr_expect_gt(preempt, 0, "the pools never ran out");
    cr_expect_gt(refusals, 0, "no admission was ever refused");
    cr_expect_gt(evictions, 0, "no cached block was ever evicted");
}

// ---------------------------------------------------------------- the engine with paged KV

// The block accounting of a paged scheduler, recomputed from the requests. extra[i]: tokens
// scheduled for request i in the step (after sched_schedule), or NULL (after sched_update).
static void check_sched_blocks(const Scheduler *s, const int *extra, const char *what) {
    const KvBlocks *kv = &s->blocks;
    char verr[256] = "";
    cr_assert_eq(kvb_validate(kv, verr, sizeof verr), 0, "%s: %s", what, verr);
    const int B = kv->block_size, NB = kv->num_blocks;
    int *holders = calloc((size_t)NB, sizeof(int));
    for (int i = 0; i < s->n_reqs; i++) {
        const Request *r = &s->reqs[i];
        const KvTable *t = kvb_table(kv, i);
        const int n = t ? t->n : 0;
        if (r->status != REQ_RUNNING) {
            cr_assert_eq(n, 0, "%s: request %d (status %d) holds %d blocks", what, i, r->status, n);
            if (r->status == REQ_WAITING) cr_assert_eq(r->num_computed, 0, "%s: waiting request %d has K/V", what, i);
            continue;
        }
        const int covered = r->num_computed + (extra ? extra[i] : 0);
        cr_assert_eq(n, (covered + B - 1) / B, "%s: request %d holds %d blocks for %d tokens of %d", what, i, n, covered, B);
        for (int j = 0; j < n; j++) {
            const int b = t->blocks[j];
            cr_assert(b >= 1 && b < NB, "%s: request %d block %d = %d", what, i, j, b);
            holders[b]++;
            if (kv->hashed[b]) cr_assert(j < t->n_hashed, "%s: request %d: hashed block %d at %d not keyed", what, i, b, j);
        }
        cr_assert(t->n_hashed <= n);
        uint64_t h = KVB_HASH_SEED;
        for (int j = 0; j < t->n_hashed; j++) {
            cr_assert((j + 1) * B <= covered, "%s: request %d: block %d keyed but not full (%d tokens)", what, i, j, covered);
            h = kvb_block_hash(h, r->tokens + (size_t)j * B, B);
            cr_assert_eq(h, t->hash[j], "%s: request %d: key of block %d does not recompute", what, i, j);
            const int b = t->blocks[j];
            if (kv->hashed[b])
                cr_assert(kv->key[b] == h && !memcmp(kv->tokens + (size_t)b * B, r->tokens + (size_t)j * B, (size_t)B * sizeof(int)),
                          "%s: request %d: block %d's key or ids differ from the request's", what, i, b);
        }
    }
    int in_use = 0;
    for (int b = 1; b < NB; b++) {
        cr_assert_eq(kv->ref[b], holders[b], "%s: block %d: ref %d, held by %d tables", what, b, kv->ref[b], holders[b]);
        in_use += holders[b] > 0;
    }
    cr_assert_eq(kv->n_free + kv->n_cached + in_use, NB - 1, "%s: %d free + %d cached + %d in use != %d", what, kv->n_free,
                 kv->n_cached, in_use, NB - 1);
    cr_assert_eq(kvb_counts(kv).in_use, in_use, "%s: kvb_counts", what);
    if (!extra) {  // after sched_update: the KV rows written, counted block by block (a shared block once)
        int *rows = calloc((size_t)NB, sizeof(int));
        long used = 0;
        for (int i = 0; i < s->n_reqs; i++) {
            const KvTable *t = kvb_table(kv, i);
            if (s->reqs[i].status != REQ_RUNNING || !t) continue;
            for (int j = 0; j < t->n; j++) {
                int r = s->reqs[i].num_computed - j * B;
                r = r < 0 ? 0 : r > B ? B : r;
                if (r > rows[t->blocks[j]]) used += r - rows[t->blocks[j]], rows[t->blocks[j]] = r;
            }
        }
        cr_assert_eq(s->st.kv_used_now, used, "%s: KV rows in use %ld, counted block by block %ld", what, s->st.kv_used_now, used);
        free(rows);
    }
    free(holders);
}

static int fake_tok(int req, int pos, int V) { return (int)((req * 7919u + pos * 104729u + 17u) % (unsigned)V); }

static int can_ever_fit(const Request *r, int max_len, int B, int num_blocks) {
    const int cap = r->num_prompt + r->max_tokens < max_len ? r->num_prompt + r->max_tokens : max_len;
    return r->num_prompt < max_len && (cap - 1 + B - 1) / B <= num_blocks - 1;
}

// n requests, most sharing a prefix from one of two families (prompt 1..max_prompt, output 1..max_out)
static Request *shared_prefix_requests(Rng *g, int n, int max_prompt, int max_out, int V, int with_arrivals) {
    Request *q = calloc((size_t)n, sizeof(Request));
    int fam[2][64], ids[64];
    for (int f = 0; f < 2; f++)
        for (int j = 0; j < 64; j++) fam[f][j] = (int)(rng_u32(g) % (unsigned)V);
    const SamplerParams sp = {.greedy = 1, .top_p = 1};
    for (int i = 0; i < n; i++) {
        const int np = 1 + (int)(rng_u32(g) % (unsigned)max_prompt), mt = 1 + (int)(rng_u32(g) % (unsigned)max_out);
        const int f = (int)(rng_u32(g) % 3), shared = f < 2 ? (int)(rng_u32(g) % (unsigned)(np + 1)) : 0;
        for (int j = 0; j < np; j++) ids[j] = j < shared ? fam[f][j] : (int)(rng_u32(g) % (unsigned)V);
        const double arr = with_arrivals ? 0.01 * (rng_u32(g) % 30) : 0;
        request_init(&q[i], i, ids, np, mt, &sp, (int)(rng_u32(g) % 2), arr);
    }
    return q;
}

typedef struct {
    long preemptions, hits, errors, steps;
} DriveOut;

// The scheduler with a fake model to the end, every invariant checked after every step.
static DriveOut drive_paged(const SchedConfig *cfg, Request *q, int n, int V, const char *what) {
    DriveOut o = {0};
    Scheduler s;
    char err[256];
    cr_assert_eq(sched_init(&s, cfg, q, n, err, sizeof err), 0, "%s: %s", what, err);
    const int B = cfg->block_size, NB = s.cfg.num_blocks;
    SchedPlan p = {0};
    int *tokens = malloc((size_t)cfg->max_num_seqs * sizeof(int)), *extra = calloc((size_t)n, sizeof(int));
    int *status_before = malloc((size_t)n * sizeof(int)), *computed_before = malloc((size_t)n * sizeof(int));
    double now = 0;
    check_sched_blocks(&s, NULL, what);
    while (!sched_done(&s)) {
        cr_assert(o.steps++ < 100000, "%s: no end", what);
        for (int i = 0; i < n; i++) status_before[i] = q[i].status, computed_before[i] = q[i].num_computed;
        const long pre = s.st.preemptions;
        sched_schedule(&s, now, &p);
        memset(extra, 0, (size_t)n * sizeof(int));
        long sum = 0;
        for (int k = 0; k < p.n; k++) {
            const int i = p.req[k];
            cr_assert(p.pad[k] == PLAN_REAL && q[i].status == REQ_RUNNING && !extra[i], "%s: bad plan entry %d", what, k);
            cr_assert(p.start[k] == q[i].num_computed && p.n_new[k] >= 1 && p.start[k] + p.n_new[k] <= q[i].num_tokens,
                      "%s: request %d scheduled %d at %d, computed %d of %d", what, i, p.n_new[k], p.start[k],
                      q[i].num_computed, q[i].num_tokens);
            cr_assert_eq(p.samples[k], p.start[k] + p.n_new[k] == q[i].num_tokens);
            if (status_before[i] == REQ_WAITING)  // just admitted: its start is the prefix hit, whole blocks
                cr_assert(p.start[k] % B == 0 && (cfg->prefix_cache || p.start[k] == 0), "%s: request %d admitted at %d", what,
                          i, p.start[k]);
            else cr_assert_eq(p.start[k], computed_before[i], "%s: running request %d moved", what, i);
            o.hits += status_before[i] == REQ_WAITING ? p.start[k] : 0;
            extra[i] = p.n_new[k];
            sum += p.n_new[k];
        }
        cr_assert(sum <= cfg->max_num_batched_tokens && s.n_running <= cfg->max_num_seqs, "%s: budget or seats", what);
        if (s.st.preemptions > pre) {
            o.preemptions += s.st.preemptions - pre;
            for (int i = 0; i < n; i++)
                cr_assert(!(status_before[i] == REQ_WAITING && q[i].status == REQ_RUNNING), "%s: request %d admitted in a step that preempted",
                          what, i);
        }
        check_sched_blocks(&s, extra, what);
        if (p.n == 0) {
            const double next = sched_next_arrival(&s);
            cr_assert(next > now, "%s: stuck at t=%.2f (next arrival %.2f)", what, now, next);
            now = next;
            continue;
        }
        for (int k = 0; k < p.n; k++) tokens[k] = p.samples[k] ? fake_tok(p.req[k], q[p.req[k]].num_tokens, V) : -1;
        now += 0.01;
        sched_update(&s, &p, tokens, now);
        check_sched_blocks(&s, NULL, what);
    }
    for (int i = 0; i < n; i++) {
        const Request *r = &q[i];
        cr_assert_eq(r->status, REQ_FINISHED);
        const int fits = can_ever_fit(r, cfg->max_len, B, NB);
        cr_assert_eq(r->finish == FINISH_ERROR, !fits, "%s: request %d finish %s, fits %d", what, i, finish_reason_name(r->finish),
                     fits);
        if (!fits) {
            o.errors++;
            continue;
        }
        const int cap = r->num_prompt + r->max_tokens < cfg->max_len ? r->num_prompt + r->max_tokens : cfg->max_len;
        int end = cap;
        for (int pos = r->num_prompt; pos < cap; pos++) {
            const int t = fake_tok(i, pos, V);
            int eos = 0;
            for (int e = 0; e < cfg->n_eos; e++) eos |= t == cfg->eos[e];
            if (eos && !r->ignore_eos) {
                end = pos + 1;
                break;
            }
        }
        cr_assert_eq(r->num_tokens, end, "%s: request %d ended at %d, expected %d", what, i, r->num_tokens, end);
        for (int pos = r->num_prompt; pos < r->num_tokens; pos++) cr_assert_eq(r->tokens[pos], fake_tok(i, pos, V));
    }
    const KvBlockCounts c = kvb_counts(&s.blocks);
    cr_assert_eq(c.in_use, 0, "%s: quiescent with %d blocks in use", what, c.in_use);
    for (int b = 1; b < NB; b++) cr_assert_eq(s.blocks.ref[b], 0);
    cr_assert_eq(o.preemptions, s.st.preemptions);
    free(tokens), free(extra), free(status_before), free(computed_before);
    plan_free(&p);
    sched_free(&s);
    return o;
}

Test(step05, paged_scheduler_block_accounting_after_every_step) {
    const long budgets[] = {7, 64, 1000000};
    const int pool_tokens[] = {60, 400};
    Rng g;
    rng_seed(&g, 505);
    const int V = 40;
    long preempt = 0, hits = 0, errors = 0, runs = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int pc = 0; pc < 2; pc++)
            for (int ui = 0; ui < 3; ui++)
                for (int pi = 0; pi < 2; pi++) {
                    const int B = BLOCK_SIZES[bi];
                    const int n = 20;
                    Request *q = shared_prefix_requests(&g, n, 40, 30, V, (ui + pi) % 2);
                    SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 6, .max_num_batched_tokens = budgets[ui],
                                     .max_len = 96, .n_eos = 2, .eos = {3, 11}, .block_size = B,
                                     .num_blocks = pool_tokens[pi] / B + 1 > 2 ? pool_tokens[pi] / B + 1 : 2, .prefix_cache = pc};
                    char what[160];
                    snprintf(what, sizeof what, "B %d prefix %d budget %ld pool %d", B, pc, budgets[ui], c.num_blocks);
                    const DriveOut o = drive_paged(&c, q, n, V, what);
                    preempt += o.preemptions, hits += o.hits, errors += o.errors, runs++;
                    for (int i = 0; i < n; i++) request_free(&q[i]);
                    free(q);
                }
    fprintf(stderr, "[step05] paged scheduler: %ld runs, %ld preemptions, %ld hit tokens, %ld never-fitting requests\n", runs, preempt,
                hits, errors);
    cr_expect_gt(preempt, 0, "no request was ever preempted");
    cr_expect_gt(hits, 0, "no prefix hit at all");
    cr_expect_gt(errors, 0, "no request was too big for a pool");
}

Test(step05, paged_scheduler_refuses_static_and_bad_sizes) {
    Request r[1];
    const SamplerParams sp = {.greedy = 1, .top_p = 1};
    const int ids[4] = {1, 2, 3, 4};
    request_init(&r[0], 0, ids, 4, 4, &sp, 1, 0);
    Scheduler s;
    char err[256] = "";
    SchedConfig c = {.policy = POLICY_STATIC, .max_num_seqs = 2, .max_num_batched_tokens = 64, .max_len = 32, .block_size = 16};
    cr_expect_eq(sched_init(&s, &c, r, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "static") != NULL, "%s", err);
    c.policy = POLICY_CONTINUOUS, c.block_size = -1;
    cr_expect_eq(sched_init(&s, &c, r, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "block_size") != NULL, "%s", err);
    c.block_size = 16, c.num_blocks = 1;
    cr_expect_eq(sched_init(&s, &c, r, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "num_blocks") != NULL, "%s", err);
    c.num_blocks = 0;  // default: kv_tokens (2 x 32) / 16 blocks + the null block
    cr_assert_eq(sched_init(&s, &c, r, 1, err, sizeof err), 0, "%s", err);
    cr_expect_eq(s.cfg.num_blocks, 5);
    sched_free(&s);
    request_free(&r[0]);
}

// ---- the tiny test model: every logits row against step04's slot runner

typedef struct {
    int np, mt;
    int ids[96];
} PSpec;

enum { MAXGEN = 16 };

typedef struct {
    int V, n, record;          // record: 1 = fill ref, 0 = compare with it
    float *ref;                // (n, MAXGEN, V) logits of the slot run, by (request, generated index)
    char *have;                // (n, MAXGEN)
    long compared, mismatched;
    const char *what;
    long steps;
} LogitRec;

static void on_logits_rec(void *ctx, const Request *r, const float *logits, int vocab) {
    LogitRec *L = ctx;
    const int g = r->num_tokens - r->num_prompt;
    cr_assert(g < MAXGEN && vocab == L->V);
    float *dst = L->ref + ((size_t)r->index * MAXGEN + g) * vocab;
    char *h = &L->have[r->index * MAXGEN + g];
    if (L->record && !*h) {
        memcpy(dst, logits, (size_t)vocab * sizeof(float));
        *h = 1;
        return;
    }
    cr_assert(*h, "%s: request %d output %d has no reference", L->what, r->index, g);
    L->compared++;
    L->mismatched += memcmp(dst, logits, (size_t)vocab * sizeof(float)) != 0;
}

static void on_step_check(void *ctx, const Scheduler *s, const SchedPlan *p, double t) {
    (void)p, (void)t;
    LogitRec *L = ctx;
    L->steps++;
    if (s->paged) check_sched_blocks(s, NULL, L->what);
}

typedef struct {
    long preemptions, hit_tokens;
    int errors;
} EngineOut;

// The specs through offline_run: B = 0 slots (max_num_seqs x max_len), else a pool of num_blocks.
static EngineOut run_engine(const CpuModel *m, const PSpec *spec, int n, int B, int num_blocks, int prefix, long budget, int seqs,
                            int **out, LogitRec *L) {
    const int max_len = 96;
    Request *r = calloc((size_t)n, sizeof(Request));
    const SamplerParams sp = {.greedy = 1, .top_p = 1};
    for (int i = 0; i < n; i++) request_init(&r[i], i, spec[i].ids, spec[i].np, spec[i].mt, &sp, 1, 0);
    SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = seqs, .max_num_batched_tokens = budget, .max_len = max_len,
                     .block_size = B, .num_blocks = num_blocks, .prefix_cache = prefix};
    Scheduler s;
    char err[256];
    cr_assert_eq(sched_init(&s, &c, r, n, err, sizeof err), 0, "%s", err);
    const long rows = budget < (long)seqs * max_len ? budget : (long)seqs * max_len;
    Runner *run = B ? runner_new_cpu_paged(m, num_blocks, B, max_len, (int)rows, err, sizeof err)
                    : runner_new_cpu(m, seqs, max_len, (int)rows, err, sizeof err);
    cr_assert(run, "%s", err);
    OfflineOpts o = {.on_logits = on_logits_rec, .on_step = on_step_check, .ctx = L};
    OfflineStats st;
    cr_assert_eq(offline_run(run, m->cfg.vocab, &s, &o, &st), 0, "%s: the engine loop failed", L->what);
    free(st.itl_ms);
    EngineOut eo = {s.st.preemptions, s.st.prefix_hit_tokens, 0};
    for (int i = 0; i < n; i++) {
        out[i] = calloc((size_t)spec[i].mt, sizeof(int));
        if (r[i].finish == FINISH_ERROR) eo.errors++;
        else {
            cr_assert_eq(r[i].finish, FINISH_LENGTH, "%s: request %d", L->what, i);
            memcpy(out[i], r[i].tokens + r[i].num_prompt, (size_t)spec[i].mt * sizeof(int));
        }
        request_free(&r[i]);
    }
    if (B) {
        const KvBlockCounts k = kvb_counts(&s.blocks);
        cr_assert_eq(k.in_use, 0, "%s: %d blocks in use at the end", L->what, k.in_use);
    }
    runner_free(run);
    sched_free(&s);
    free(r);
    return eo;
}

static void load_tiny(ModelWeights *w, CpuModel *m) {
    char err[512];
    cr_assert_eq(model_load(MODELS_DIR "/qwen3_qknorm_f32", w, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cpu_model_load(w, m, err, sizeof err), 0, "%s", err);
}

// 8 requests: 5 share a 40-token prefix (then 1..16 own ids), 3 are random; outputs 4..12
static void make_specs(const CpuModel *m, PSpec *spec, int n, uint64_t seed) {
    Rng g;
    rng_seed(&g, seed);
    const int V = m->cfg.vocab;
    int prefix[40];
    for (int j = 0; j < 40; j++) prefix[j] = (int)(rng_u32(&g) % (unsigned)V);
    for (int i = 0; i < n; i++) {
        const int shared = i % 3 != 2;
        spec[i].np = shared ? 40 + 1 + (int)(rng_u32(&g) % 16) : 1 + (int)(rng_u32(&g) % 30);
        spec[i].mt = 4 + (int)(rng_u32(&g) % 9);
        for (int j = 0; j < spec[i].np; j++)
            spec[i].ids[j] = shared && j < 40 ? prefix[j] : (int)(rng_u32(&g) % (unsigned)V);
    }
}

Test(step05, paged_outputs_identical_to_slots_on_cpu) {
    ModelWeights w;
    CpuModel m;
    load_tiny(&w, &m);
    enum { N = 8 };
    PSpec spec[N];
    make_specs(&m, spec, N, 77);
    const int V = m.cfg.vocab;
    LogitRec L = {V, N, 1, calloc((size_t)N * MAXGEN * V, sizeof(float)), calloc(N * MAXGEN, 1), 0, 0, "slots", 0};
    int *ref[N], *got[N];
    run_engine(&m, spec, N, 0, 0, 0, 1000000, 4, ref, &L);
    L.record = 0;
    long hits_on = 0;
    for (int bi = 0; bi < 3; bi++)
        for (int pc = 0; pc < 2; pc++)
            for (int ui = 0; ui < 2; ui++) {
                const int B = BLOCK_SIZES[bi];
                const long budget = ui ? 1000000 : 7;
                char what[128];
                snprintf(what, sizeof what, "B %d prefix %d budget %ld", B, pc, budget);
                L.what = what, L.compared = L.mismatched = 0;
                const EngineOut eo = run_engine(&m, spec, N, B, 4 * 96 / B + 2, pc, budget, 4, got, &L);
                cr_expect_eq(L.mismatched, 0, "%s: %ld of %ld logits rows differ from the slot runner's", what, L.mismatched,
                             L.compared);
                cr_expect_gt(L.compared, 0);
                for (int i = 0; i < N; i++) {
                    for (int t = 0; t < spec[i].mt; t++)
                        cr_expect_eq(got[i][t], ref[i][t], "%s: request %d token %d: %d, slots %d", what, i, t, got[i][t], ref[i][t]);
                    free(got[i]);
                }
                if (!pc) cr_expect_eq(eo.hit_tokens, 0, "%s: hits without prefix caching", what);
                else if (B <= 16) cr_expect_gt(eo.hit_tokens, 0, "%s: no prefix hit on a shared 40-token prefix", what);
                if (pc) hits_on += eo.hit_tokens;
            }
    fprintf(stderr, "[step05] paged vs slots: prefix hits %ld tokens\n", hits_on);
    for (int i = 0; i < N; i++) free(ref[i]);
    free(L.ref), free(L.have);
    cpu_model_free(&m);
    model_free(&w);
}

Test(step05, preempted_and_never_fitting_requests_on_cpu) {
    ModelWeights w;
    CpuModel m;
    load_tiny(&w, &m);
    enum { N = 8 };
    PSpec spec[N];
    make_specs(&m, spec, N, 78);
    const int V = m.cfg.vocab;
    spec[5].np = 70, spec[5].mt = 12;  // 81 positions: more than the tight pools below hold
    for (int j = 0; j < 70; j++) spec[5].ids[j] = (j * 31 + 5) % V;
    LogitRec L = {V, N, 1, calloc((size_t)N * MAXGEN * V, sizeof(float)), calloc(N * MAXGEN, 1), 0, 0, "slots", 0};
    int *ref[N], *got[N];
    run_engine(&m, spec, N, 0, 0, 0, 1000000, 4, ref, &L);
    L.record = 0;
    long preempt = 0;
    // pools of 64 usable tokens (blocks of 1 and 16): every request but #5 fits alone, 4 at once do not
    const int cases[][4] = {{16, 5, 1, 64}, {16, 5, 0, 16}, {16, 5, 1, 9}, {1, 65, 1, 64}, {1, 65, 0, 9}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int B = cases[ci][0], nb = cases[ci][1], pc = cases[ci][2];
        const long budget = cases[ci][3];
        char what[128];
        snprintf(what, sizeof what, "B %d pool %d prefix %d budget %ld", B, nb, pc, budget);
        L.what = what, L.compared = L.mismatched = 0;
        const EngineOut eo = run_engine(&m, spec, N, B, nb, pc, budget, 4, got, &L);
        cr_expect_eq(eo.errors, 1, "%s: %d requests ended with an error, expected 1 (#5)", what, eo.errors);
        cr_expect_eq(L.mismatched, 0, "%s: %ld of %ld logits rows differ", what, L.mismatched, L.compared);
        for (int i = 0; i < N; i++) {
            for (int t = 0; i != 5 && t < spec[i].mt; t++)
                cr_expect_eq(got[i][t], ref[i][t], "%s: request %d token %d: %d, slots %d", what, i, t, got[i][t], ref[i][t]);
            free(got[i]);
        }
        cr_expect_gt(eo.preemptions, 0, "%s: nobody was preempted", what);
        preempt += eo.preemptions;
    }
    fprintf(stderr, "[step05] tight pools: %ld preemptions, outputs identical\n", preempt);
    for (int i = 0; i < N; i++) free(ref[i]);
    free(L.ref), free(L.have);
    cpu_model_free(&m);
    model_free(&w);
}

// vLLM v1's rule: blocks computed in a step are hashed when scheduled, so a request admitted
// later in the same step already hits them (and the forward writes them before reading).
static void on_step_first(void *ctx, const Scheduler *s, const SchedPlan *p, double t) {
    (void)s, (void)t;
    int *first = ctx;
    if (first[0]++ == 0)
        for (int k = 0; k < p->n; k++) first[1 + p->req[k]] = p->start[k];
}

Test(step05, prefix_hit_within_the_same_step) {
    ModelWeights w;
    CpuModel m;
    load_tiny(&w, &m);
    const int V = m.cfg.vocab;
    int ids[2][40];
    for (int j = 0; j < 40; j++) ids[0][j] = ids[1][j] = (j * 13 + 1) % V;
    ids[1][39] = (ids[0][39] + 1) % V;  // same first 39 tokens: 2 full blocks of 16 shared
    const SamplerParams sp = {.greedy = 1, .top_p = 1};
    int out[2][2][6];
    for (int pc = 0; pc < 2; pc++) {
        Request r[2];
        for (int i = 0; i < 2; i++) request_init(&r[i], i, ids[i], 40, 6, &sp, 1, 0);
        SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 2, .max_num_batched_tokens = 1000, .max_len = 64,
                         .block_size = 16, .num_blocks = 9, .prefix_cache = pc};
        Scheduler s;
        char err[256];
        cr_assert_eq(sched_init(&s, &c, r, 2, err, sizeof err), 0, "%s", err);
        Runner *run = runner_new_cpu_paged(&m, 9, 16, 64, 128, err, sizeof err);
        cr_assert(run, "%s", err);
        int first[3] = {0, -1, -1};
        OfflineOpts o = {.on_step = on_step_first, .ctx = first};
        OfflineStats st;
        cr_assert_eq(offline_run(run, V, &s, &o, &st), 0);
        free(st.itl_ms);
        cr_expect_eq(first[1], 0);
        cr_expect_eq(first[2], pc ? 32 : 0, "prefix %d: the second request starts at %d in the first step", pc, first[2]);
        cr_expect_eq(s.st.prefix_hit_tokens, pc ? 32 : 0);
        for (int i = 0; i < 2; i++) memcpy(out[pc][i], r[i].tokens + 40, sizeof out[pc][i]), request_free(&r[i]);
        runner_free(run);
        sched_free(&s);
    }
    cr_expect(!memcmp(out[0], out[1], sizeof out[0]), "outputs differ with the prefix cache on");
    cpu_model_free(&m);
    model_free(&w);
}

// ---- batch_bench with paged KV: --outputs, --steps-csv, the summary keys

static json_t *bench_json(const char *args, const char *outputs, const char *steps) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 %s/batch_bench --preset tiny --trace nano --num-requests 24 --input-len 4:24 --output-len 4:12 "
             "--device cpu --json --outputs %s%s%s %s 2>/dev/null",
             BUILD_BIN_DIR, outputs, steps ? " --steps-csv " : "", steps ? steps : "", args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "%s", cmd);
    json_error_t je;
    json_t *j = json_loadf(p, 0, &je);
    cr_assert_eq(pclose(p), 0, "%s failed", cmd);
    cr_assert(j, "%s: not JSON: %s", cmd, je.text);
    return json_object_get(j, "summary") ? j : NULL;
}


static long jint(const json_t *sum, const char *k) {
    const json_t *v = json_object_get(sum, k);
    cr_assert(json_is_integer(v), "summary key %s missing or not an integer", k);
    return (long)json_integer_value(v);
}

static double jreal(const json_t *sum, const char *k) {
    const json_t *v = json_object_get(sum, k);
    cr_assert(json_is_number(v), "summary key %s missing or not a number", k);
    return json_number_value(v);
}

// every row: blocks used + cached + free = total, allocated = used x B, written <= allocated
static void check_steps_csv(const char *path, long steps, int B, long total) {
    char *txt = test_slurp(path, NULL), *save = NULL;
    cr_assert(txt, "%s: not written", path);
    char *line = strtok_r(txt, "\n", &save);
    cr_assert(line && !strcmp(line, "step,time_s,n_tokens,running,waiting,kv_tokens_written,kv_tokens_allocated,"
                                     "kv_blocks_used,kv_blocks_cached,kv_blocks_free,preemptions"),
              "%s: header '%s'", path, line ? line : "");
    long rows = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        long st, nt, run, wait, wr, al, used, cached, fr, pre;
        double t;
        cr_assert_eq(sscanf(line, "%ld,%lf,%ld,%ld,%ld,%ld,%ld,%ld,%ld,%ld,%ld", &st, &t, &nt, &run, &wait, &wr, &al, &used, &cached,
                            &fr, &pre),
                     11, "%s: row '%s'", path, line);
        rows++;
        cr_assert_eq(st, rows);
        cr_assert(nt >= 1 && wr <= al && used + cached + fr == total, "%s: row '%s' (total %ld)", path, line, total);
        if (B) cr_assert_eq(al, used * B, "%s: row '%s'", path, line);
    }
    cr_assert_eq(rows, steps, "%s: %ld rows for %ld steps", path, rows, steps);
    free(txt);
}

Test(step05, batch_bench_paged_outputs_steps_and_summary) {
    char dir[] = "/tmp/step05_bench_XXXXXX";
    cr_assert(mkdtemp(dir));
    char ref[300], out[300], steps[300];
    snprintf(ref, sizeof ref, "%s/slots.jsonl", dir), snprintf(out, sizeof out, "%s/out.jsonl", dir);
    snprintf(steps, sizeof steps, "%s/steps.csv", dir);
    json_t *js = bench_json("--max-num-seqs 8", ref, steps);
    const json_t *ss = json_object_get(js, "summary");
    cr_expect_str_eq(json_string_value(json_object_get(ss, "kv_layout")), "slots");
    check_steps_csv(steps, jint(ss, "steps"), 0, jint(ss, "kv_blocks_total"));
    char *want = test_slurp(ref, NULL);
    cr_assert(want, "%s: no outputs written", ref);
    cr_assert(want, "%s: no outputs written", ref);
    cr_expect(strstr(want, "{\"index\":0,\"output_ids\":[") == want, "outputs line 0: %.60s", want);
    // any block size; #1: the same KV budget as the 8 slots (blocks of 16), 3x the seats
    char same_budget[200];
    snprintf(same_budget, sizeof same_budget, "--kv paged --max-num-seqs 24 --num-blocks %ld", jint(ss, "kv_tokens_budget") / 16 + 1);
    const char *paged[] = {"--kv paged --block-size 1 --max-num-seqs 24", same_budget, "--block-size 256 --max-num-seqs 24",
                           "--block-size 4 --num-blocks 12 --max-num-seqs 24 --prefix-cache off",
                           "--kv paged --max-num-seqs 24 --prefill-attn gather", "--kv paged --max-num-seqs 24 --prefill-attn flash"};
    for (size_t k = 0; k < sizeof paged / sizeof paged[0]; k++) {
        json_t *jp = bench_json(paged[k], out, steps);
        const json_t *sp = json_object_get(jp, "summary");
        cr_expect_str_eq(json_string_value(json_object_get(sp, "kv_layout")), "paged", "%s", paged[k]);
        cr_expect_str_eq(json_string_value(json_object_get(sp, "prefill_attn")), "cpu", "%s: the CPU runner has one path",
                         paged[k]);
        const long B = jint(sp, "block_size");
        cr_expect_eq(jint(sp, "kv_tokens_budget"), (jint(sp, "num_blocks") - 1) * B);
        cr_expect(jint(sp, "kv_blocks_peak_used") <= jint(sp, "kv_blocks_total"));
        check_steps_csv(steps, jint(sp, "steps"), (int)B, jint(sp, "kv_blocks_total"));
        char *got = test_slurp(out, NULL);
        cr_assert(got, "%s: no outputs written", out);
        cr_expect_str_eq(got, want, "%s: outputs differ from the slot run's", paged[k]);
        free(got);
        if (k == 0) cr_expect_eq(jreal(sp, "kv_unused_frac"), 0.0, "blocks of 1 token: no fragmentation");
        if (k == 1) {  // the memory comparison at one KV budget
            cr_expect_eq(jint(sp, "kv_tokens_budget"), jint(ss, "kv_tokens_budget") / 16 * 16);
            cr_expect_gt(jint(sp, "peak_running"), jint(ss, "peak_running"), "paged KV holds no more sequences than slots");
            cr_expect_gt(jreal(sp, "kv_unused_frac"), 0.0);
        }
        if (k == 3) cr_expect_gt(jint(sp, "preemptions"), 0, "a pool of 11 blocks of 4: nobody preempted");
        json_decref(jp);
    }
    free(want);
    // a shared prefix: hits with the prefix cache, none without, the same outputs as slots
    json_decref(js);
    js = bench_json("--max-num-seqs 8 --shared-prefix 40", ref, NULL);
    want = test_slurp(ref, NULL);
    cr_assert(want, "%s: no outputs written", ref);
    for (int pc = 0; pc < 2; pc++) {
        json_t *jp = bench_json(pc ? "--max-num-seqs 24 --prefix-cache on --shared-prefix 40"
                                   : "--max-num-seqs 24 --prefix-cache off --shared-prefix 40",
                                out, NULL);
        const json_t *sp = json_object_get(jp, "summary");
        if (pc) cr_expect(jint(sp, "prefix_hit_tokens") > 0 && jreal(sp, "prefix_hit_rate") > 0.3, "hit rate %g",
                          jreal(sp, "prefix_hit_rate"));
        else cr_expect_eq(jint(sp, "prefix_hit_tokens"), 0);
        char *got = test_slurp(out, NULL);
        cr_assert(got, "%s: no outputs written", out);
        cr_expect_str_eq(got, want, "prefix cache %s: outputs differ from the slot run's", pc ? "on" : "off");
        free(got);
        json_decref(jp);
    }
    free(want);
    json_decref(js);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

// A client's cancel with paged KV: a running request's blocks go back at the next step boundary
// (cached ones stay cached), a waiting one ends without ever holding a block.
Test(step05, cancelled_requests_give_their_blocks_back) {
    const SamplerParams sp = {.greedy = 1, .top_p = 1};
    int ids[20];
    for (int j = 0; j < 20; j++) ids[j] = j + 1;
    Request r[3];
    for (int i = 0; i < 3; i++) request_init(&r[i], i, ids, 10 + i, 8, &sp, 1, 0);
    SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 2, .max_num_batched_tokens = 64, .max_len = 32,
                     .block_size = 4, .num_blocks = 20, .prefix_cache = 1};
    Scheduler s;
    char err[256];
    cr_assert_eq(sched_init(&s, &c, r, 3, err, sizeof err), 0, "%s", err);
    SchedPlan p = {0};
    int tokens[4], extra[3];
    double now = 0;
    for (int step = 0; !sched_done(&s); step++) {
        cr_assert(step < 100);
        if (step == 2) r[0].cancel = r[2].cancel = 1;  // 0 and 1 running, 2 waiting for a seat
        if (step == 2) cr_assert(r[0].status == REQ_RUNNING && r[2].status == REQ_WAITING);
        sched_schedule(&s, now, &p);
        memset(extra, 0, sizeof extra);
        for (int k = 0; k < p.n; k++) extra[p.req[k]] = p.n_new[k], tokens[k] = 5;
        check_sched_blocks(&s, extra, "cancel");
        if (step == 2) {
            cr_assert(r[0].finish == FINISH_ERROR && r[2].finish == FINISH_ERROR, "cancelled: %s %s", finish_reason_name(r[0].finish),
                      finish_reason_name(r[2].finish));
            const KvTable *t0 = kvb_table(&s.blocks, 0), *t2 = kvb_table(&s.blocks, 2);
            cr_assert(t0 && t0->n == 0 && (!t2 || t2->n == 0), "a cancelled request still holds blocks");
        }
        now += 0.01;
        sched_update(&s, &p, tokens, now);
        check_sched_blocks(&s, NULL, "cancel");
    }
    cr_expect_eq(r[1].finish, FINISH_LENGTH);
    cr_expect_eq(kvb_counts(&s.blocks).in_use, 0);
    cr_expect_gt(kvb_counts(&s.blocks).cached, 0, "the finished and cancelled requests' full blocks stay cached");
    plan_free(&p);
    sched_free(&s);
    for (int i = 0; i < 3; i++) request_free(&r[i]);
}

// ---------------------------------------------------------------- the fused prefill's plan and reference

// The tiles cover every row of every chunk exactly once, in PP_TILE_M / g row runs of one
// chunk, with kmax0 = the last key of the run's first row; the heaviest tiles come first.
Test(step05, prefill_tiles_cover_every_row_once) {
    const int gs[] = {1, 2, 3, 4, 5, 8};
    const PrefillChunk ch[] = {{3, 0, 1, 1}, {0, 1, 64, 1091}, {2, 65, 97, 97}, {1, 162, 5, 24}, {4, 167, 33, 33}};
    const int nc = 5, T = 201;  // rows 0 .. 199 in chunks, row 200 in none
    for (int gi = 0; gi < 6; gi++) {
        const int g = gs[gi], H = 2 * g, KV = 2, rpt = 64 / g;
        cr_assert_eq(paged_prefill_tile_rows(H, KV), rpt);
        int want = 0;
        for (int c = 0; c < nc; c++) want += (ch[c].n + rpt - 1) / rpt;
        const int nt = paged_prefill_num_tiles(ch, nc, H, KV);
        cr_assert_eq(nt, want, "g=%d: %d tiles, expected %d", g, nt, want);
        int *tiles = malloc((size_t)nt * PP_TILE_INTS * sizeof(int));
        cr_expect_eq(paged_prefill_plan(ch, nc, H, KV, tiles, nt - 1), -1, "a too small buffer accepted");
        cr_assert_eq(paged_prefill_plan(ch, nc, H, KV, tiles, nt), nt);
        int seen[201] = {0};
        for (int t = 0; t < nt; t++) {
            const int *d = tiles + (size_t)t * PP_TILE_INTS, row0 = d[0], rows = d[1], seq = d[2], kmax0 = d[3];
            cr_assert(rows >= 1 && rows <= rpt, "g=%d tile %d: %d rows", g, t, rows);
            int c = -1;
            for (int i = 0; i < nc; i++)
                if (ch[i].seq == seq) c = i;
            cr_assert(c >= 0 && row0 >= ch[c].row0 && row0 + rows <= ch[c].row0 + ch[c].n, "g=%d tile %d outside its chunk", g, t);
            cr_expect_eq((row0 - ch[c].row0) % rpt, 0);
            cr_expect_eq(kmax0, ch[c].L - ch[c].n + (row0 - ch[c].row0), "g=%d tile %d: kmax0", g, t);
            for (int r = row0; r < row0 + rows; r++) seen[r]++;
            if (t > 0) {
                const int *e = d - PP_TILE_INTS;
                cr_expect(e[3] + e[1] >= kmax0 + rows, "g=%d: tile %d has more work than tile %d before it", g, t, t - 1);
            }
        }
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < ch[c].n; j++) cr_expect_eq(seen[ch[c].row0 + j], 1, "g=%d: row %d", g, ch[c].row0 + j);
        cr_expect_eq(seen[T - 1], 0);
        free(tiles);
    }
    const PrefillChunk bad[] = {{0, 0, 0, 5}, {0, 0, 6, 5}, {-1, 0, 1, 1}};
    for (int i = 0; i < 3; i++) cr_expect_eq(paged_prefill_num_tiles(bad + i, 1, 4, 2), -1, "bad chunk %d accepted", i);
    cr_expect_eq(paged_prefill_tile_rows(6, 4), 0, "H %% KV != 0 accepted");
}

// paged_prefill_cpu (whole chunks) equals paged_decode_cpu run once per query row over its
// causal key count (L - n + j + 1) on a shuffled pool: the causal indexing, pinned.
Test(step05, prefill_reference_equals_per_row_decode_reference) {
    Rng r;
    rng_seed(&r, 1010);
    const int H = 6, KV = 2, hd = 16, qd = H * hd, kd = KV * hd, B = 7, nseq = 3, stride = 40;
    const PrefillChunk ch[] = {{2, 0, 9, 30}, {0, 9, 1, 17}, {1, 10, 12, 12}};
    const int T = 22, nblk = nseq * stride + 1;
    int *bt = malloc((size_t)nseq * stride * sizeof(int)), *perm = malloc((size_t)(nblk - 1) * sizeof(int));
    for (int i = 0; i < nblk - 1; i++) perm[i] = i + 1;
    for (int i = nblk - 2; i > 0; i--) {
        const int j = rnd(&r, i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < nseq * stride; i++) bt[i] = perm[i];
    float *kc = rng_new_uniform(&r, (size_t)nblk * B * kd, -1.0f, 1.0f), *vc = rng_new_uniform(&r, (size_t)nblk * B * kd, -1.0f, 1.0f);
    float *q = rng_new_uniform(&r, (size_t)T * qd, -2.0f, 2.0f);
    float *a = calloc((size_t)T * qd, sizeof(float)), *b = calloc((size_t)T * qd, sizeof(float));
    const float scale = 0.25f;
    paged_prefill_cpu(q, qd, kc, vc, bt, stride, B, ch, 3, H, KV, hd, scale, a, qd);
    int rows[T], seqs[T], lens[T], n = 0;
    for (int c = 0; c < 3; c++)
        for (int j = 0; j < ch[c].n; j++) rows[n] = ch[c].row0 + j, seqs[n] = ch[c].seq, lens[n] = ch[c].L - ch[c].n + j + 1, n++;
    paged_decode_cpu(q, qd, kc, vc, bt, stride, B, rows, seqs, lens, n, H, KV, hd, scale, b, qd);
    double worst = 0;
    for (size_t i = 0; i < (size_t)T * qd; i++) worst = fabs(a[i] - b[i]) > worst ? fabs(a[i] - b[i]) : worst;
    cr_expect(worst < 1e-6, "max |prefill - per-row decode| = %.3e", worst);
    // and the causal mask bites: the first row of a fresh chunk is its first key's value row
    const size_t p0 = (size_t)bt[1 * stride] * B;  // sequence 1, position 0
    for (int h = 0; h < H; h++)
        for (int e = 0; e < hd; e++)
            cr_expect_float_eq(a[(size_t)10 * qd + h * hd + e], vc[p0 * kd + (h / 3) * hd + e], 1e-6, "head %d element %d", h, e);
    free(bt), free(perm), free(kc), free(vc), free(q), free(a), free(b);
}

// ---------------------------------------------------------------- the tensor-core prefill kernel, emulated

// paged_prefill.cu's k_prefill_mma lane by lane on the host, in fp32: the kernel's own index
// formulas (the Q load, every ldmatrix row address, the S -> P register reuse, the mask's keys and
// row limits, the GQA row -> (query row, head) mapping, the output offsets) drive emulations of
// ldmatrix and mma.sync built from the PTX ISA's fragment tables, and the result must equal
// paged_prefill_cpu. An index or layout bug fails here, on any machine, before the kernel runs;
// a change to the kernel's indexing must be made here too.

// mma.m16n8k16, .f16/.bf16 inputs, .f32 accumulators: (row, col) of element i of lane's fragment
// (element i = register i / 2, low half first), as the PTX ISA's fragment tables give them.
static void frag_a(int lane, int i, int *row, int *col) {  // A, 16 x 16, i = 0..7
    *row = lane / 4 + ((i >> 1) & 1) * 8, *col = lane % 4 * 2 + (i & 1) + (i >= 4) * 8;
}
static void frag_b(int lane, int i, int *k, int *n) {  // B, 16 x 8, i = 0..3
    *k = lane % 4 * 2 + (i & 1) + (i >= 2) * 8, *n = lane / 4;
}
static void frag_c(int lane, int i, int *row, int *col) {  // C and D, 16 x 8, i = 0..3
    *row = lane / 4 + (i >= 2) * 8, *col = lane % 4 * 2 + (i & 1);
}

typedef float Frag8[32][8];  // four b32 registers of 16-bit pairs per lane (an A fragment, ldmatrix .x4)

// ldmatrix.sync.aligned.m8n8.x4{.trans}.b16 from the row-major matrix m (row length ld): lane l
// gives the address {row, col} of row l % 8 of matrix l / 8; lane t receives in register i row
// t / 4, columns 2 (t % 4) and +1 of matrix i, or with .trans rows 2 (t % 4) and +1 of column t / 4.
static void emu_ldsm4(const float *m, int ld, int addr[32][2], int trans, Frag8 r) {
    for (int t = 0; t < 32; t++)
        for (int i = 0; i < 4; i++)
            for (int h = 0; h < 2; h++) {
                const int *a = addr[8 * i + (trans ? 2 * (t % 4) + h : t / 4)];
                r[t][2 * i + h] = m[(size_t)a[0] * ld + a[1] + (trans ? t / 4 : 2 * (t % 4) + h)];
            }
}

static int emu_layout_bad;  // a fragment table that does not cover A, B or D exactly once

// d (16 x 8) += a (16 x 16) b (16 x 8), b's elements at b[lane][boff .. boff + 3] (ldmatrix
// registers boff / 2 and +1)
static void emu_mma(float d[32][4], Frag8 a, Frag8 b, int boff) {
    float A[16][16], Bm[16][8], D[16][8];
    int na[16][16] = {{0}}, nb[16][8] = {{0}}, nd[16][8] = {{0}}, r, c;
    for (int t = 0; t < 32; t++) {
        for (int i = 0; i < 8; i++) frag_a(t, i, &r, &c), A[r][c] = a[t][i], na[r][c]++;
        for (int i = 0; i < 4; i++) frag_b(t, i, &r, &c), Bm[r][c] = b[t][boff + i], nb[r][c]++;
        for (int i = 0; i < 4; i++) frag_c(t, i, &r, &c), D[r][c] = d[t][i], nd[r][c]++;
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) emu_layout_bad |= na[i][j] != 1 || (j < 8 && (nb[i][j] != 1 || nd[i][j] != 1));
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 16; k++) D[i][j] += A[i][k] * Bm[k][j];
    for (int t = 0; t < 32; t++)
        for (int i = 0; i < 4; i++) frag_c(t, i, &r, &c), d[t][i] = D[r][c];
}

#define EMU_MAXHD 128
// One CTA of k_prefill_mma: tile descriptor d, kv head kvh (the kernel's blockIdx.y).
static void emu_prefill_cta(const int *d, int kvh, const float *q, int ldq, const float *kc, const float *vc,
                            const int *bt, int bt_stride, int B, int H, int KV, int hd, float scale_log2, float *out,
                            int ldo) {
    enum { BN = PP_TILE_N, BM = PP_TILE_M, NW = PP_TILE_M / 16, NT = PP_TILE_N / 8 };
    const int LDS = hd + 8, KCH = hd / 16, DT = hd / 8, VPR = hd / 8;
    const int row0 = d[0], nrows = d[1], kmax0 = d[3], g = H / KV;
    const int *tab = bt + (size_t)d[2] * bt_stride, kmax_t = kmax0 + nrows - 1, nkt = kmax_t / BN + 1;
    const size_t kd = (size_t)KV * hd;
    float *Qs = malloc((size_t)BM * LDS * sizeof(float)), *ks = malloc((size_t)BN * LDS * sizeof(float));
    float *vs = malloc((size_t)BN * LDS * sizeof(float));
    for (int i = 0; i < BM * LDS; i++) Qs[i] = ks[i] = vs[i] = NAN;  // the padding columns: never read
    Frag8 *qa = malloc((size_t)NW * KCH * sizeof(Frag8)), b;
    static float s[NT][32][4], o[NW][EMU_MAXHD / 8][32][4];
    float m_a[NW][32], m_b[NW][32], l_a[NW][32], l_b[NW][32];
    int addr[32][2];
    for (int idx = 0; idx < BM * hd / 2; idx++) {  // Q: M row m = (query row m / g, head m % g)
        const int m = idx / (hd / 2), e = (idx % (hd / 2)) * 2, i = m / g, hh = m % g;
        float x = 0, y = 0;
        if (i < nrows) {
            const float *src = q + (size_t)(row0 + i) * ldq + (size_t)(kvh * g + hh) * hd + e;
            x = src[0], y = src[1];
        }
        Qs[m * LDS + e] = x, Qs[m * LDS + e + 1] = y;
    }
    for (int warp = 0; warp < NW; warp++) {
        for (int kc0 = 0; kc0 < KCH; kc0++) {
            for (int lane = 0; lane < 32; lane++)
                addr[lane][0] = warp * 16 + (lane & 15), addr[lane][1] = kc0 * 16 + (lane >> 4) * 8;
            emu_ldsm4(Qs, LDS, addr, 0, qa[warp * KCH + kc0]);
        }
        for (int lane = 0; lane < 32; lane++) {
            m_a[warp][lane] = m_b[warp][lane] = -INFINITY, l_a[warp][lane] = l_b[warp][lane] = 0;
            for (int j = 0; j < DT; j++) o[warp][j][lane][0] = o[warp][j][lane][1] = o[warp][j][lane][2] = o[warp][j][lane][3] = 0;
        }
    }
    for (int kt = 0; kt < nkt; kt++) {
        for (int idx = 0; idx < BN * VPR; idx++) {  // load_kv: keys past the tile's last are zeros
            const int r = idx / VPR, c = idx % VPR, p = kt * BN + r, ok = p <= kmax_t;
            const size_t prow = ok ? (size_t)tab[p / B] * B + p % B : 0;
            const size_t off = prow * kd + (size_t)kvh * hd + c * 8;
            for (int e = 0; e < 8; e++) ks[r * LDS + c * 8 + e] = ok ? kc[off + e] : 0, vs[r * LDS + c * 8 + e] = ok ? vc[off + e] : 0;
        }
        for (int warp = 0; warp < NW; warp++) {
            memset(s, 0, sizeof s);
            for (int kc0 = 0; kc0 < KCH; kc0++)
                for (int np = 0; np < NT / 2; np++) {
                    for (int lane = 0; lane < 32; lane++)
                        addr[lane][0] = np * 16 + (lane & 7) + ((lane >> 4) << 3), addr[lane][1] = kc0 * 16 + ((lane >> 3) & 1) * 8;
                    emu_ldsm4(ks, LDS, addr, 0, b);
                    emu_mma(s[2 * np], qa[warp * KCH + kc0], b, 0);
                    emu_mma(s[2 * np + 1], qa[warp * KCH + kc0], b, 4);
                }
            const int k0 = kt * BN, masked = k0 + BN - 1 > kmax0;
            float mx_a[32], mx_b[32], t_a[32], t_b[32];
            for (int lane = 0; lane < 32; lane++) {
                const int gid = lane / 4, tig = lane % 4, ra = warp * 16 + gid, rb = ra + 8;
                const int lim_a = kmax0 + (ra / g < nrows - 1 ? ra / g : nrows - 1);
                const int lim_b = kmax0 + (rb / g < nrows - 1 ? rb / g : nrows - 1);
                mx_a[lane] = m_a[warp][lane], mx_b[lane] = m_b[warp][lane];
                for (int j = 0; j < NT; j++) {
                    float *x = s[j][lane];
                    const int key = k0 + j * 8 + tig * 2;
                    for (int e = 0; e < 4; e++) x[e] *= scale_log2;
                    if (masked) {
                        if (key > lim_a) x[0] = -INFINITY;
                        if (key + 1 > lim_a) x[1] = -INFINITY;
                        if (key > lim_b) x[2] = -INFINITY;
                        if (key + 1 > lim_b) x[3] = -INFINITY;
                    }
                    mx_a[lane] = fmaxf(mx_a[lane], fmaxf(x[0], x[1])), mx_b[lane] = fmaxf(mx_b[lane], fmaxf(x[2], x[3]));
                }
            }
            for (int off = 1; off < 4; off <<= 1) {  // __shfl_xor_sync: every lane reads the old values
                memcpy(t_a, mx_a, sizeof t_a), memcpy(t_b, mx_b, sizeof t_b);
                for (int lane = 0; lane < 32; lane++)
                    mx_a[lane] = fmaxf(t_a[lane], t_a[lane ^ off]), mx_b[lane] = fmaxf(t_b[lane], t_b[lane ^ off]);
            }
            for (int lane = 0; lane < 32; lane++) {
                const float al_a = exp2f(m_a[warp][lane] - mx_a[lane]), al_b = exp2f(m_b[warp][lane] - mx_b[lane]);
                m_a[warp][lane] = mx_a[lane], m_b[warp][lane] = mx_b[lane];
                float ps_a = 0, ps_b = 0;
                for (int j = 0; j < NT; j++) {
                    float *x = s[j][lane];
                    x[0] = exp2f(x[0] - mx_a[lane]), x[1] = exp2f(x[1] - mx_a[lane]);
                    x[2] = exp2f(x[2] - mx_b[lane]), x[3] = exp2f(x[3] - mx_b[lane]);
                    ps_a += x[0] + x[1], ps_b += x[2] + x[3];
                }
                l_a[warp][lane] = l_a[warp][lane] * al_a + ps_a, l_b[warp][lane] = l_b[warp][lane] * al_b + ps_b;
                for (int j = 0; j < DT; j++) {
                    float *y = o[warp][j][lane];
                    y[0] *= al_a, y[1] *= al_a, y[2] *= al_b, y[3] *= al_b;
                }
            }
            for (int kk = 0; kk < BN / 16; kk++) {  // the S accumulators as P's A fragment, register for register
                Frag8 pa;
                for (int lane = 0; lane < 32; lane++)
                    for (int e = 0; e < 4; e++) pa[lane][e] = s[2 * kk][lane][e], pa[lane][4 + e] = s[2 * kk + 1][lane][e];
                for (int dp = 0; dp < DT / 2; dp++) {
                    for (int lane = 0; lane < 32; lane++) addr[lane][0] = kk * 16 + (lane & 15), addr[lane][1] = dp * 16 + (lane >> 4) * 8;
                    emu_ldsm4(vs, LDS, addr, 1, b);
                    emu_mma(o[warp][2 * dp], pa, b, 0);
                    emu_mma(o[warp][2 * dp + 1], pa, b, 4);
                }
            }
        }
    }
    for (int warp = 0; warp < NW; warp++) {
        float t_a[32], t_b[32];
        for (int off = 1; off < 4; off <<= 1) {
            memcpy(t_a, l_a[warp], sizeof t_a), memcpy(t_b, l_b[warp], sizeof t_b);
            for (int lane = 0; lane < 32; lane++) l_a[warp][lane] = t_a[lane] + t_a[lane ^ off], l_b[warp][lane] = t_b[lane] + t_b[lane ^ off];
        }
        for (int lane = 0; lane < 32; lane++)
            for (int half = 0; half < 2; half++) {
                const int ra = warp * 16 + lane / 4, r = half ? ra + 8 : ra, tig = lane % 4;
                if (r >= nrows * g) continue;
                const float inv = 1.0f / (half ? l_b[warp][lane] : l_a[warp][lane]);
                const size_t at = (size_t)(row0 + r / g) * ldo + (size_t)(kvh * g + r % g) * hd + tig * 2;
                for (int j = 0; j < DT; j++)
                    out[at + j * 8] = o[warp][j][lane][half * 2] * inv, out[at + j * 8 + 1] = o[warp][j][lane][half * 2 + 1] * inv;
            }
    }
    free(Qs), free(ks), free(vs), free(qa);
}

// The emulated kernel over every (tile, kv head) of a plan equals paged_prefill_cpu for g = 1, 3,
// 5, 8 (64 / g not an integer for 3 and 5: tiles with padding M rows), partial tiles, chunks
// over 1 .. 4 key tiles, block sizes 1, 7, 16, 256, hd 64 and 128; no row outside the chunks
// and no padding column is written; the fragment tables cover A, B and D exactly once.
Test(step05, prefill_mma_kernel_emulated_matches_cpu, .timeout = 120) {
    const int shapes[][3] = {{4, 4, 64}, {6, 2, 64}, {10, 2, 64}, {16, 2, 64}, {6, 2, 128}};
    const int Bs[] = {1, 7, 16, 256, 7};
    static const int CH[][2] = {{1, 0}, {5, 19}, {64, 130}, {97, 0}, {23, 70}, {1, 200}};  // {rows, earlier context}
    enum { NC = sizeof CH / sizeof CH[0] };
    Rng r;
    rng_seed(&r, 4242);
    PrefillChunk ch[NC];
    int T = 0, lmax = 0;
    for (int i = NC - 1; i >= 0; i--) {  // the last chunk's rows first, a gap row after each
        ch[i] = (PrefillChunk){i, T, CH[i][0], CH[i][0] + CH[i][1]};
        T += CH[i][0] + 1, lmax = ch[i].L > lmax ? ch[i].L : lmax;
    }
    emu_layout_bad = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int H = shapes[si][0], KV = shapes[si][1], hd = shapes[si][2], B = Bs[si], qd = H * hd, kd = KV * hd;
        const int stride = (lmax + B - 1) / B, nblk = NC * stride + 1, ldq = qd + 2 * kd, ldo = qd + 8;
        int *bt = malloc((size_t)NC * stride * sizeof(int)), *perm = malloc((size_t)nblk * sizeof(int));
        for (int i = 0; i < nblk; i++) perm[i] = i;
        for (int i = nblk - 1; i > 0; i--) {
            const int j = rnd(&r, i + 1), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int i = 0; i < NC * stride; i++) bt[i] = perm[i];
        float *kc = rng_new_uniform(&r, (size_t)nblk * B * kd, -1.0f, 1.0f), *vc = rng_new_uniform(&r, (size_t)nblk * B * kd, -1.0f, 1.0f);
        float *q = rng_new_uniform(&r, (size_t)T * ldq, -2.0f, 2.0f);
        float *ref = malloc((size_t)T * ldo * sizeof(float)), *out = malloc((size_t)T * ldo * sizeof(float));
        for (size_t i = 0; i < (size_t)T * ldo; i++) out[i] = NAN;
        const float scale = 1.0f / sqrtf((float)hd);
        paged_prefill_cpu(q, ldq, kc, vc, bt, stride, B, ch, NC, H, KV, hd, scale, ref, ldo);
        const int nt = paged_prefill_num_tiles(ch, NC, H, KV);
        cr_assert(nt > 0);
        int *tiles = malloc((size_t)nt * PP_TILE_INTS * sizeof(int));
        cr_assert_eq(paged_prefill_plan(ch, NC, H, KV, tiles, nt), nt);
        for (int t = 0; t < nt; t++)
            for (int kvh = 0; kvh < KV; kvh++)
                emu_prefill_cta(tiles + (size_t)t * PP_TILE_INTS, kvh, q, ldq, kc, vc, bt, stride, B, H, KV, hd,
                                scale * 1.4426950408889634f, out, ldo);
        double worst = 0;
        int stray = 0;
        for (int c = 0; c < NC; c++) {
            for (int j = 0; j < ch[c].n; j++) {
                const size_t row = (size_t)(ch[c].row0 + j) * ldo;
                for (int e = 0; e < qd; e++) {
                    const double err = fabs((double)out[row + e] - ref[row + e]);
                    worst = err > worst || isnan(err) ? (isnan(err) ? INFINITY : err) : worst;
                }
                for (int e = qd; e < ldo; e++) stray += !isnan(out[row + e]);
            }
            for (int e = 0; e < ldo; e++) stray += !isnan(out[(size_t)(ch[c].row0 + ch[c].n) * ldo + e]);
        }
        cr_expect(worst < 1e-5, "H=%d KV=%d hd=%d B=%d: max |emulated kernel - CPU| = %.3e", H, KV, hd, B, worst);
        cr_expect_eq(stray, 0, "H=%d KV=%d hd=%d B=%d: %d elements written outside the chunks' rows", H, KV, hd, B, stray);
        free(bt), free(perm), free(kc), free(vc), free(q), free(ref), free(out), free(tiles);
    }
    cr_expect_eq(emu_layout_bad, 0, "a fragment table does not cover its matrix exactly once");
}

// paged_decode_order: the decode work items longest context first, ties by row. Checked by its
// properties, not by another sort: the output is non-increasing in length with ties in increasing
// row order, every (row, seq, len) triple of the input is there exactly once (rows are distinct,
// so a row finds its triple), an already ordered input is left alone (return 0), and a reordered
// input reports 1. Lengths drawn from few values, so that ties are many.
Test(step05, decode_order_longest_first_keeps_each_item) {
    Rng r;
    rng_seed(&r, 99);
    static const int ns[] = {0, 1, 2, 3, 7, 64, 300};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        for (int trial = 0; trial < 20; trial++) {
            const int n = ns[k];
            int *rows = malloc((size_t)(n + 1) * sizeof(int)), *seqs = malloc((size_t)(n + 1) * sizeof(int));
            int *lens = malloc((size_t)(n + 1) * sizeof(int)), *tmp = malloc((size_t)(3 * n + 1) * sizeof(int));
            int *r0 = malloc((size_t)(n + 1) * sizeof(int)), *s0 = malloc((size_t)(n + 1) * sizeof(int));
            int *l0 = malloc((size_t)(n + 1) * sizeof(int));
            for (int i = 0; i < n; i++) {  // distinct rows in a shuffled order, sequences and lengths at random
                rows[i] = 3 * i + 1;
                const int j = (int)(rng_u32(&r) % (unsigned)(i + 1)), t = rows[i];
                rows[i] = rows[j], rows[j] = t;
            }
            for (int i = 0; i < n; i++) {
                seqs[i] = (int)(rng_u32(&r) % 1000u);
                lens[i] = trial % 4 == 0 ? 5 : (int)(rng_u32(&r) % (trial % 2 ? 4u : 2000u));  // all equal, few values, many
            }
            memcpy(r0, rows, (size_t)n * sizeof(int)), memcpy(s0, seqs, (size_t)n * sizeof(int));
            memcpy(l0, lens, (size_t)n * sizeof(int));
            const int moved = paged_decode_order(rows, seqs, lens, n, tmp);
            int in_order = 1;
            for (int i = 1; i < n; i++)
                in_order &= l0[i] < l0[i - 1] || (l0[i] == l0[i - 1] && r0[i] > r0[i - 1]);
            cr_expect_eq(moved, !in_order, "n %d trial %d: returned %d for an input %s in order", n, trial, moved,
                         in_order ? "already" : "not");
            for (int i = 1; i < n; i++) {
                cr_assert(lens[i] <= lens[i - 1], "n %d trial %d: item %d has %d keys after %d", n, trial, i, lens[i],
                          lens[i - 1]);
                if (lens[i] == lens[i - 1])
                    cr_assert(rows[i] > rows[i - 1], "n %d trial %d: tie at %d keys not in row order (%d after %d)", n,
                              trial, lens[i], rows[i], rows[i - 1]);
            }
            for (int i = 0; i < n; i++) {  // each input item once in the output, whole
                int found = 0;
                for (int j = 0; j < n; j++) {
                    if (rows[j] != r0[i]) continue;
                    found++;
                    cr_expect(seqs[j] == s0[i] && lens[j] == l0[i], "n %d: row %d came out with seq %d len %d, went in with %d %d",
                              n, r0[i], seqs[j], lens[j], s0[i], l0[i]);
                }
                cr_assert_eq(found, 1, "n %d trial %d: row %d is in the output %d times", n, trial, r0[i], found);
            }
            if (in_order)
                cr_expect(memcmp(rows, r0, (size_t)n * sizeof(int)) == 0 && memcmp(lens, l0, (size_t)n * sizeof(int)) == 0,
                          "n %d: an ordered input was changed", n);
            free(rows), free(seqs), free(lens), free(tmp), free(r0), free(s0), free(l0);
        }
    }
}

// final/'s asynchronous scheduling on the scheduler alone: a token drawn on the device and not
// known yet (Request.pending) is never keyed into the prefix cache (its block is keyed at a later
// step, with the real token: a later request sharing those tokens hits the whole block), and
// sched_stop ends a request wherever it is (running: blocks freed; waiting: out of the queue;
// finished: nothing).
Test(step05, pending_token_is_never_keyed_and_sched_stop_ends_anywhere) {
    const int B = 4;
    SchedConfig c = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 1, .max_num_batched_tokens = 64, .max_len = 32,
                     .block_size = B, .num_blocks = 20, .prefix_cache = 1};
    const SamplerParams sp = {.greedy = 1, .top_p = 1};
    int prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = 20 + i;
    Request r[3];
    request_init(&r[0], 0, prompt, 7, 10, &sp, 1, 0);  // A: 7 prompt tokens
    request_init(&r[1], 1, prompt, 3, 4, &sp, 1, 0);   // C: waits behind A (one seat)
    Scheduler s;
    char err[256];
    cr_assert_eq(sched_init(&s, &c, r, 2, err, sizeof err), 0, "%s", err);
    SchedPlan p = {0};
    const int ph[2] = {-1, -1};
    sched_schedule(&s, 0, &p);  // A's prompt; C has no seat
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.samples[0], 1);
    sched_update(&s, &p, ph, 0);  // as the engine does after a launch: a placeholder ...
    r[0].pending = 1;             // ... for position 7, still on the device
    cr_assert_eq(r[0].num_tokens, 8);
    sched_schedule(&s, 0, &p);  // A's decode at position 7: blocks 0 and 1 full of tokens, block 1 not known
    cr_assert_eq(p.n, 1);
    cr_assert_eq(p.start[0], 7);
    cr_expect_eq(kvb_table(&s.blocks, 0)->n_hashed, 1, "the block holding the pending token was keyed");
    r[0].tokens[7] = 99, r[0].pending = 0;  // the token comes back
    const int tok[2] = {98, 98};
    sched_update(&s, &p, tok, 0);
    sched_schedule(&s, 0, &p);  // A's next decode commits block 1, now with the real token
    cr_expect_eq(kvb_table(&s.blocks, 0)->n_hashed, 2);
    // A ends while running: its blocks go back (the hashed ones to the cache)
    sched_stop(&s, 0, FINISH_STOP, 1.0);
    cr_expect_eq(r[0].status, REQ_FINISHED);
    cr_expect_eq(r[0].finish, FINISH_STOP);
    cr_expect_eq(s.n_running, 0);
    cr_expect_eq(kvb_table(&s.blocks, 0)->n, 0);
    sched_stop(&s, 0, FINISH_ERROR, 2.0);  // finished: nothing changes
    cr_expect_eq(r[0].finish, FINISH_STOP);
    cr_expect(r[0].finish_s == 1.0);
    // a request with A's first 8 tokens (the once-pending one included) hits both blocks
    int q[9];
    memcpy(q, r[0].tokens, 8 * sizeof(int));
    q[8] = 5;
    cr_expect_eq(kvb_lookup(&s.blocks, 2, q, 9), 8, "the real token's block was not found in the cache");
    kvb_free_seq(&s.blocks, 2);
    // C still waits (its seat was A's); it ends there, out of the queue
    cr_expect_eq(sched_num_waiting(&s), 1);
    sched_stop(&s, 1, FINISH_STOP, 3.0);
    cr_expect_eq(sched_num_waiting(&s), 0);
    cr_expect_eq(r[1].status, REQ_FINISHED);
    cr_expect(sched_done(&s));
    sched_schedule(&s, 4.0, &p);
    cr_expect_eq(p.n, 0, "a stopped request was scheduled");
    plan_free(&p);
    sched_free(&s);
    for (int i = 0; i < 2; i++) request_free(&r[i]);
}
