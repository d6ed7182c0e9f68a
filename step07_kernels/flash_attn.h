// flash_attn.h — step07's flash attention for prefill (FlashAttention-2's algorithm) as a ladder of
// numbered versions: causal, GQA, variable lengths in one launch (cu_seqlens), and the chunked-
// prefill case whose earlier context is read through a block table (step05's paged pool) before
// the chunk's own keys. Kernels in flash_attn.cu (flash_attn_none.c without nvcc: no version, every
// launch fails); the tile plan and the fp32 CPU reference in flash_attn_cpu.c (always built).
// defines: FlashAttn, FlashVersion, FA_TILE_M_MAX, flash_plan, flash_num_versions, flash_version,
//          flash_find_version, flash_attn_run, flash_attn, FlashHost, flash_attn_row_cpu, flash_attn_cpu,
//          flash_visible_pairs
//
// Sequence s of a launch owns rows cu_seqlens[s] .. cu_seqlens[s+1]-1 of q, k, v and out (its n_s
// new tokens) and has ctx_s earlier tokens whose K/V already sit in the pool (0 without a context).
// Its keys are numbered 0 .. ctx_s + n_s - 1: key p < ctx_s is pool row
// block_tables[s * bt_stride + p / B] * B + p % B, key p >= ctx_s is row cu_seqlens[s] + p - ctx_s
// of k and v. Causal: new token j (0-based in the chunk) sees keys 0 .. ctx_s + j; not causal: all.
// Two options for an engine, whose flat batch interleaves these sequences with others (decodes)
// and which writes a chunk's K/V into the pool before its attention runs:
//   - q_rows (nseq, device): sequence s's rows start at row q_rows[s] of q and out (and k, v)
//     instead of cu_seqlens[s]; cu_seqlens then only gives the lengths (n_s = cu[s+1] - cu[s]),
//     so a sequence with n_s = 0 (one the engine runs elsewhere) has no tiles and costs nothing;
//   - k = v = NULL (with a pool): every key, the chunk's own too, is read from the pool through
//     the table (key p of sequence s at table position p, p < ctx_s + n_s).
//
// The unit of work is a TILE of M rows, each a (query row, query head) pair: the g = H / KV heads
// that share a kv head are stacked in M (row m = query row m / g, head m % g of the group), so every
// K/V tile read from memory serves the whole group (as step05's paged prefill). One CTA per
// (tile, kv head), a flat grid of ntiles * KV (CTA b: tile b / KV, kv head b % KV). flash_plan
// cuts each sequence into ceil(n_s / (tile_m / g)) tiles and writes the running count cu_tiles
// (nseq + 1); on the device each CTA finds its sequence by a binary search in cu_tiles and takes
// the tiles of a sequence from the last (the most keys) to the first, so the long tiles start
// first and the grid's tail is short ones.
#pragma once
#include <stddef.h>

#include "safetensors.h"  // StDtype

#ifdef __cplusplus
extern "C" {
#endif

#define FA_TILE_M_MAX 128  // the largest tile of any version (M rows)

typedef struct {
    StDtype dt;               // q, k, v, the pool and out: bf16 / fp16 (tensor cores) or fp32 (SIMT)
    int H, KV, hd;            // query heads, kv heads (H % KV == 0, H / KV <= 8), head dim
    float scale;              // softmax scale, usually 1 / sqrt(hd)
    int causal;               // 1: new token j sees keys 0 .. ctx + j; 0: every key of its sequence
    int nseq;                 // sequences in the launch
    const int *cu_seqlens;    // (nseq + 1) device: row offsets of the sequences' new tokens
    const int *ctx_lens;      // (nseq) device: keys already in the pool per sequence; NULL: none
    const void *q;            // (T, ldq) device, head h of row r at q + r * ldq + h * hd
    int ldq;
    const void *k, *v;        // (T, ldk) device: the new tokens' keys / values, kv head at + kvh * hd;
    int ldk;                  //   both NULL: the new tokens' keys are in the pool too (above)
    const void *kc, *vc;      // the pool (rows, KV * hd) device, step05's layout; NULL when ctx_lens is
    const int *block_tables;  // (nseq, bt_stride) device
    int bt_stride, block_size;
    void *out;                // (T, ldo) device, same layout as q
    int ldo;
    const int *cu_tiles;      // (nseq + 1) device: flash_plan's output for this version's tile_m
    int ntiles;               // cu_tiles[nseq]
    const int *q_rows;        // (nseq) device: each sequence's first row of q, out (and k, v); NULL:
                              //   cu_seqlens[s] (above)
    int k_rows;               // rows of k and v (what a TMA copy may read, rows past it read as zeros);
                              //   0: not given (v10, the TMA rung, then refuses the call)
} FlashAttn;

// Host: the tile counts, cu_tiles[0] = 0, cu_tiles[s + 1] = cu_tiles[s] + ceil(n_s / (tile_m / g)).
// Returns the total, or -1 for a bad shape (g = H / KV not in 1 .. tile_m, a negative length).
int flash_plan(int tile_m, int H, int KV, const int *cu_seqlens, int nseq, int *cu_tiles);

// The ladder (flash_attn.cu's table is the only list of versions; empty without CUDA).
typedef struct {
    int id;            // 0 = the SIMT fallback, 1 .. = the tensor-core ladder
    const char *name;  // "v1_step05", ...
    const char *what;  // one line: what this version adds
    int tile_m;        // M rows per CTA: the tile_m to plan with
    int kv_only;       // 1: takes only calls whose keys are all rows of k and v (no pool context, no
                       //   q_rows, k_rows given): its copies read rectangles of k and v (TMA)
} FlashVersion;
int flash_num_versions(void);
const FlashVersion *flash_version(int i);  // i in 0 .. flash_num_versions() - 1
const FlashVersion *flash_find_version(int id);  // NULL if no version has this id

// One launch of version `id` (a->cu_tiles planned with its tile_m). Returns 1 (launched), 0 when
// ntiles is 0, -2 when this version cannot run this call here (fp32, a device below sm_80, a head
// dim other than 64 / 128, unaligned rows, or more shared memory than the device allows; version 0
// takes them all), -1 for bad arguments or a launch error (message on stderr).
int flash_attn_run(const FlashAttn *a, int id);
// What a caller should use: the fastest version measured on the H200 that takes the call (on sm_90
// at hd 128 v10_tma, else v7_pingpong; at hd 64 v6_wgmma; elsewhere v2_128, else v3_swz3 where v2's
// shared memory does not fit, else v1; the SIMT fallback when none does: flash_attn.cu's PREFERRED).
// flash_attn_tile_m says which tile_m to plan a->cu_tiles with for it (a's cu_tiles and ntiles are
// not read).
int flash_attn_tile_m(const FlashAttn *a);
int flash_attn(const FlashAttn *a);
// The version id flash_attn would run for this call here (0: the SIMT fallback, e.g. fp32 or a
// device below sm_80); -1 without a device. An engine asks once whether the tensor-core path takes
// its shape (a's pointers are read for their alignment only).
int flash_attn_pick(const FlashAttn *a);

// ---------------------------------------------------------------- the fp32 CPU reference

// The same call on the host, fp32 everything (sums in double).
typedef struct {
    int H, KV, hd;
    float scale;
    int causal, nseq;
    const int *cu_seqlens, *ctx_lens;  // ctx_lens NULL: no context
    const float *q, *k, *v;            // (T, ldq) / (T, ldk)
    int ldq, ldk;
    const float *kc, *vc;              // pool (rows, KV * hd)
    const int *block_tables;
    int bt_stride, block_size;
} FlashHost;

// out (hd) = attention of new token j of sequence s, query head h.
void flash_attn_row_cpu(const FlashHost *a, int s, int j, int h, float *out);
// Every row and head: out (T, ldo).
void flash_attn_cpu(const FlashHost *a, float *out, int ldo);
// (query row, key) pairs the call computes, summed over sequences (one head): the FLOPs are
// 4 * hd * H * pairs (QK^T and PV, 2 FLOPs a multiply-add each); causal from 0: T (T + 1) / 2.
double flash_visible_pairs(const int *cu_seqlens, const int *ctx_lens, int nseq, int causal);

#ifdef __cplusplus
}
#endif
