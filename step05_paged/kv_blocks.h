// kv_blocks.h — step05's KV manager: a pool of fixed-size blocks, per-request block tables, the
// slot mapping, and prefix caching by a hash chain over full blocks. Plain C, no CUDA: it decides
// where every token's K/V lives; the runner writes and reads K/V there; the scheduler decides who
// runs. Tests: build/tests/run_tests --filter 'step05/*'.
// defines: KvBlocks, KvTable, KvBlockHashFn, KvBlockStats, kvb_init, kvb_free, kvb_block_hash,
//          kvb_set_hash_fn, kvb_num_free, kvb_can_allocate, kvb_blocks_needed, kvb_lookup,
//          kvb_allocate, kvb_commit, kvb_free_seq, kvb_table, kvb_slot, KvBlockCounts, kvb_counts,
//          kvb_validate
//
// The virtual-memory picture: a sequence's positions are virtual addresses, a block is a page of
// B positions, the block table is the page table. Position pos of a sequence lives at
//     slot = block_table[pos / B] * B + pos % B
// of every layer's K/V pool (num_blocks * B rows). Block 0 is the null block: never handed out,
// so a padding row may point at it (or use slot -1) without touching anyone's K/V.
//
// Every usable block (1 .. num_blocks-1) is in exactly one of three states:
//   free     ref 0, no hash: on the free list (a stack, O(1) push/pop)
//   cached   ref 0, hashed: K/V of a finished (or preempted) request's full block, kept for later
//            prefix hits, on an LRU list (intrusive, doubly linked: O(1) unlink, O(1) evict)
//   in use   ref >= 1: held by ref block tables (several when requests share a cached prefix)
// Cached blocks count as free for allocation: when the free list is empty, allocation evicts the
// least recently used cached block (its hash entry is dropped) and hands it out.
//
// Prefix caching: full block i of a sequence is keyed by h_i = hash(h_{i-1}, its B token ids)
// (h_{-1} = a fixed seed; xxHash's XXH3 by default), so a key names the whole prefix up to the
// block's end. A hash hit is trusted only after the block's token ids compare equal and its
// recorded parent is the block matched just before (the exact block, by id and allocation
// epoch): so a hash collision never shares a block, not even through a colliding parent.
// A lookup never covers a sequence's last known token (at least one token is computed, to give
// the logits the next token is sampled from). One block per hash key: a block whose key is
// already taken is not cached: when the owner holds the very same prefix (tokens and parent),
// the sequence's later blocks chain on that owner, so they are cached and reachable; when it is
// a true collision, the rest of the sequence is not cached.
//
// How the scheduler drives it, per request (id = the request's index):
//   admission   cached = kvb_lookup(id, tokens, num_tokens)       hits join the table (ref + 1)
//               n = min(num_tokens - cached, budget); if (!kvb_can_allocate(kvb_blocks_needed(id,
//               cached + n))) { kvb_free_seq(id); stop admitting; } else kvb_allocate(id, cached + n)
//   each step   kvb_allocate(id, num_computed + n) before the forward (-1: preempt someone, retry)
//   after it    kvb_commit(id, tokens, num_computed)               hash the newly full blocks
//   finish, preempt  kvb_free_seq(id)                             blocks released, last first
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The chain step: the key of a full block from its parent's key and its B token ids.
typedef uint64_t (*KvBlockHashFn)(uint64_t parent, const int *tokens, int n);
uint64_t kvb_block_hash(uint64_t parent, const int *tokens, int n);  // XXH3_64bits, seeded with parent
#define KVB_HASH_SEED 0x9e3779b97f4a7c15ULL                           // h_{-1}, the parent of block 0

// One request's block table.
typedef struct {
    int *blocks;     // (cap) physical block of logical block i
    uint64_t *hash;  // (cap) chain key of logical block i, for i < n_hashed
    int *canon;      // (cap) for i < n_hashed: the cached block holding the same prefix as block i
                     // (itself when it owns the key; another block when that one was cached first
                     // for the very same prefix; -1 when none, e.g. a true hash collision)
    unsigned *canon_epoch;  // (cap) epoch of canon[i] when it was found
    int n, cap;      // blocks held
    int n_hashed;    // leading full blocks whose key is known (hits, or committed)
    int active;      // holds blocks or has been looked up
} KvTable;

typedef struct {
    long queries;      // lookups
    long query_tokens; // Σ num_tokens looked up
    long hit_tokens;   // Σ tokens found cached (hit rate = hit_tokens / query_tokens)
    long evictions;    // cached blocks evicted to be reused
    long alloc_fail;   // kvb_allocate calls refused for lack of blocks
} KvBlockStats;

typedef struct {
    int num_blocks;    // pool size, the null block included
    int block_size;    // B tokens per block
    int prefix_cache;  // 1: hash full blocks, keep them cached after use
    KvBlockHashFn hash_fn;
    // per block (num_blocks)
    int *ref;          // block tables holding it
    int *hashed;       // 1: owns its key in the hash table
    uint64_t *key;     // its chain key (when hashed)
    uint64_t *parent_key;  // the key of its parent (KVB_HASH_SEED for logical block 0)
    int *parent;       // the cached block of the prefix before it (see KvTable.canon), -1 for block 0
    unsigned *parent_epoch;  // epoch of that parent when it was found: (block, epoch) names one prefix
    unsigned *epoch;   // bumped every time the block is handed out fresh
    int *tokens;       // (num_blocks, B) the token ids of a hashed block
    int *prev, *next;  // LRU links of cached blocks (-1 = none)
    int *free_stack;   // (num_blocks) free blocks, top at n_free - 1
    int n_free;        // blocks on the free list
    int lru_head, lru_tail, n_cached;  // head = least recently used
    // hash table: open addressing, linear probing, keyed by the 64-bit chain key
    uint64_t *ht_key;  // (ht_cap)
    int *ht_val;       // (ht_cap) block, -1 = empty slot
    int ht_cap, ht_n;
    // block tables, by request id (grown on demand)
    KvTable *tables;
    int n_tables;
    KvBlockStats st;
} KvBlocks;

// The default pool when none is asked for: max_num_seqs x max_len tokens in blocks of block_size
// (rounded down), but never fewer than one sequence of max_len needs (rounded up: with one seat
// and a max_len that is not a multiple of the block size, the rounded-down pool could not hold
// the one request it is for), plus the null block 0. A double: the caller checks the range.
double kvb_default_blocks(int max_num_seqs, int max_len, int block_size);
// 0, or -1 + err (num_blocks < 2, block_size < 1).
int kvb_init(KvBlocks *kv, int num_blocks, int block_size, int prefix_cache, char *err, int errlen);
void kvb_free(KvBlocks *kv);
// Test hook: replace the chain hash (only while no block is hashed). NULL restores XXH3.
void kvb_set_hash_fn(KvBlocks *kv, KvBlockHashFn fn);

int kvb_num_free(const KvBlocks *kv);  // blocks allocation may take: free + cached with ref 0
int kvb_can_allocate(const KvBlocks *kv, int n_blocks);
// Blocks request id must still get for its table to cover num_tokens positions.
int kvb_blocks_needed(const KvBlocks *kv, int id, int num_tokens);

// A request with no blocks: its leading full blocks already cached (token ids and parents
// compared), at most (num_tokens - 1) / B of them, join its table (ref + 1, out of the LRU).
// Returns the cached tokens (a multiple of B, < num_tokens); 0 when prefix caching is off.
// Counts the query and the hit (a refused admission that looks up again later counts again).
// -1 if id already holds blocks.
int kvb_lookup(KvBlocks *kv, int id, const int *tokens, int num_tokens);
// Grow id's table to cover num_tokens positions. 0, or -1 when the pool cannot give all the
// blocks needed: then nothing changed.
int kvb_allocate(KvBlocks *kv, int id, int num_tokens);
// id's first num_computed tokens (tokens[0 .. num_computed-1]) have K/V: key and cache every
// full block among them not keyed yet (no-op without prefix caching).
void kvb_commit(KvBlocks *kv, int id, const int *tokens, int num_computed);
// Finish or preemption: every block of id released, the last first (so a sequence's tail is
// evicted before its head); hashed ones become cached, the others free. The table is empty after.
void kvb_free_seq(KvBlocks *kv, int id);

const KvTable *kvb_table(const KvBlocks *kv, int id);  // NULL if id never had one
// Where position pos of id's K/V lives: block_table[pos / B] * B + pos % B; -1 if not covered.
long kvb_slot(const KvBlocks *kv, int id, int pos);

typedef struct {
    int total;   // usable blocks: num_blocks - 1
    int free;    // on the free list
    int cached;  // hashed, ref 0
    int in_use;  // ref >= 1
    int hashed;  // keys in the hash table (cached + hashed in use)
} KvBlockCounts;
KvBlockCounts kvb_counts(const KvBlocks *kv);

// Every invariant checked: 0, or -1 with a message naming the first violation.
int kvb_validate(const KvBlocks *kv, char *err, int errlen);

#ifdef __cplusplus
}
#endif
