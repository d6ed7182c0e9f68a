// paged_prefill.h — step05's fused chunked-prefill attention over the paged K/V pool: every
// chunk of a step (varlen, causal, GQA) in ONE launch, reading K and V straight through the block
// tables (paged_prefill.cu; paged_prefill_none.c without nvcc: every launch fails), its tiling
// plan and fp32 CPU reference (paged_prefill_cpu.c, always built).
// defines: PrefillChunk, PP_TILE_M, PP_TILE_N, PP_TILE_INTS, PagedPrefill, paged_prefill_tile_rows,
//          paged_prefill_num_tiles, paged_prefill_plan, paged_prefill_supported, paged_prefill,
//          paged_prefill_simt, paged_prefill_cpu
//
// A chunk is n new query rows of one sequence whose context after the chunk is L keys (its
// earlier context, cached or computed in earlier steps, then the chunk itself): row j of the
// chunk attends to keys 0 .. L - n + j (the causal mask). Keys live in the pool (paged_attention.h):
// position p of the chunk's sequence at row block_tables[seq * bt_stride + p / B] * B + p % B.
//
// The kernel's unit of work is a TILE: up to PP_TILE_M "M rows", each one (query row, query
// head) pair; the g = H/KV query heads that share a kv head are stacked in the M dimension, so a
// tile holds PP_TILE_M / g consecutive query rows of one chunk times the g heads and every K/V
// tile it reads serves all of them. One CTA per (tile, kv head): grid (tiles, KV). The host
// cuts the chunks into tiles (paged_prefill_plan) and uploads the descriptors; the kernel never
// sees a chunk.
#pragma once
#include <stddef.h>

#include "safetensors.h"  // StDtype

#ifdef __cplusplus
extern "C" {
#endif

#define PP_TILE_M 64    // M rows (query row x head of the GQA group) per CTA
#define PP_TILE_N 64    // keys per K/V tile in shared memory
#define PP_TILE_INTS 4  // one tile descriptor: {first query row, rows, sequence, kmax0}

// One chunk of a step, on the host.
typedef struct {
    int seq;   // its row of the block tables
    int row0;  // its first query (and output) row
    int n;     // its rows (>= 1)
    int L;     // its context length after the chunk (>= n)
} PrefillChunk;

// Query rows per tile for a GQA group of g = H/KV heads: PP_TILE_M / g (0 for a bad shape).
int paged_prefill_tile_rows(int H, int KV);
// Tiles the chunks need (0 for none), or -1 for a bad chunk (n < 1, L < n, seq or row0 < 0).
int paged_prefill_num_tiles(const PrefillChunk *chunks, int nchunks, int H, int KV);
// The tile descriptors, PP_TILE_INTS ints each: {row0 + i0, rows, seq, L - n + i0} for the
// i0-th row of a chunk (kmax0 = the last key the tile's first row sees; its row i sees up to
// kmax0 + i). Ordered by work, the tiles with the most keys first (so the grid's tail is short
// tiles); ties keep the chunk order. Returns the count, or -1 (bad chunk, cap too small).
int paged_prefill_plan(const PrefillChunk *chunks, int nchunks, int H, int KV, int *tiles, int cap);

typedef struct {
    StDtype dt;                  // cache dtype; the output's too unless out_f32
    int H, KV, hd;               // query heads, kv heads, head dim (H % KV == 0)
    float scale;                 // softmax scale (1/sqrt(hd))
    const float *q;              // query rows, fp32, row r at q + r * ldq (head h at + h * hd)
    int ldq;
    const void *kc, *vc;         // the pool (num_blocks * B, KV*hd), dt
    const int *block_tables;     // (sequences, bt_stride), device
    int bt_stride, block_size;   // any block size >= 1
    const int *tiles;            // (ntiles, PP_TILE_INTS), device: paged_prefill_plan's output
    int ntiles;
    void *out;                   // output row r (every head) at out + r * ldo elements
    int ldo, out_f32;            // out_f32: out is fp32, else the cache dtype
} PagedPrefill;

// 1 if paged_prefill takes this shape on this device: H % KV == 0, g = H/KV in 1..8, and
//   bf16/fp16: hd 64 or 128 and a tensor-core device (compute capability >= 8.0) — the MMA path;
//   fp32 (the test checkpoints): hd up to 256 on sm_80+ — the SIMT path.
// The runner keeps the gather path for other shapes, and on sm_75: there a bf16 model runs as
// fp32 (gpu_model_load converts it) and cuBLAS beats this kernel's SIMT fallback. paged_prefill
// itself takes any g in 1..8 and even hd up to 256 on any device (the SIMT kernel where the MMA
// one does not apply).
int paged_prefill_supported(StDtype dt, int H, int KV, int hd);
// One launch over every tile (1), 0 when ntiles is 0, -1 for bad arguments or a launch error.
// bf16/fp16, hd 64 or 128, on sm_80+ with kc and vc 16-byte aligned: the tensor-core kernel;
// otherwise the SIMT kernel.
int paged_prefill(const PagedPrefill *a);
// The SIMT kernel whatever the dtype and device (the reference point of the ladder). 1, 0 or -1.
int paged_prefill_simt(const PagedPrefill *a);

// fp32 CPU reference (sums in double): out rows row0 .. row0+n-1 of each chunk, every head,
// as paged_decode_cpu over row j's L - n + j + 1 keys.
void paged_prefill_cpu(const float *q, int ldq, const float *kc, const float *vc, const int *block_tables,
                       int bt_stride, int block_size, const PrefillChunk *chunks, int nchunks, int H, int KV, int hd,
                       float scale, float *out, int ldo);

#ifdef __cplusplus
}
#endif
