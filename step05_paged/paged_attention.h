// paged_attention.h — step05's CUDA kernels over a paged K/V pool, callable from C, on device
// pointers (paged_attention.cu; paged_attention_none.c when built without nvcc: every call fails),
// and their fp32 CPU references (paged_attention_cpu.c, always built).
// defines: PA_PART, PA_THREADS, PA_V1_CTAS_PER_SM, PA_SIMT_MAX_G, PagedDecode, paged_kv_write, paged_decode_supported,
//          paged_decode_v1, paged_decode_v2, paged_decode_simt_max_g, paged_decode_choose, paged_decode, paged_decode_order, paged_gather,
//          pa_dev_alloc, pa_dev_free, pa_upload, pa_download, pa_upload_as, pa_download_f32,
//          pa_sync, pa_num_sms, paged_kv_write_cpu, paged_decode_cpu, paged_gather_cpu
//
// The pool: per layer K and V of (num_blocks * B, KV * hd) rows in the cache dtype (bf16, fp16,
// or fp32 for tests). Position p of sequence s lives at row
//     block_tables[s * bt_stride + p / B] * B + p % B
// (kv_blocks.h). Block 0 is the null block; the kernels trust the tables (the runner checks
// every entry a context covers before a step: runner_gpu.cu).
//
// The kernels:
//   paged_kv_write    the K/V write through the slot mapping ("reshape and cache"): row t of the
//                     new K and V (fp32, as the QKV GEMM leaves them) goes to pool row slots[t];
//                     slot -1 (padding) is skipped. The runner does this inside its fused
//                     q/k-norm + RoPE kernel (step04's k_qkv_rows writes through slot_mapping
//                     already); this standalone kernel is the lesson's version and is tested alone.
//   paged_decode_v1   one CTA per (work item, kv head) serves the GQA group's g = H/KV query
//                     heads over the item's whole context: each K/V row read once with 16-byte
//                     loads (hd/8 lanes per bf16 row) through the block table; each of the 4 warps
//                     takes its own rows with its own online softmax in registers (no barrier in
//                     the loop); the warps are merged at the end and the output written directly.
//                     The loop's arithmetic: tensor cores (mma.sync, the GQA group as the M rows)
//                     for bf16/fp16 caches with hd 64/128/256 on sm_80+ and groups of more than
//                     PA_SIMT_MAX_G heads, else fp32 FMAs (SIMT).
//   paged_decode_v2   split-K: the context in partitions of PA_PART keys, one CTA per (item, kv
//                     head, partition) writes an unnormalized partial (o, max m, sum l); a reduce
//                     kernel rescales the partials by exp(m_i - M) and divides by the sum.
//   paged_decode      the rule between them (paged_decode_choose).
//   paged_gather      chunked prefill's way in: a sequence's first L context rows copied
//                     through its block table into a contiguous scratch, then step02's
//                     GEMM-softmax-GEMM (attention_gpu) runs over the scratch as over a step04
//                     slot. A gather, not a fused paged prefill kernel: one extra write + read
//                     of the context per layer, paid only by long chunks.
// A work item is one query row over `len` keys of one sequence: a decode row (len = context),
// or row j of a short n-row chunk (len = L - n + j + 1, the causal mask), so the decode kernels
// serve short chunks too. len 0 (a padding row) gives zeros.
#pragma once
#include <stddef.h>

#include "safetensors.h"  // StDtype

#ifdef __cplusplus
extern "C" {
#endif

#define PA_THREADS 128  // threads per decode CTA
#define PA_PART 1024    // keys per v2 partition

typedef struct {
    StDtype dt;                  // cache dtype; the output's too unless out_f32
    int H, KV, hd;               // query heads, kv heads, head dim (H % KV == 0)
    float scale;                 // softmax scale (1/sqrt(hd))
    const float *q;              // query rows, fp32, row r at q + r * ldq (head h at + h * hd)
    int ldq;
    const void *kc, *vc;         // the pool (num_blocks * B, KV*hd)
    const int *block_tables;     // (sequences, bt_stride)
    int bt_stride, block_size;
    const int *rows, *seqs, *lens;  // (n) work item w: query row, sequence (table row), keys
    int n;                       // work items
    int max_len;                 // the longest lens[w] (host-side: sizes the v2 grid)
    void *out;                   // output row rows[w] at out + rows[w] * ldo elements
    int ldo, out_f32;            // out_f32: out is fp32, else the cache dtype
    float *part_o, *part_ml;     // v2 scratch: part_cap floats, part_cap / hd * 2 floats
    size_t part_cap;
    int part;                    // v2 keys per partition (0: PA_PART)
    int variant;                 // the loop: 0 the default (the tensor-core loop where paged_decode_mma_ok,
                                 // else v1: the first loop, v2: variant 1); SIMT loops (16 lanes per row
                                 // only): 1 at most 128 registers (4 CTAs per SM), 2 eight rows per lane per
                                 // iteration, 3 the first loop; tensor-core loops (else the SIMT default):
                                 // 4 one 16-key tile per warp iteration, 5 two, 6 at most 128 registers,
                                 // 7 P rounded in two parts (paged_attn_bench's rungs), 8 and 9 the
                                 // loop 4 with 8 and 16 warps a CTA (4 where their partial outputs
                                 // would need over 48 KB of shared memory); PAGED_DECODE_LOOP (read
                                 // once) stands in for 0
    void *stream;                // cudaStream_t the kernels go on (NULL: the default stream)
    int pdl;                     // sm_90: launched with programmatic dependent launch (common/pdl.cuh): the
                                 // kernels may start while the previous kernel of the stream finishes, and
                                 // wait for it before reading q or the cache
} PagedDecode;

// 0 on success (kernels queued on the default stream), -1 on bad arguments / a launch error.
int paged_kv_write(StDtype dt, const float *k, const float *v, int ld, const int *slots, int T, int kd, void *kc,
                   void *vc);
// 1 if the decode kernels take this shape: H % KV == 0, g = H/KV <= 8, hd a multiple of the
// 16-byte vector (8 bf16/fp16, 4 fp32) and at most 32 vectors. The runner falls back to the
// gather path for other shapes.
int paged_decode_supported(StDtype dt, int H, int KV, int hd);
// 1 if the tensor-core decode loop (variants 0, 4, 5) runs for this cache dtype and head dim on
// this device: bf16/fp16, hd 64, 128 or 256, sm_80+ (and code built for it).
int paged_decode_mma_ok(StDtype dt, int hd);
// Launches queued (>= 1), or -1 (unsupported shape, v2 scratch too small for one item, launch
// error). v2 runs its items in groups that fit part_cap.
int paged_decode_v1(const PagedDecode *a);
int paged_decode_v2(const PagedDecode *a);
// The rule: v1 when the longest item fits one partition (nothing to split), or when the items
// alone give the SMs at least PA_V1_CTAS_PER_SM CTAs each (n * KV >= that * num_sms: the chip is
// busy without splitting, and v2's partial writes and extra launch buy nothing); else v2. On an
// H100 the tensor-core v1 beat v2 by 7-13 points of the copy bandwidth from 256 to 1,024 CTAs (GQA
// groups of 2 and 4) and v2 led from 192 down, hence 1.5 (it was 8; nano on Qwen3-0.6B: decode
// 1.0% shorter; step05_paged/README.md). PAGED_DECODE_V1_CTAS (a number, read once) moves it.
// The default loop (variant 0) is the tensor-core one wherever paged_decode_mma_ok, for every GQA
// group size: PA_SIMT_MAX_G, the largest group g = H / KV that takes the SIMT loop instead, is 0.
// The SIMT loop at g = 2 was faster in the kernel bench and 1.8% slower on nano in the engine;
// PAGED_DECODE_SIMT_G (read once) sets that largest group for a run.
#define PA_V1_CTAS_PER_SM 1.5
#define PA_SIMT_MAX_G 0
int paged_decode_simt_max_g(void);                                // PA_SIMT_MAX_G or PAGED_DECODE_SIMT_G
int paged_decode_choose(int n, int KV, int max_len, int num_sms);  // 1 or 2
int paged_decode(const PagedDecode *a, int num_sms);               // as the rule says
// Rows 0 .. L-1 of sequence `seq`'s context into dk, dv (L, KV*hd) contiguous; table on the
// device. 0 or -1.
int paged_gather(StDtype dt, const void *kc, const void *vc, const int *block_tables, int bt_stride, int block_size,
                 int seq, int L, int kd, void *dk, void *dv);

// The work items (rows, seqs, lens: n of each, host arrays) reordered in place, longest context
// first (ties: smaller row first), so that the decode kernels, whose CTAs start in grid order,
// do not start a long context last while the other SMs run out of work. A row's result does
// not depend on the order. tmp: 3 n ints of scratch. Returns 1 if it moved anything, else 0.
// (paged_attention_cpu.c: host code, built with or without CUDA.)
int paged_decode_order(int *rows, int *seqs, int *lens, int n, int *tmp);

// ---- small device helpers for C callers (tests, the benchmark)
void *pa_dev_alloc(size_t bytes);  // NULL on failure (message on stderr)
void pa_dev_free(void *p);
int pa_upload(void *dst, const void *src, size_t bytes);
int pa_download(void *dst, const void *src, size_t bytes);
int pa_upload_as(StDtype dt, void *dst, const float *src, size_t n);     // fp32 host -> dt device (rounded)
int pa_download_f32(StDtype dt, float *dst, const void *src, size_t n);  // dt device -> fp32 host
int pa_sync(void);      // synchronize; 0, or -1 with the pending CUDA error on stderr
int pa_num_sms(void);   // SMs of device 0, 0 without one

// ---- fp32 CPU references (paged_attention_cpu.c; sums in double)
void paged_kv_write_cpu(const float *k, const float *v, int ld, const int *slots, int T, int kd, float *kc, float *vc);
// out row rows[w] (ld ldo) = softmax(q_h . K^T * scale) V over the item's lens[w] keys read
// through its table, for every head h (GQA: head h reads kv head h / (H/KV)); len 0: zeros.
void paged_decode_cpu(const float *q, int ldq, const float *kc, const float *vc, const int *block_tables,
                      int bt_stride, int block_size, const int *rows, const int *seqs, const int *lens, int n, int H,
                      int KV, int hd, float scale, float *out, int ldo);
void paged_gather_cpu(const float *kc, const float *vc, const int *block_tables, int bt_stride, int block_size, int seq,
                      int L, int kd, float *dk, float *dv);

#ifdef __cplusplus
}
#endif
