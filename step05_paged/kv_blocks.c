// kv_blocks.c — the block pool, block tables and prefix cache of kv_blocks.h. Every operation is
// O(1) per block it touches (free stack, intrusive LRU list, open-addressing hash table); only
// kvb_validate walks the whole pool.
#include "kv_blocks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "check.h"

uint64_t kvb_block_hash(uint64_t parent, const int *tokens, int n) {
    return XXH3_64bits_withSeed(tokens, (size_t)n * sizeof(int), parent);
}

// ---------------------------------------------------------------- hash table (key -> block)
// Linear probing; deletion shifts later entries of the run back, so there are no tombstones.
// The home slot comes from a mix of the key, so a poor test hash still spreads.
static size_t ht_home(const KvBlocks *kv, uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & (size_t)(kv->ht_cap - 1);
}

static int ht_find(const KvBlocks *kv, uint64_t k) {  // slot of k, or -1
    const size_t mask = (size_t)kv->ht_cap - 1;
    for (size_t i = ht_home(kv, k);; i = (i + 1) & mask) {
        if (kv->ht_val[i] < 0) return -1;
        if (kv->ht_key[i] == k) return (int)i;
    }
}

static void ht_insert(KvBlocks *kv, uint64_t k, int b) {  // k not present
    const size_t mask = (size_t)kv->ht_cap - 1;
    size_t i = ht_home(kv, k);
    while (kv->ht_val[i] >= 0) i = (i + 1) & mask;
    kv->ht_key[i] = k;
    kv->ht_val[i] = b;
    kv->ht_n++;
}

static void ht_erase_slot(KvBlocks *kv, size_t i) {
    const size_t mask = (size_t)kv->ht_cap - 1;
    for (size_t j = (i + 1) & mask; kv->ht_val[j] >= 0; j = (j + 1) & mask) {
        const size_t h = ht_home(kv, kv->ht_key[j]);
        // the entry at j may stay if its home lies cyclically in (i, j]
        const int stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (stays) continue;
        kv->ht_key[i] = kv->ht_key[j];
        kv->ht_val[i] = kv->ht_val[j];
        i = j;
    }
    kv->ht_val[i] = -1;
    kv->ht_n--;
}

// ---------------------------------------------------------------- LRU of cached blocks
static void lru_push_tail(KvBlocks *kv, int b) {  // b becomes the most recently used
    kv->prev[b] = kv->lru_tail;
    kv->next[b] = -1;
    if (kv->lru_tail >= 0) kv->next[kv->lru_tail] = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_cached++;
}

static void lru_unlink(KvBlocks *kv, int b) {
    if (kv->prev[b] >= 0) kv->next[kv->prev[b]] = kv->next[b];
    else kv->lru_head = kv->next[b];
    if (kv->next[b] >= 0) kv->prev[kv->next[b]] = kv->prev[b];
    else kv->lru_tail = kv->prev[b];
    kv->prev[b] = kv->next[b] = -1;
    kv->n_cached--;
}

// ---------------------------------------------------------------- pool
double kvb_default_blocks(int max_num_seqs, int max_len, int block_size) {
    const double all = floor((double)max_num_seqs * max_len / block_size), one = ceil((double)max_len / block_size);
    return (all > one ? all : one) + 1;
}

int kvb_init(KvBlocks *kv, int num_blocks, int block_size, int prefix_cache, char *err, int errlen) {
    memset(kv, 0, sizeof *kv);
    if (num_blocks < 2) return errf(err, errlen, "num_blocks = %d: need >= 2 (block 0 is the null block)", num_blocks);
    if (block_size < 1) return errf(err, errlen, "block_size = %d: need >= 1", block_size);
    if ((long)num_blocks * block_size > (1L << 40))
        return errf(err, errlen, "num_blocks * block_size = %ld: too many slots", (long)num_blocks * block_size);
    const size_t n = (size_t)num_blocks;
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->prefix_cache = prefix_cache ? 1 : 0;
    kv->hash_fn = kvb_block_hash;
    kv->ref = xcalloc(n, sizeof(int));
    kv->hashed = xcalloc(n, sizeof(int));
    kv->key = xcalloc(n, sizeof(uint64_t));
    kv->parent_key = xcalloc(n, sizeof(uint64_t));
    kv->parent = xmalloc(n * sizeof(int));
    kv->parent_epoch = xcalloc(n, sizeof(unsigned));
    kv->epoch = xcalloc(n, sizeof(unsigned));
    kv->tokens = kv->prefix_cache ? xcalloc(n * (size_t)block_size, sizeof(int)) : NULL;
    kv->prev = xmalloc(n * sizeof(int));
    kv->next = xmalloc(n * sizeof(int));
    kv->free_stack = xmalloc(n * sizeof(int));
    for (int b = 0; b < num_blocks; b++) kv->parent[b] = kv->prev[b] = kv->next[b] = -1;
    // free stack, so that block 1 is handed out first; block 0 is never on it
    kv->n_free = 0;
    for (int b = num_blocks - 1; b >= 1; b--) kv->free_stack[kv->n_free++] = b;
    kv->lru_head = kv->lru_tail = -1;
    kv->ht_cap = 16;
    while (kv->ht_cap < 2 * num_blocks) kv->ht_cap *= 2;
    kv->ht_key = xcalloc((size_t)kv->ht_cap, sizeof(uint64_t));
    kv->ht_val = xmalloc((size_t)kv->ht_cap * sizeof(int));
    for (int i = 0; i < kv->ht_cap; i++) kv->ht_val[i] = -1;
    return 0;
}

void kvb_free(KvBlocks *kv) {
    for (int i = 0; i < kv->n_tables; i++) {
        free(kv->tables[i].blocks);
        free(kv->tables[i].hash);
        free(kv->tables[i].canon);
        free(kv->tables[i].canon_epoch);
    }
    free(kv->tables);
    free(kv->ref);
    free(kv->hashed);
    free(kv->key);
    free(kv->parent_key);
    free(kv->parent);
    free(kv->parent_epoch);
    free(kv->epoch);
    free(kv->tokens);
    free(kv->prev);
    free(kv->next);
    free(kv->free_stack);
    free(kv->ht_key);
    free(kv->ht_val);
    memset(kv, 0, sizeof *kv);
}

void kvb_set_hash_fn(KvBlocks *kv, KvBlockHashFn fn) {
    if (kv->ht_n > 0) die("kvb_set_hash_fn: %d blocks are already hashed", kv->ht_n);
    kv->hash_fn = fn ? fn : kvb_block_hash;
}

int kvb_num_free(const KvBlocks *kv) { return kv->n_free + kv->n_cached; }
int kvb_can_allocate(const KvBlocks *kv, int n_blocks) { return n_blocks <= kvb_num_free(kv); }

static KvTable *table_get(KvBlocks *kv, int id) {
    if (id < 0) die("kv_blocks: request id %d < 0", id);
    if (id >= kv->n_tables) {
        int n = kv->n_tables ? kv->n_tables : 16;
        while (n <= id) n *= 2;
        KvTable *t = realloc(kv->tables, (size_t)n * sizeof *t);
        if (!t) die("kv_blocks: out of memory for %d block tables", n);
        memset(t + kv->n_tables, 0, (size_t)(n - kv->n_tables) * sizeof *t);
        kv->tables = t;
        kv->n_tables = n;
    }
    return &kv->tables[id];
}

static void table_reserve(KvTable *t, int n) {
    if (n <= t->cap) return;
    int cap = t->cap ? t->cap : 4;
    while (cap < n) cap *= 2;
    int *b = realloc(t->blocks, (size_t)cap * sizeof(int));
    if (!b) die("kv_blocks: out of memory for a block table of %d", cap);
    t->blocks = b;
    uint64_t *h = realloc(t->hash, (size_t)cap * sizeof(uint64_t));
    if (!h) die("kv_blocks: out of memory for a block table of %d", cap);
    t->hash = h;
    int *c = realloc(t->canon, (size_t)cap * sizeof(int));
    if (!c) die("kv_blocks: out of memory for a block table of %d", cap);
    t->canon = c;
    unsigned *e = realloc(t->canon_epoch, (size_t)cap * sizeof(unsigned));
    if (!e) die("kv_blocks: out of memory for a block table of %d", cap);
    t->canon_epoch = e;
    t->cap = cap;
}

const KvTable *kvb_table(const KvBlocks *kv, int id) {
    return id >= 0 && id < kv->n_tables ? &kv->tables[id] : NULL;
}

static int blocks_for(const KvBlocks *kv, long num_tokens) {
    return (int)((num_tokens + kv->block_size - 1) / kv->block_size);
}

int kvb_blocks_needed(const KvBlocks *kv, int id, int num_tokens) {
    const KvTable *t = kvb_table(kv, id);
    const int need = blocks_for(kv, num_tokens) - (t ? t->n : 0);
    return need > 0 ? need : 0;
}

static void unhash(KvBlocks *kv, int b) {
    const int i = ht_find(kv, kv->key[b]);
    if (i < 0 || kv->ht_val[i] != b) die("kv_blocks: block %d is hashed but not in the table", b);
    ht_erase_slot(kv, (size_t)i);
    kv->hashed[b] = 0;
    kv->parent[b] = -1;
}

// A fresh block (ref 1): the free list first, else the least recently used cached block.
static int take_block(KvBlocks *kv) {
    int b;
    if (kv->n_free > 0) {
        b = kv->free_stack[--kv->n_free];
    } else {
        b = kv->lru_head;
        if (b < 0) return -1;
        lru_unlink(kv, b);
        unhash(kv, b);
        kv->st.evictions++;
    }
    kv->ref[b] = 1;
    kv->epoch[b]++;
    return b;
}

static void release(KvBlocks *kv, int b) {
    if (kv->ref[b] <= 0) die("kv_blocks: block %d released with ref %d", b, kv->ref[b]);
    if (--kv->ref[b] > 0) return;
    if (kv->hashed[b]) lru_push_tail(kv, b);
    else kv->free_stack[kv->n_free++] = b;
}

// ---------------------------------------------------------------- requests
int kvb_lookup(KvBlocks *kv, int id, const int *tokens, int num_tokens) {
    KvTable *t = table_get(kv, id);
    if (t->n > 0) return -1;
    t->active = 1;
    t->n_hashed = 0;
    kv->st.queries++;
    kv->st.query_tokens += num_tokens > 0 ? num_tokens : 0;
    if (!kv->prefix_cache || num_tokens < 2) return 0;
    const int B = kv->block_size, max_blocks = (num_tokens - 1) / B;  // never the last token
    table_reserve(t, max_blocks);
    uint64_t pkey = KVB_HASH_SEED;
    int parent = -1;
    for (int i = 0; i < max_blocks; i++) {
        const int *tok = tokens + (size_t)i * B;
        const uint64_t k = kv->hash_fn(pkey, tok, B);
        const int s = ht_find(kv, k);
        if (s < 0) break;
        const int b = kv->ht_val[s];
        // the key matched: trust it only if the tokens and the exact parent block match too
        if (memcmp(kv->tokens + (size_t)b * B, tok, (size_t)B * sizeof(int)) != 0) break;
        if (kv->parent[b] != parent || kv->parent_key[b] != pkey) break;
        if (parent >= 0 && kv->parent_epoch[b] != kv->epoch[parent]) break;
        if (kv->ref[b] == 0) lru_unlink(kv, b);
        kv->ref[b]++;
        t->blocks[t->n] = b;
        t->hash[t->n] = k;
        t->canon[t->n] = b;
        t->canon_epoch[t->n] = kv->epoch[b];
        t->n++;
        t->n_hashed = t->n;
        pkey = k;
        parent = b;
    }
    kv->st.hit_tokens += (long)t->n * B;
    return t->n * B;
}

int kvb_allocate(KvBlocks *kv, int id, int num_tokens) {
    KvTable *t = table_get(kv, id);
    const int need = kvb_blocks_needed(kv, id, num_tokens);
    if (need == 0) return 0;
    if (!kvb_can_allocate(kv, need)) {
        kv->st.alloc_fail++;
        return -1;
    }
    table_reserve(t, t->n + need);
    for (int i = 0; i < need; i++) {
        const int b = take_block(kv);
        if (b < 0) die("kv_blocks: free count %d but no block to take", kvb_num_free(kv));
        t->blocks[t->n++] = b;
    }
    t->active = 1;
    return 0;
}

void kvb_commit(KvBlocks *kv, int id, const int *tokens, int num_computed) {
    if (!kv->prefix_cache) return;
    KvTable *t = table_get(kv, id);
    const int B = kv->block_size;
    int full = num_computed / B;
    if (full > t->n) die("kvb_commit: request %d: %d computed tokens but %d blocks of %d", id, num_computed, t->n, B);
    for (int i = t->n_hashed; i < full; i++) {
        const uint64_t pkey = i > 0 ? t->hash[i - 1] : KVB_HASH_SEED;
        const int *tok = tokens + (size_t)i * B;
        const uint64_t k = kv->hash_fn(pkey, tok, B);
        t->hash[i] = k;
        t->n_hashed = i + 1;
        t->canon[i] = -1;
        // the prefix before this block must be cached somewhere, else this one is unreachable
        const int pc = i > 0 ? t->canon[i - 1] : -1;
        const unsigned pe = i > 0 ? t->canon_epoch[i - 1] : 0;
        if (i > 0 && pc < 0) continue;
        const int s = ht_find(kv, k);
        if (s >= 0) {
            // key taken: the same prefix cached first (chain on it), or a collision (stop here)
            const int o = kv->ht_val[s];
            if (memcmp(kv->tokens + (size_t)o * B, tok, (size_t)B * sizeof(int)) == 0 && kv->parent[o] == pc &&
                kv->parent_key[o] == pkey && (pc < 0 || kv->parent_epoch[o] == pe)) {
                t->canon[i] = o;
                t->canon_epoch[i] = kv->epoch[o];
            }
            continue;
        }
        const int b = t->blocks[i];
        kv->hashed[b] = 1;
        kv->key[b] = k;
        kv->parent_key[b] = pkey;
        kv->parent[b] = pc;
        kv->parent_epoch[b] = pe;
        memcpy(kv->tokens + (size_t)b * B, tok, (size_t)B * sizeof(int));
        ht_insert(kv, k, b);
        t->canon[i] = b;
        t->canon_epoch[i] = kv->epoch[b];
    }
}

void kvb_free_seq(KvBlocks *kv, int id) {
    if (id < 0 || id >= kv->n_tables) return;
    KvTable *t = &kv->tables[id];
    for (int i = t->n - 1; i >= 0; i--) release(kv, t->blocks[i]);
    t->n = t->n_hashed = 0;
    t->active = 0;
}

long kvb_slot(const KvBlocks *kv, int id, int pos) {
    const KvTable *t = kvb_table(kv, id);
    const int B = kv->block_size;
    if (!t || pos < 0 || pos / B >= t->n) return -1;
    return (long)t->blocks[pos / B] * B + pos % B;
}

KvBlockCounts kvb_counts(const KvBlocks *kv) {
    // every usable block is free, cached or in use (kvb_validate checks it), so the blocks in use
    // are the rest: O(1), where counting ref > 0 over the pool cost the engine a scan of every
    // block each step (tens of thousands on a GPU's pool)
    const int total = kv->num_blocks - 1;
    const KvBlockCounts c = {total, kv->n_free, kv->n_cached, total - kv->n_free - kv->n_cached, kv->ht_n};
    return c;
}

// ---------------------------------------------------------------- validation
int kvb_validate(const KvBlocks *kv, char *err, int errlen) {
    const int nb = kv->num_blocks, B = kv->block_size;
    int rc = -1;
    char *where = xcalloc((size_t)nb, 1);  // 1 free list, 2 LRU
    int *count = xcalloc((size_t)nb, sizeof(int)), *seen_in = xmalloc((size_t)nb * sizeof(int));
    for (int b = 0; b < nb; b++) seen_in[b] = -1;
    if (kv->ref[0] != 0 || kv->hashed[0]) {
        errf(err, errlen, "null block: ref %d, hashed %d", kv->ref[0], kv->hashed[0]);
        goto out;
    }
    if (kv->n_free < 0 || kv->n_free > nb - 1) {
        errf(err, errlen, "free list holds %d of %d blocks", kv->n_free, nb - 1);
        goto out;
    }
    for (int i = 0; i < kv->n_free; i++) {
        const int b = kv->free_stack[i];
        if (b < 1 || b >= nb) { errf(err, errlen, "free list entry %d is block %d", i, b); goto out; }
        if (where[b]) { errf(err, errlen, "block %d twice on the free list", b); goto out; }
        if (kv->ref[b] != 0 || kv->hashed[b]) {
            errf(err, errlen, "free block %d has ref %d, hashed %d", b, kv->ref[b], kv->hashed[b]);
            goto out;
        }
        where[b] = 1;
    }
    int n_lru = 0, prev = -1;
    for (int b = kv->lru_head; b >= 0; b = kv->next[b]) {
        if (b < 1 || b >= nb || n_lru > nb) { errf(err, errlen, "LRU list reaches block %d", b); goto out; }
        if (where[b]) { errf(err, errlen, "block %d both %s and on the LRU list", b, where[b] == 1 ? "free" : "twice"); goto out; }
        if (kv->ref[b] != 0 || !kv->hashed[b]) {
            errf(err, errlen, "cached block %d has ref %d, hashed %d", b, kv->ref[b], kv->hashed[b]);
            goto out;
        }
        if (kv->prev[b] != prev) { errf(err, errlen, "LRU block %d: prev %d, expected %d", b, kv->prev[b], prev); goto out; }
        where[b] = 2;
        prev = b;
        n_lru++;
    }
    if (prev != kv->lru_tail || n_lru != kv->n_cached) {
        errf(err, errlen, "LRU list: %d blocks ending at %d, counted %d ending at %d", n_lru, prev, kv->n_cached, kv->lru_tail);
        goto out;
    }
    int in_use = 0;
    for (int b = 1; b < nb; b++) {
        if (kv->ref[b] < 0) { errf(err, errlen, "block %d: ref %d", b, kv->ref[b]); goto out; }
        if (kv->ref[b] > 0) in_use++;
        else if (!where[b]) { errf(err, errlen, "block %d: ref 0 but neither free nor cached (leaked)", b); goto out; }
    }
    if (kv->n_free + kv->n_cached + in_use != nb - 1) {
        errf(err, errlen, "free %d + cached %d + in use %d != %d usable blocks", kv->n_free, kv->n_cached, in_use, nb - 1);
        goto out;
    }
    // block tables: ref counts, the null block, chain keys
    int active = 0;
    for (int id = 0; id < kv->n_tables; id++) {
        const KvTable *t = &kv->tables[id];
        if (t->n > 0) active++;
        if (t->n < 0 || t->n > t->cap || t->n_hashed < 0 || t->n_hashed > t->n) {
            errf(err, errlen, "request %d: table of %d blocks (cap %d), %d keyed", id, t->n, t->cap, t->n_hashed);
            goto out;
        }
        for (int i = 0; i < t->n; i++) {
            const int b = t->blocks[i];
            if (b == 0) { errf(err, errlen, "request %d: the null block at table entry %d", id, i); goto out; }
            if (b < 0 || b >= nb) { errf(err, errlen, "request %d: table entry %d is block %d", id, i, b); goto out; }
            if (seen_in[b] == id) { errf(err, errlen, "request %d: block %d twice in its table", id, b); goto out; }
            seen_in[b] = id;
            count[b]++;
            if (i < t->n_hashed) {
                const uint64_t pkey = i > 0 ? t->hash[i - 1] : KVB_HASH_SEED;
                if (kv->hashed[b] && kv->key[b] != t->hash[i]) {
                    errf(err, errlen, "request %d: block %d (entry %d) keyed differently from its table", id, b, i);
                    goto out;
                }
                if (kv->hashed[b] && kv->parent_key[b] != pkey) {
                    errf(err, errlen, "request %d: block %d (entry %d): parent key differs from the table's chain", id, b, i);
                    goto out;
                }
                if (kv->hashed[b] && t->canon[i] != b) {
                    errf(err, errlen, "request %d: block %d (entry %d) is cached but the table names %d as its prefix's",
                         id, b, i, t->canon[i]);
                    goto out;
                }
                if (kv->hashed[b] && (i == 0 ? kv->parent[b] != -1
                                             : kv->parent[b] != t->canon[i - 1] ||
                                                   kv->parent_epoch[b] != t->canon_epoch[i - 1])) {
                    errf(err, errlen, "request %d: block %d (entry %d) was cached under parent %d, table has %d", id, b, i,
                         kv->parent[b], i ? t->canon[i - 1] : -1);
                    goto out;
                }
                const int c = t->canon[i];
                if (c >= 0 && c != b && (c >= nb || !kv->hashed[c] || kv->key[c] != t->hash[i])) {
                    // a stale canon (evicted since) is harmless; one still keyed must hold this key
                    if (c < nb && kv->hashed[c] && kv->epoch[c] == t->canon_epoch[i]) {
                        errf(err, errlen, "request %d: entry %d's prefix block %d holds another key", id, i, c);
                        goto out;
                    }
                }
            } else if (kv->hashed[b]) {
                errf(err, errlen, "request %d: block %d (entry %d) is hashed but not a keyed full block of the table", id, b, i);
                goto out;
            }
        }
    }
    for (int b = 0; b < nb; b++)
        if (count[b] != kv->ref[b]) {
            errf(err, errlen, "block %d: ref %d but held by %d block tables", b, kv->ref[b], count[b]);
            goto out;
        }
    // hashed blocks: owners of their keys, chains recompute
    int n_hashed = 0;
    for (int b = 1; b < nb; b++) {
        if (!kv->hashed[b]) continue;
        n_hashed++;
        if (!kv->prefix_cache) { errf(err, errlen, "block %d hashed with prefix caching off", b); goto out; }
        const int s = ht_find(kv, kv->key[b]);
        if (s < 0 || kv->ht_val[s] != b) { errf(err, errlen, "hashed block %d does not own its key", b); goto out; }
        if (kv->hash_fn(kv->parent_key[b], kv->tokens + (size_t)b * B, B) != kv->key[b]) {
            errf(err, errlen, "hashed block %d: its key does not recompute from its parent key and tokens", b);
            goto out;
        }
        const int p = kv->parent[b];
        if (p == -1 && kv->parent_key[b] != KVB_HASH_SEED) {
            errf(err, errlen, "hashed block %d: first block of its chain but its parent key is not the seed", b);
            goto out;
        }
        if (p == 0 || p < -1 || p >= nb) { errf(err, errlen, "hashed block %d: parent %d", b, p); goto out; }
        if (p > 0 && kv->hashed[p] && kv->epoch[p] == kv->parent_epoch[b] && kv->key[p] != kv->parent_key[b]) {
            errf(err, errlen, "hashed block %d: its parent %d's key is not the parent key it was chained from", b, p);
            goto out;
        }
    }
    if (n_hashed != kv->ht_n) { errf(err, errlen, "%d hashed blocks but %d hash table entries", n_hashed, kv->ht_n); goto out; }
    for (int i = 0; i < kv->ht_cap; i++) {
        const int b = kv->ht_val[i];
        if (b >= 0 && (b >= nb || !kv->hashed[b] || kv->key[b] != kv->ht_key[i])) {
            errf(err, errlen, "hash table slot %d names block %d, which does not own that key", i, b);
            goto out;
        }
    }
    if (active == 0)
        for (int b = 0; b < nb; b++)
            if (kv->ref[b] != 0) { errf(err, errlen, "no request holds blocks but block %d has ref %d", b, kv->ref[b]); goto out; }
    rc = 0;
out:
    free(where);
    free(count);
    free(seen_in);
    return rc;
}
