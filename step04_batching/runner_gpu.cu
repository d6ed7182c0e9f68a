// runner_gpu.cu — one flat batch per call on CUDA (runner_gpu.h), on step02's GpuModel weights.
//
// A step's n_tokens rows (every new token of every scheduled sequence, concatenated) go through
// each layer together:
//   embed all rows -> per layer: rmsnorm -> qkv GEMM (cuBLAS, all rows at once) ->
//   k_qkv_rows: bias (Qwen2), q/k norm (Qwen3), RoPE at each row's own position, q kept, k and v
//   written into the cache row slot_mapping[t] (-1: padding, skipped) ->
//   attention per sequence over its cached context (below) -> o GEMM + residual ->
//   rmsnorm -> gate|up GEMM -> SwiGLU -> down GEMM + residual;
//   then only the logit rows are gathered, normed and multiplied by lm_head; argmax on the device.
// A step of ONE row (a lone decode) runs step03's GEMV instead of cuBLAS: at M = 1 cuBLAS reads
// the weights at a fraction of the bandwidth, and batch 1 is the baseline batching is measured by.
//
// Attention, two paths chosen per sequence on the host:
//   - few new rows (decodes, short chunks: <= small_chunk rows, default 16): every row is one
//     decode query over its own prefix (row j of an n-row chunk over seq_lens_k - n + j + 1
//     keys), run by step03's split decode attention (decode_gpu.cuh) with one grid for all such
//     rows of the step: grid (kv heads, key splits of 128, rows) then one combine per (head, row);
//   - long chunks (prefill): step02's GEMM-softmax-GEMM over the sequence's cache rows with the
//     causal offset (attention_gpu with nq new rows of nk keys), one sequence after the other,
//     split into query sub-chunks only when the score buffer would not hold the whole chunk.
// step05's paged runner (gpu_runner_new_paged) is this same runner over a pool of num_blocks
// blocks of block_size rows: k_qkv_rows writes through the paged slot_mapping unchanged (a slot
// is a pool row); the decode-path items carry their sequence's block-table row instead of a
// base row and run step05's paged decode v1/v2 (step05_paged/paged_attention.h). Long chunks,
// two ways (gpu_runner_set_prefill_attn):
//   - fused (opt-in, where paged_prefill_supported): ALL long chunks of the step in one
//     paged_prefill launch per layer (step05_paged/paged_prefill.h), K/V read through the block
//     tables, tiles planned on the host once per step and uploaded with the other arrays;
//   - gather (the default): each long chunk's context is first gathered through its table into a contiguous
//     scratch, then the same GEMM path runs over it (bit-identical to the slot runner's), one
//     sequence after the other: 1 + 2g + 1 launches per sequence and layer.
// Short chunks stay on the decode path in both (the rule is at plan_add).
// step07's flash attention (the default in both layouts where one of its tensor-core versions
// takes the model's shape, PREFILL_FLASH): all long chunks of the step in one flash_attn launch
// per layer, every key read from the cache (slots: a one-block table per sequence, the block
// being its slot; paged: the block tables), each chunk's rows where the flat batch has them.
// The MLP's SwiGLU is step07's vectorized v1 (fused.h) on every path but the lone decode.
// KV memory: per layer K and V of (n_slots * max_len, KV*hd) in the weight dtype; the host
// decides everything (paths, lengths, splits) from the Batch, which is on the host, and copies
// the integer arrays the kernels read to the device once per step (one packed memcpy).
// Everything is queued on the default stream, as step02's forward (graph steps and the lone decode
// row: on the runner's own stream); one synchronization at the end, where the argmax (or the
// logits) come back.
//
// The lone decode row (batch 1; gpu_runner_set_lone_decode) runs step07's batch-1 chain
// (step07_kernels/decode_fused.cuh) instead of ~9 kernels a layer: the RMSNorm inside the qkv
// GEMV, the RoPE/cache write, paged attention, the o GEMV, the RMSNorm and SwiGLU inside the
// gate|up GEMV, the down GEMV: 6 kernels a layer; the final norm inside the lm_head and the argmax
// across many blocks (inside the lm_head where its row loop runs). On sm_90 every kernel of the
// chain is launched with programmatic dependent launch (common/pdl.cuh): it may start while the
// previous one drains, issue its first weight loads, and wait for that kernel's results before
// it reads them.
//
// Sampling on the device (gpu_runner_forward_sampled): k_pick_rows draws every logit row's token
// by Gumbel-max (gumbel.h) from the logits where the lm_head GEMM left them, several blocks a row; only the tokens come
// back (at batch 256 and a 152k vocabulary the logits would be 155 MB per step to the host).
//
// CUDA graphs (gpu_runner_set_graphs, on by default): a decode step (paged KV, every sequence
// exactly one new row, no logits to the host) is launched as one graph instead of ~12 launches
// per layer. The step is padded to the next batch-size bucket B (1, 2, 4, 8, then multiples of 8):
// the padding rows have token 0, position 0, slot_mapping -1 (their K/V is not written) and zero
// keys (their attention output is zero), and their tokens are dropped. Every pointer a kernel
// reads is then a fixed offset of the upload buffer for that B, so one graph per (B, decode
// kernel v1/v2, argmax or sampler last) replays every such step: the host only uploads the arrays
// and launches the graph.
// A bucket's first step runs eagerly (it loads modules and grows scratch buffers, which a capture
// may not do), its second is captured on the runner's stream and replayed from then on. v2's
// grid is sized for max_model_len in a graph (its partitions past a row's keys return at once).
// gpu_runner_capture_graphs does both for every bucket up front (LLM_GRAPHS_UPFRONT=0: it does
// nothing), on dummy steps (their keys read from and their K/V rows written into block 1, before
// any request holds it), so a run's steps only replay: vLLM captures its graphs at startup too,
// and a capture (host work while the GPU waits) would otherwise land inside the first step of
// each batch size.
// Inside a graph step the kernels of this file and step07's SwiGLU are launched with
// programmatic dependent launch (LLM_BATCH_PDL=0: not): each may be scheduled while the kernel
// before it (a cuBLAS GEMM or one of ours) drains, and waits for it before reading its output.
// The decode work items go to the attention kernel longest first (LLM_ATTN_LPT=0: in batch
// order): its CTAs start in grid order, so a long context started last would run alone at the
// end of the kernel while the other SMs idle. The order changes which CTA does what, not a row's
// result.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_check.h"
#include "gpu.h"
#include "step02_attention/forward_gpu.cuh"
#include "step03_kvcache/decode_gpu.cuh"
#include "step04_batching/gumbel.h"
#include "step04_batching/runner_gpu.h"
#include "step05_paged/paged_attention.h"
#include "step05_paged/paged_prefill.h"
#include "step07_kernels/decode_fused.cuh"  // fused_proj, gemv_rows_launch, k_argmax_fused: the lone decode row
#include "step07_kernels/flash_attn.h"
#include "step07_kernels/fused.h"

#define DEFAULT_SMALL_CHUNK 16
#define SCORE_BUDGET ((size_t)3 << 29)  // bytes for the long path's scores + probabilities (1.5 GiB)
#define PART_BUDGET ((size_t)64 << 20)  // floats for the decode path's partial outputs (256 MiB)
#define LOGIT_BUDGET ((size_t)1 << 29)  // bytes of logits computed per lm_head GEMM (512 MiB)
#define GRAPH_MAX_BUCKETS 68            // 1, 2, 4, 8, 16, .., 512
#define GRAPH_MAX_ROWS 512

// ---------------------------------------------------------------- kernels

// cos, sin (T, hd/2) of each row's position: angle = fp32(pos * inv_freq), as the CPU reference
// (rope_table_cpu) and step03's decode; cos and sin in double. Once per step, used by every layer.
__global__ void k_rope_rows(const int *pos, const float *inv_freq, int T, int half, float *cos_t, float *sin_t) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)T * half; i += (size_t)gridDim.x * blockDim.x) {
        const float ang = (float)pos[i / half] * inv_freq[i % half];
        cos_t[i] = (float)cos((double)ang);
        sin_t[i] = (float)sin((double)ang);
    }
}

// One warp per head of a row of qkv (T, (H + 2KV) * hd) fp32; grid (T, ceil((H+2KV)/4)), block (32, 4).
// + bias (or NULL), then q heads: (q_norm) + RoPE, back in place (fp32, for the decode path) and
// to q16 (T, H*hd) in the GEMM dtype (for the GEMM path); k heads: (k_norm) + RoPE into the
// cache row slot[t]; v heads: copied to the cache row. slot[t] < 0: k and v are not written.
template <class A, class C>
__global__ void k_qkv_rows(float *qkv, const float *bias, const float *q_norm, const float *k_norm,
                           const float *cos_t, const float *sin_t, const int *slot, int H, int KV, int hd, float eps,
                           A *q16, C *kc, C *vc) {
    pdl_trigger();  // (no-ops unless launched with PDL: the lone decode row's chain, GpuRunner.pdl)
    pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y, lane = threadIdx.x, half = hd / 2;
    if (h >= H + 2 * KV) return;
    const size_t kd = (size_t)KV * hd;
    float *x = qkv + (size_t)t * (H + 2 * KV) * hd + (size_t)h * hd;
    if (bias) {
        for (int e = lane; e < hd; e += 32) x[e] += bias[(size_t)h * hd + e];
        __syncwarp();
    }
    const int is_q = h < H, is_k = !is_q && h < H + KV;
    const float *nw = is_q ? q_norm : is_k ? k_norm : NULL;
    const float inv = nw ? head_rms_inv(x, hd, eps) : 1.0f;
    const int s = slot[t];
    if (is_q || is_k) {
        if (is_k && s < 0) return;
        C *dst = is_k ? kc + (size_t)s * kd + (size_t)(h - H) * hd : NULL;
        A *qd = q16 + (size_t)t * H * hd + (size_t)h * hd;
        const float *ct = cos_t + (size_t)t * half, *st = sin_t + (size_t)t * half;
        __syncwarp();  // every lane has read x for the norm before any lane rewrites it
        for (int i = lane; i < half; i += 32) {
            float x1 = x[i] * inv, x2 = x[i + half] * inv;
            if (nw) x1 *= nw[i], x2 *= nw[i + half];
            const float y1 = x1 * ct[i] - x2 * st[i], y2 = x2 * ct[i] + x1 * st[i];
            if (is_q) {
                x[i] = y1, x[i + half] = y2;
                qd[i] = fromf<A>(y1), qd[i + half] = fromf<A>(y2);
            } else {
                dst[i] = fromf<C>(y1), dst[i + half] = fromf<C>(y2);
            }
        }
    } else if (s >= 0) {
        C *dst = vc + (size_t)s * kd + (size_t)(h - H - KV) * hd;
        for (int e = lane; e < hd; e += 32) dst[e] = fromf<C>(x[e]);
    }
}

// The split decode attention for many rows at once: work item w = blockIdx.z is query row
// rows[w] of q (ld ldq floats) over keys 0 .. lens[w]-1 at cache rows bases[w] ...; its partial
// results at part_o + w * H * nsplit * hd (step03's (H, nsplit, hd) layout per item).
template <class C>
__global__ void __launch_bounds__(ATTN_CHUNK)
    k_attn_split_rows(const float *q, int ldq, const C *kc, const C *vc, const int *rows, const int *lens,
                      const int *bases, int H, int KV, int hd, float scale, float *part_o, float *part_ml) {
    const int w = blockIdx.z, nsplit = gridDim.y;
    const size_t kd = (size_t)KV * hd, per = (size_t)H * nsplit;
    attn_split_block<C>(q + (size_t)rows[w] * ldq, kc + (size_t)bases[w] * kd, vc + (size_t)bases[w] * kd, lens[w], H,
                        KV, hd, scale, part_o + w * per * hd, part_ml + w * per * 2, blockIdx.x, blockIdx.y, nsplit);
}
// The same work (one block = one work item's kv head over ATTN_CHUNK keys, the same partial
// layout), with every K and V row read by LPR lanes together: lane c of a row holds the 16-byte
// vector c (N elements) of it, so a warp's load instruction covers 32 / LPR whole rows (512
// contiguous bytes). attn_split_block gives each thread a whole K row (one 16-byte piece of 32
// rows 2 KB apart per warp load): at batch 1 the weights hide that, at batch 64 the K/V reads
// of every sequence are a third of the step. q (scaled) sits in registers; a score is the
// LPR-lane shuffle sum of the partial dots; P V accumulates each lane's N elements for the g
// heads in registers, then across the lanes of a warp (shuffles) and the warps (shared).
// Needs hd = LPR * N with LPR a power of two <= 32. Dynamic shared: (g*CHUNK + 4*g*hd) floats.
template <class C, int LPR, int G>
__global__ void __launch_bounds__(ATTN_CHUNK)
    k_attn_rows_vec(const float *q, int ldq, const C *kc, const C *vc, const int *rows, const int *lens,
                    const int *bases, int H, int KV, int hd, float scale, float *part_o, float *part_ml) {
    extern __shared__ float sm[];
    const int w = blockIdx.z, kvh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    const int len = lens[w], j0 = split * ATTN_CHUNK;
    if (j0 >= len) return;
    const int g = H / KV;
    const size_t kd = (size_t)KV * hd, row0 = (size_t)bases[w] + j0;
    attn_vec_core<C, LPR, G>(q + (size_t)rows[w] * ldq + (size_t)kvh * g * hd, kc + row0 * kd + (size_t)kvh * hd,
                             vc + row0 * kd + (size_t)kvh * hd, kd, min(ATTN_CHUNK, len - j0), g, hd, scale, sm,
                             sm + g * ATTN_CHUNK, part_o + (size_t)w * H * nsplit * hd,
                             part_ml + (size_t)w * H * nsplit * 2, kvh, split, nsplit);
}

// Launch k_attn_rows_vec for hd = LPR * N and G >= g; 0 when this hd has no such LPR (the caller
// falls back to attn_split_block).
template <class C, int G>
static int attn_rows_vec_g(dim3 grid, size_t smem, const float *q, int ldq, const C *kc, const C *vc, const int *rows,
                           const int *lens, const int *bases, int H, int KV, int hd, float scale, float *po, float *pm) {
    constexpr int N = Vec16<C>::N;
    if (hd % N) return 0;
#define VEC_CASE(L)                                                                                                   \
    case L:                                                                                                           \
        k_attn_rows_vec<C, L, G><<<grid, ATTN_CHUNK, smem>>>(q, ldq, kc, vc, rows, lens, bases, H, KV, hd, scale, po, pm); \
        return 1;
    switch (hd / N) {
        VEC_CASE(2) VEC_CASE(4) VEC_CASE(8) VEC_CASE(16) VEC_CASE(32)
    default: return 0;
    }
#undef VEC_CASE
}
template <class C>
static int attn_rows_vec(dim3 grid, size_t smem, const float *q, int ldq, const C *kc, const C *vc, const int *rows,
                         const int *lens, const int *bases, int H, int KV, int hd, float scale, float *po, float *pm) {
    const int g = H / KV;
    if (g <= 1) return attn_rows_vec_g<C, 1>(grid, smem, q, ldq, kc, vc, rows, lens, bases, H, KV, hd, scale, po, pm);
    if (g <= 2) return attn_rows_vec_g<C, 2>(grid, smem, q, ldq, kc, vc, rows, lens, bases, H, KV, hd, scale, po, pm);
    if (g <= 4) return attn_rows_vec_g<C, 4>(grid, smem, q, ldq, kc, vc, rows, lens, bases, H, KV, hd, scale, po, pm);
    return attn_rows_vec_g<C, ATTN_MAXG>(grid, smem, q, ldq, kc, vc, rows, lens, bases, H, KV, hd, scale, po, pm);
}

// Grid (H, items): out row rows[w] (ld ldo elements), head blockIdx.x.
template <class O>
__global__ void k_attn_combine_rows(const float *part_o, const float *part_ml, const int *rows, const int *lens,
                                    int nsplit, int H, int hd, O *out, int ldo) {
    const int h = blockIdx.x, w = blockIdx.y;
    const size_t ph = (size_t)w * H + h;
    attn_combine_heads<O>(part_o + ph * nsplit * hd, part_ml + ph * nsplit * 2, nsplit, 1, lens[w], hd,
                          out + (size_t)rows[w] * ldo + (size_t)h * hd);
}

// out (n, d) = x[rows[r]]; grid (n)
__global__ void k_gather_rows(const float *x, const int *rows, int d, float *out) {
    const float *src = x + (size_t)rows[blockIdx.x] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[(size_t)blockIdx.x * d + i] = src[i];
}

// The rows whose input token the previous launch drew on the device (gpu_runner_launch):
// tok[fix[2j]] = prev[fix[2j + 1]]. Before the step's embedding, after its upload.
__global__ void k_fix_tokens(int *tok, const int *fix, int n, const int *prev) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) tok[fix[2 * j]] = prev[fix[2 * j + 1]];
}

template <class A> __global__ void k_round_rows(const float *in, A *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = fromf<A>(in[i]);
}

template <class A> __global__ void k_to_f32_rows(const A *in, float *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = tof(in[i]);
}

// ---------------------------------------------------------------- attention of one layer

// The device-side buffers and shape of the attention (the runner's, or the test entry point's).
struct AttnCtx {
    cublasHandle_t blas;
    StDtype dt;  // q16 / K / V / GEMM-path output dtype
    int H, KV, hd;
    int small_ok;              // the decode kernel supports this shape (H/KV <= 8, hd <= 256)
    int vec_attn;              // use k_attn_rows_vec where hd allows (else step03's attn_split_block)
    float *S;                  // long path scores, s_cap elements
    void *P;                   // probabilities (== S for fp32)
    size_t s_cap;
    float *part_o, *part_ml;   // decode path partials, part_cap floats (part_ml: part_cap / hd * 2)
    size_t part_cap;
    // step05's paged KV (block_size > 0): the cache is a pool of blocks; a work item's or long
    // item's `base` is then its sequence's row of the block tables d_bt (bt_stride entries), and
    // a long chunk's context is gathered into gk, gv (max_len rows) before the GEMM path.
    int block_size, bt_stride, num_sms;
    const int *d_bt;
    void *gk, *gv;
    const int *d_tiles;  // the plan's paged_prefill tiles on the device (plan.ntiles > 0: fused long path)
    FlashAttn fa;        // PREFILL_FLASH: the step's flash_attn call (q, kc, vc, out set per layer); fa.ntiles > 0: run
    int flash_id, flash_tile_m;  // the flash version picked for this model at creation, and its tile_m
    int decode_v2;       // paged: always paged_decode_v2 (batch-invariant mode), not paged_decode's rule
    int b1_part;         // paged, the lone decode row: > 0 paged_decode_v2 with partitions of this many keys
};

struct LongItem {
    int row0, n, L, base;
};

// What the host decided for this step's attention (the same for every layer).
struct AttnPlan {
    int ns, nsplit;  // decode-path work items and key splits (the step's longest such row)
    int maxlen;      // the longest decode-path item (keys)
    int *srow, *slen, *sbase;  // host (cap) arrays: row, keys, first cache row of each item
    LongItem *lg;
    int nlg;
    int *pad0, *padn, npad;  // rows with no keys when the decode kernel cannot take them: zeroed
    PrefillChunk *pc;        // paged, fused: the long chunks as paged_prefill's chunks (host, cap)
    int *long_seq;           // the batch sequence of each long item (host, cap)
    int ntiles;              // > 0: the long chunks run as paged_prefill over this many tiles
};

// Sequence i: rows cu[i] .. cu[i+1]-1, L = lens[i] keys at cache rows base(i) ...
// The rule between the paths: a sequence with at most small_max new rows (decodes, short chunks)
// gives one decode work item per row; longer chunks are long items. small_max is small_rows():
// 16 by default on the gather path (a short chunk's rows re-read a context the step's decode
// rows stream anyway, and v2 splits a long context across SMs where a lone short gather runs
// few CTAs), 1 with the fused prefill kernel (every prompt row through one kernel).
static void plan_add(AttnPlan *p, int small_ok, int small_max, int row0, int n, int L, int base) {
    if (n <= 0) return;
    if (L <= 0) {
        if (small_ok) {
            for (int j = 0; j < n; j++) p->srow[p->ns] = row0 + j, p->slen[p->ns] = 0, p->sbase[p->ns] = 0, p->ns++;
        } else {
            p->pad0[p->npad] = row0, p->padn[p->npad] = n, p->npad++;
        }
    } else if (small_ok && n <= small_max) {
        for (int j = 0; j < n; j++) {
            const int len = L - n + j + 1;
            p->srow[p->ns] = row0 + j, p->slen[p->ns] = len, p->sbase[p->ns] = base, p->ns++;
            if (len > p->maxlen) p->maxlen = len;
            const int sp = (len + ATTN_CHUNK - 1) / ATTN_CHUNK;
            if (sp > p->nsplit) p->nsplit = sp;
        }
    } else {
        p->lg[p->nlg++] = LongItem{row0, n, L, base};
    }
}

// One layer's attention: out (T, H*hd) in ctx->dt, or fp32 when out_f32 (decode path only).
// q (fp32, ld ldq) for the decode path, q16 (ld H*hd, ctx->dt) for the GEMM path; kc, vc this
// layer's cache; d_srow, d_slen, d_sbase the plan's decode items on the device. Returns launches.
static int attn_layer(const AttnCtx *c, const AttnPlan *p, const int *d_srow, const int *d_slen, const int *d_sbase,
                      const float *q, int ldq, const void *q16, const void *kc, const void *vc, void *out, int out_f32,
                      cudaStream_t st, int pdl) {
    const int H = c->H, KV = c->KV, hd = c->hd, qd = H * hd, kd = KV * hd;
    const size_t es = esize(c->dt), oes = out_f32 ? 4 : es;
    const float scale = 1.0f / sqrtf((float)hd);
    int launches = 0;
    if (p->ns && c->block_size > 0) {  // step05: paged decode attention, v1 or v2 by paged_decode_choose
        PagedDecode a = {};
        a.dt = c->dt, a.H = H, a.KV = KV, a.hd = hd, a.scale = scale, a.q = q, a.ldq = ldq, a.kc = kc, a.vc = vc;
        a.block_tables = c->d_bt, a.bt_stride = c->bt_stride, a.block_size = c->block_size;
        a.rows = d_srow, a.seqs = d_sbase, a.lens = d_slen, a.n = p->ns, a.max_len = p->maxlen;
        a.out = out, a.ldo = qd, a.out_f32 = out_f32, a.part_o = c->part_o, a.part_ml = c->part_ml, a.part_cap = c->part_cap;
        a.stream = st, a.pdl = pdl;
        if (c->b1_part > 0) a.part = c->b1_part;
        const int nl = c->decode_v2 || c->b1_part > 0 ? paged_decode_v2(&a) : paged_decode(&a, c->num_sms);
        if (nl < 0) die("paged decode attention: launch refused (see above)");
        launches += nl;
    } else if (p->ns) {
        const int nsplit = p->nsplit < 1 ? 1 : p->nsplit;
        const size_t per_item = (size_t)H * nsplit * hd;
        int grp = (int)(c->part_cap / per_item);
        if (grp > 65535) grp = 65535;
        const size_t smem = attn_smem_bytes(H / KV, hd);
        const size_t vsmem = (size_t)(H / KV) * (ATTN_CHUNK + (ATTN_CHUNK / 32) * hd) * sizeof(float);
        const int cthreads = hd <= 64 ? 64 : 128;
        for (int w0 = 0; w0 < p->ns; w0 += grp) {
            const int n = p->ns - w0 < grp ? p->ns - w0 : grp;
            int vec = 0;
            if (c->vec_attn)
                DISPATCH(c->dt, C,
                         vec = attn_rows_vec<C>(dim3(KV, nsplit, n), vsmem, q, ldq, (const C *)kc, (const C *)vc,
                                                d_srow + w0, d_slen + w0, d_sbase + w0, H, KV, hd, scale, c->part_o,
                                                c->part_ml));
            if (!vec)
                DISPATCH(c->dt, C,
                         k_attn_split_rows<C><<<dim3(KV, nsplit, n), ATTN_CHUNK, smem>>>(
                             q, ldq, (const C *)kc, (const C *)vc, d_srow + w0, d_slen + w0, d_sbase + w0, H, KV, hd,
                             scale, c->part_o, c->part_ml));
            CUDA_CHECK_LAST();
            if (out_f32) {
                k_attn_combine_rows<float><<<dim3(H, n), cthreads>>>(c->part_o, c->part_ml, d_srow + w0, d_slen + w0,
                                                                     nsplit, H, hd, (float *)out, qd);
            } else {
                DISPATCH(c->dt, O,
                         k_attn_combine_rows<O><<<dim3(H, n), cthreads>>>(c->part_o, c->part_ml, d_srow + w0,
                                                                          d_slen + w0, nsplit, H, hd, (O *)out, qd));
            }
            CUDA_CHECK_LAST();
            launches += 2;
        }
    }
    if (p->nlg && c->fa.ntiles > 0) {  // step07: every long chunk of the step in one flash launch
        FlashAttn a = c->fa;
        a.q = q16, a.kc = kc, a.vc = vc, a.out = out;
        if (out_f32 || flash_attn_run(&a, c->flash_id) != 1) die("flash attention: launch refused (see above)");
        launches++;
    } else if (p->nlg && p->ntiles > 0) {  // step05, fused: every long chunk of the step in one launch
        PagedPrefill a = {};
        a.dt = c->dt, a.H = H, a.KV = KV, a.hd = hd, a.scale = scale, a.q = q, a.ldq = ldq, a.kc = kc, a.vc = vc;
        a.block_tables = c->d_bt, a.bt_stride = c->bt_stride, a.block_size = c->block_size;
        a.tiles = c->d_tiles, a.ntiles = p->ntiles, a.out = out, a.ldo = qd, a.out_f32 = out_f32;
        if (paged_prefill(&a) < 0) die("paged prefill attention: launch refused (see above)");
        launches++;
    }
    for (int i = 0; i < (p->ntiles > 0 || c->fa.ntiles > 0 ? 0 : p->nlg); i++) {
        const LongItem *it = &p->lg[i];
        const void *lk = kc, *lv = vc;
        size_t base = (size_t)it->base;
        if (c->block_size > 0) {  // step05: the context through the block table into a contiguous scratch
            if (paged_gather(c->dt, kc, vc, c->d_bt, c->bt_stride, c->block_size, it->base, it->L, kd, c->gk, c->gv))
                die("paged gather: refused");
            lk = c->gk, lv = c->gv, base = 0, launches++;
        }
        size_t sub = c->s_cap / ((size_t)H * it->L);
        if (sub < 1) sub = 1;
        for (int i0 = 0; i0 < it->n; i0 += (int)sub) {
            const int nq = it->n - i0 < (int)sub ? it->n - i0 : (int)sub;
            const int nk = it->L - it->n + i0 + nq;  // keys the last query of this sub-chunk sees
            const size_t r0 = (size_t)it->row0 + i0, b0 = base * kd * es;
            attention_gpu(c->blas, c->dt, nq, nk, H, KV, hd, (const char *)q16 + r0 * qd * es, qd, (const char *)lk + b0,
                          kd, (const char *)lv + b0, kd, c->S, c->P, (char *)out + r0 * qd * es);
            launches += 2 * (H / KV) + 1;
        }
    }
    for (int i = 0; i < p->npad; i++) {
        CUDA_CHECK(cudaMemsetAsync((char *)out + (size_t)p->pad0[i] * qd * oes, 0, (size_t)p->padn[i] * qd * oes));
        launches++;
    }
    return launches;
}

// ---------------------------------------------------------------- the runner

#define PICK_SPLIT 16  // k_pick_rows: slices a row at most (pick_split)
struct GpuRunner {
    GpuModel *g;
    int n_slots, max_len, max_tok, lcap;  // paged: n_slots 0, max_len = max_model_len
    int block_size, num_blocks, nbt;      // paged (block_size > 0): the pool; nbt = table entries per sequence
    int kv_rows;                          // cache rows per layer: n_slots * max_len, or num_blocks * block_size
    StDtype cdt;  // cache dtype = weight dtype
    void *kc, *vc;  // (n_layers, n_slots * max_len, KV*hd)
    size_t lstride;  // bytes of one layer's K (or V)
    double kv_bytes;
    int small_max, use_gemv;
    // A lone decode row (T = 1; gpu_runner_set_lone_decode): fused1 runs step07's batch-1 chain (the
    // RMSNorms inside the qkv, gate|up and lm_head GEMVs, the SwiGLU inside gate|up, the argmax across
    // many blocks, inside the lm_head where its row loop runs); pdl: those kernels, the RoPE/cache
    // write and the paged attention launched with programmatic dependent launch (sm_90).
    int fused1, pdl;
    int b1_attn;      // the lone row's RoPE + K/V write + paged attention as one kernel (attn_fused2_paged)
    int b1_nsplit;    // its grid's key splits: ceil(max_len / ATTN_CHUNK)
    int *attn_count;  // (KV) its finished splits per kv head
    int b1_part;  // > 0 (LLM_B1_PART): the lone row's paged attention split into partitions of this many keys (v2)
    int bpdl;     // graph steps of several rows: PDL launches (LLM_BATCH_PDL, on by default on sm_90)
    int lpt;      // decode items longest first (LLM_ATTN_LPT, on by default)
    int upfront;  // gpu_runner_capture_graphs captures (LLM_GRAPHS_UPFRONT, on by default; off: buckets as they come)
    int gemm_swiglu;  // a quantized gate|up's SwiGLU in its GEMM where it can (LLM_GEMM_SWIGLU, on by default)
    int gemm_norm;    // a step of 2..16 rows: the RMSNorms folded into the INT4 projections around them
                      // (qlinear_gpu_gemm_norm; LLM_GEMM_NORM=1, off by default until measured on a GPU)
    float *ssn[2];    // (16, d / 16 + 1) each: the partial sums of squares they pass (after down, after o)
    int *sort_tmp;  // (3 T) the sort's scratch
    float *arg_v;
    int *arg_i, *arg_count;  // (1024, 1024, 1): the many-block argmax's partials and finished-block counter
    float *pick_v;           // k_pick_rows' slice bests (lcap x PICK_SPLIT), and each row's finished slices
    int *pick_i, *pick_cnt;  // (lcap x PICK_SPLIT, lcap zeros)
    int batch_inv;  // gpu_runner_set_batch_invariant: GEMMs of BI_ROWS rows, no GEMV, decode always v2
    int prefill_ok, flash_ok;  // paged_prefill / a tensor-core flash version takes this model's shape here
    int prefill;               // the long path: PREFILL_GEMM, PREFILL_PAGED, PREFILL_FLASH
    AttnCtx ac;
    AttnPlan plan;
    float *x, *qkv, *gu, *xg, *logits, *xnf, *attf, *hf;
    void *xn, *q16, *att, *h;
    float *cos_t, *sin_t, *inv_freq;
    int *d_pack, *h_pack, *d_argmax;  // h_pack: 3 x pack_cap (a synchronous forward's, then one per launch slot)
    size_t pack_cap;
    cudaEvent_t ev0, ev1;
    // gpu_runner_launch's two slots: the tokens' pinned host copy, the device-time events, the
    // event after the copy, whether a launch waits to be collected and its token count
    int *h_out[2];
    cudaEvent_t eva[2], evb[2], evd[2];
    int pend[2], pend_nr[2];
    int last_async;  // the last forward was a launch: d_argmax holds its tokens (fix-ups may read them)
    int last_nr;     // ... its real logit rows (the fix-ups' sources)
    double last_ms;
    int launches;
    // CUDA graphs of decode steps: bucket i holds B = gb[i] rows; graph [i][v - 1][s] runs paged
    // decode v and ends in the argmax (s = 0) or the device sampler (s = 1)
    int graphs;              // gpu_runner_set_graphs (1 by default)
    int ngb, gb[GRAPH_MAX_BUCKETS];
    cudaGraphExec_t gexec[GRAPH_MAX_BUCKETS][2][2];
    int gwarm[GRAPH_MAX_BUCKETS][2][2], glaunch[GRAPH_MAX_BUCKETS][2][2];
    long replays, captures;
    int last_nl;             // logit rows of the last forward (padding included)
    cudaStream_t stream;     // graphs are captured and replayed here (eager steps: the default stream)
    void *blas_ws;           // cuBLAS's workspace while it runs on `stream` (a capture must not allocate)
    Batch gpad;              // the padded decode step (host; its block tables are the real step's)
    char desc[480];
};

#define GRAPH_BLAS_WS ((size_t)32 << 20)

// Batch-invariant mode: every GEMM over the rows of a step runs as GEMMs of exactly BI_ROWS rows
// (the last one reads and writes rows past the step's: the row buffers are allocated rounded up
// to BI_ROWS), so cuBLAS picks the same kernel whatever the step holds and a row's result depends
// on that row alone. (cuBLAS chooses its kernel, tile and K split by the shape: the same row
// computed in a 5000-row step and in a 64-row step can differ in the last bit, and a greedy
// token can flip.)
#define BI_ROWS 256

static void *dalloc_r(size_t n, double *count) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, n ? n : 4));
    if (count) *count += (double)n;
    return p;
}

// The decode path's chunk limit in effect: with the fused prefill kernel only one-row chunks (the
// decode rows) take it, so every prompt row is computed by the same kernel however the scheduler
// cuts the prompt into chunks or a prefix-cache hit shortens it: a row of the fused kernel
// depends only on its own query and keys (its K/V tiles are the same 64-key tiles from key 0,
// whatever tile of query rows it sits in), and greedy outputs with and without the prefix cache
// stay identical. The gather path keeps small_max (its short chunks are cheaper as decode items).
// Batch-invariant mode: every row through one kernel whatever its chunk, so a row's attention
// does not depend on how the scheduler cut its prompt: the fused kernel for all rows (decode rows
// too) where it runs, else the decode kernel (v2) for all rows, one work item per row.
static int small_rows(const GpuRunner *r) {
    if (r->batch_inv) return r->prefill != PREFILL_GEMM ? 0 : 1 << 30;
    return r->prefill != PREFILL_GEMM && r->small_max > 1 ? 1 : r->small_max;
}

// The runner's one-line description (gpu_runner_describe): layout, sizes, the attention paths.
static void describe(GpuRunner *r) {
    const StDtype dt = r->cdt;
    const int sm = r->ac.small_ok ? small_rows(r) : 0;
    const char *flash = "one flash attention launch (step07) for all longer chunks";
    if (r->block_size > 0)
        snprintf(r->desc, sizeof r->desc,
                 "cuda %s weights, %s paged KV (%d blocks x %d positions, %.2f GiB, max_model_len %d), cuBLAS GEMMs over "
                 "all rows (step03 GEMV for a 1-row step), attention: paged decode v1/v2 for <= %d new rows per "
                 "sequence, %s beyond",
                 dt_name(dt), dt_name(dt), r->num_blocks, r->block_size, r->kv_bytes / 1073741824.0, r->max_len, sm,
                 r->prefill == PREFILL_FLASH   ? flash
                 : r->prefill == PREFILL_PAGED ? "one fused paged prefill launch for all longer chunks"
                                               : "block-table gather + GEMM-softmax-GEMM per sequence");
    else
        snprintf(r->desc, sizeof r->desc,
                 "cuda %s weights, %s KV (%d slots x %d positions, %.2f GiB), cuBLAS GEMMs over all rows (step03 GEMV "
                 "for a 1-row step), attention: split decode kernel for <= %d new rows per sequence, %s beyond",
                 dt_name(dt), dt_name(dt), r->n_slots, r->max_len, r->kv_bytes / 1073741824.0, sm,
                 r->prefill == PREFILL_FLASH ? flash : "GEMM-softmax-GEMM per sequence");
    if (r->g->quantized) {  // the projections are step06's: say so (the model's description says which format)
        const size_t n = strlen(r->desc);
        snprintf(r->desc + n, sizeof r->desc - n, "; quantized projections: step06 GEMV (1 row) / GEMM (more rows)");
    }
}

// Both layouts: step04's n_slots slots of max_len rows (block_size 0), or step05's pool of
// num_blocks blocks of block_size rows with contexts up to max_len (= max_model_len) positions.
// The workspaces are the same; the paged runner adds the gather scratch of the long path and
// its block tables in the per-step upload.
static GpuRunner *runner_create(const char *who, GpuModel *g, int n_slots, int max_len, int num_blocks, int block_size,
                                int max_tokens_per_step, char *err, int errlen) {
    if (!g) {
        snprintf(err, (size_t)errlen, "%s: no model", who);
        return NULL;
    }
    const ModelConfig *c = &g->cfg;
    const int H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    const int paged = block_size > 0;
    if (!paged && (n_slots < 1 || max_len < 1 || max_tokens_per_step < 1 || (double)n_slots * max_len > INT_MAX)) {
        snprintf(err, (size_t)errlen, "%s: need n_slots >= 1, max_len >= 1, max_tokens_per_step >= 1 and "
                 "n_slots * max_len < 2^31 (got %d, %d, %d)", who, n_slots, max_len, max_tokens_per_step);
        return NULL;
    }
    if (paged && (num_blocks < 2 || max_len < 1 || max_tokens_per_step < 1 || (double)num_blocks * block_size > INT_MAX)) {
        snprintf(err, (size_t)errlen, "%s: need num_blocks >= 2 (block 0 is the null block), block_size >= 1, "
                 "max_model_len >= 1, max_tokens_per_step >= 1 and num_blocks * block_size < 2^31 (got %d, %d, %d, %d)",
                 who, num_blocks, block_size, max_len, max_tokens_per_step);
        return NULL;
    }
    if (H % KV || hd % 2) {
        snprintf(err, (size_t)errlen, "%s: n_heads %% n_kv_heads must be 0 and head_dim even (%d, %d, %d)", who, H, KV, hd);
        return NULL;
    }
    const int kv_rows = paged ? num_blocks * block_size : n_slots * max_len;
    const int nbt = paged ? (max_len + block_size - 1) / block_size : 0;
    const int nseq = paged ? (max_tokens_per_step < num_blocks - 1 ? max_tokens_per_step : num_blocks - 1) : n_slots;
    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        snprintf(err, (size_t)errlen, "%s", gi.reason);
        return NULL;
    }
    const StDtype dt = g->wdt;
    const size_t es = esize(dt), kd = (size_t)KV * hd, qd = (size_t)H * hd, nqkv = qd + 2 * kd;
    const size_t d = c->hidden, ff = c->intermediate, half = hd / 2;
    const size_t T = ((size_t)max_tokens_per_step + BI_ROWS - 1) / BI_ROWS * BI_ROWS;  // rows, rounded for BI_ROWS GEMMs
    const size_t lstride = (size_t)kv_rows * kd * es;
    const size_t kv_total = 2 * lstride * c->n_layers;
    int lcap = max_tokens_per_step < (nseq > 64 ? nseq : 64) ? max_tokens_per_step : (nseq > 64 ? nseq : 64);
    const int lmax = (int)(LOGIT_BUDGET / ((size_t)c->vocab * 4));
    if (lcap > lmax) lcap = lmax < 1 ? 1 : lmax;
    const int small_ok = paged ? paged_decode_supported(dt, H, KV, hd) : (H / KV) <= ATTN_MAXG && hd <= 32 * ATTN_MAXE;
    const int srows = max_tokens_per_step < max_len ? max_tokens_per_step : max_len;
    size_t s_cap = (size_t)H * srows * max_len;
    const size_t s_es = 4 + (dt == ST_F32 ? 0 : es);
    if (s_cap * s_es > SCORE_BUDGET) s_cap = SCORE_BUDGET / s_es;
    if (s_cap < (size_t)H * max_len) s_cap = (size_t)H * max_len;  // at least one query row over every key
    const int nsplit_max = (max_len + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const size_t per_item = (size_t)H * nsplit_max * hd;
    size_t part_cap = per_item * (size_t)(max_tokens_per_step < nseq ? max_tokens_per_step : nseq);
    if (part_cap > PART_BUDGET) part_cap = PART_BUDGET;
    if (part_cap < per_item) part_cap = per_item;
    // + the block tables (at most T sequences) + the prefill tiles (at most one per row)
    // + flash's per-sequence arrays (cu rows, first rows, contexts, slot tables, cu tiles)
    // + the sampling temperatures and keys (3 ints per row, 8-byte aligned)
    const size_t pack_cap = 7 * T + 8 + (size_t)T * nbt + (size_t)PP_TILE_INTS * T + 5 * T + 8 + 3 * T + 2 + 2 * T;
    const size_t gather = paged ? 2 * (size_t)max_len * kd * es : 0;
    const size_t ws = gather + T * d * 4 + T * d * es + T * nqkv * 4 + 2 * T * qd * es + T * 2 * ff * 4 + T * ff * es +
                      (size_t)lcap * d * 4 + (size_t)lcap * c->vocab * 4 + 2 * T * half * 4 + s_cap * s_es +
                      part_cap * 4 + part_cap / hd * 8 + pack_cap * 4;
    CUDA_CHECK(cudaDeviceSynchronize());
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    if ((double)kv_total + ws + ((size_t)256 << 20) > (double)fr) {
        snprintf(err, (size_t)errlen, "%s: the KV cache (%d %s x %d positions = %.2f GiB) and workspaces "
                 "for %d tokens per step (%.2f GiB) do not fit in the %.2f GiB of free device memory", who,
                 paged ? num_blocks : n_slots, paged ? "blocks" : "slots", paged ? block_size : max_len,
                 kv_total / 1073741824.0, max_tokens_per_step, ws / 1073741824.0, fr / 1073741824.0);
        return NULL;
    }
    GpuRunner *r = (GpuRunner *)xcalloc(1, sizeof(GpuRunner));
    r->g = g;
    r->n_slots = paged ? 0 : n_slots, r->max_len = max_len, r->max_tok = max_tokens_per_step, r->lcap = lcap;
    r->block_size = paged ? block_size : 0, r->num_blocks = paged ? num_blocks : 0, r->nbt = nbt, r->kv_rows = kv_rows;
    r->cdt = dt;
    r->lstride = lstride;
    r->small_max = DEFAULT_SMALL_CHUNK;
    r->use_gemv = 1;
    {
        const char *e = getenv("LLM_B1_FUSED"), *e2 = getenv("LLM_PDL");
        const char *e4 = getenv("LLM_B1_ATTN");
        gpu_runner_set_lone_decode(r, e && strcmp(e, "0") == 0     ? 0
                                      : e2 && strcmp(e2, "0") == 0 ? 1
                                      : e4 && strcmp(e4, "0") == 0 ? 2
                                                                   : 3);
        const char *e3 = getenv("LLM_B1_PART");
        r->b1_part = e3 ? atoi(e3) : 0;
        const char *e5 = getenv("LLM_BATCH_PDL"), *e6 = getenv("LLM_ATTN_LPT"), *e7 = getenv("LLM_GRAPHS_UPFRONT");
        r->bpdl = !(e5 && strcmp(e5, "0") == 0) && gi.cc_major >= 9;
        r->lpt = !(e6 && strcmp(e6, "0") == 0);
        r->upfront = !(e7 && strcmp(e7, "0") == 0);
        const char *e8 = getenv("LLM_GEMM_SWIGLU"), *e9 = getenv("LLM_GEMM_NORM");
        r->gemm_swiglu = !(e8 && strcmp(e8, "0") == 0);
        r->gemm_norm = e9 && strcmp(e9, "1") == 0;
    }
    r->prefill_ok = paged && paged_prefill_supported(dt, H, KV, hd);
    size_t f0, f1;
    CUDA_CHECK(cudaMemGetInfo(&f0, &tot));
    r->kc = dalloc_r(kv_total / 2, NULL);
    r->vc = dalloc_r(kv_total / 2, NULL);
    CUDA_CHECK(cudaMemGetInfo(&f1, &tot));
    r->kv_bytes = (double)f0 - (double)f1;
    // poison: every bit pattern 0xffff / 0xffffffff is NaN, so a read of a row no batch wrote shows
    CUDA_CHECK(cudaMemset(r->kc, 0xff, kv_total / 2));
    CUDA_CHECK(cudaMemset(r->vc, 0xff, kv_total / 2));
    r->x = (float *)dalloc_r(T * d * 4, NULL);
    r->xn = dalloc_r(T * d * es, NULL);
    r->qkv = (float *)dalloc_r(T * nqkv * 4, NULL);
    r->q16 = dalloc_r(T * qd * es, NULL);
    r->att = dalloc_r(T * qd * es, NULL);
    r->gu = (float *)dalloc_r(T * 2 * ff * 4, NULL);
    r->h = dalloc_r(T * ff * es, NULL);
    r->xg = (float *)dalloc_r((size_t)lcap * d * 4, NULL);
    r->logits = (float *)dalloc_r((size_t)lcap * c->vocab * 4, NULL);
    r->xnf = (float *)dalloc_r(d * 4, NULL);
    for (int i = 0; i < 2; i++) r->ssn[i] = (float *)dalloc_r((size_t)16 * (d / 16 + 1) * 4, NULL);
    r->attf = (float *)dalloc_r(qd * 4, NULL);
    r->hf = (float *)dalloc_r(ff * 4, NULL);
    r->arg_v = (float *)dalloc_r(1024 * 4, NULL);
    r->arg_i = (int *)dalloc_r(1024 * 4, NULL);
    r->arg_count = (int *)dalloc_r(4, NULL);
    CUDA_CHECK(cudaMemset(r->arg_count, 0, 4));
    r->pick_v = (float *)dalloc_r((size_t)lcap * PICK_SPLIT * 4, NULL);
    r->pick_i = (int *)dalloc_r((size_t)lcap * PICK_SPLIT * 4, NULL);
    r->pick_cnt = (int *)dalloc_r((size_t)lcap * 4, NULL);
    CUDA_CHECK(cudaMemset(r->pick_cnt, 0, (size_t)lcap * 4));
    r->b1_nsplit = (max_len + ATTN_CHUNK - 1) / ATTN_CHUNK;
    r->attn_count = (int *)dalloc_r((size_t)KV * 4, NULL);
    CUDA_CHECK(cudaMemset(r->attn_count, 0, (size_t)KV * 4));
    r->cos_t = (float *)dalloc_r(T * half * 4, NULL);
    r->sin_t = (float *)dalloc_r(T * half * 4, NULL);
    r->inv_freq = (float *)dalloc_r(half * 4, NULL);
    r->d_pack = (int *)dalloc_r(pack_cap * 4, NULL);
    r->d_argmax = (int *)dalloc_r((size_t)T * 4, NULL);
    r->pack_cap = pack_cap;
    CUDA_CHECK(cudaMallocHost(&r->h_pack, 3 * pack_cap * 4));
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaMallocHost(&r->h_out[k], T * 4));
        CUDA_CHECK(cudaEventCreate(&r->eva[k]));
        CUDA_CHECK(cudaEventCreate(&r->evb[k]));
        CUDA_CHECK(cudaEventCreateWithFlags(&r->evd[k], cudaEventDisableTiming));
    }
    float *inv = (float *)xmalloc(half * 4);
    rope_inv_freq(c, inv);
    CUDA_CHECK(cudaMemcpy(r->inv_freq, inv, half * 4, cudaMemcpyHostToDevice));
    free(inv);
    AttnCtx *a = &r->ac;
    a->blas = g->blas, a->dt = dt, a->H = H, a->KV = KV, a->hd = hd, a->small_ok = small_ok, a->vec_attn = 1;
    a->s_cap = s_cap;
    a->S = (float *)dalloc_r(s_cap * 4, NULL);
    a->P = dt == ST_F32 ? (void *)a->S : dalloc_r(s_cap * es, NULL);
    a->part_cap = part_cap;
    a->part_o = (float *)dalloc_r(part_cap * 4, NULL);
    a->part_ml = (float *)dalloc_r(part_cap / hd * 8, NULL);
    a->block_size = r->block_size, a->bt_stride = nbt, a->num_sms = gi.sms;
    a->gk = paged ? dalloc_r(gather / 2, NULL) : NULL;
    a->gv = paged ? dalloc_r(gather / 2, NULL) : NULL;
    AttnPlan *p = &r->plan;
    p->srow = (int *)xmalloc(T * 4), p->slen = (int *)xmalloc(T * 4), p->sbase = (int *)xmalloc(T * 4);
    p->lg = (LongItem *)xmalloc(T * sizeof(LongItem));
    p->pad0 = (int *)xmalloc(T * 4), p->padn = (int *)xmalloc(T * 4);
    p->pc = (PrefillChunk *)xmalloc(T * sizeof(PrefillChunk));
    p->long_seq = (int *)xmalloc(T * 4);
    r->sort_tmp = (int *)xmalloc(3 * T * 4);
    // the flash call's constant part; a tensor-core version must take it (the SIMT fallback would
    // be slower than the GEMM path), asked with the buffers it will read for their alignment
    FlashAttn *fa = &a->fa;
    fa->dt = dt, fa->H = H, fa->KV = KV, fa->hd = hd, fa->scale = 1.0f / sqrtf((float)hd), fa->causal = 1;
    fa->q = r->q16, fa->ldq = (int)qd, fa->k = fa->v = NULL, fa->ldk = (int)kd, fa->kc = r->kc, fa->vc = r->vc;
    fa->bt_stride = paged ? nbt : 1, fa->block_size = paged ? block_size : max_len, fa->out = r->att, fa->ldo = (int)qd;
    a->flash_id = flash_attn_pick(fa);  // once: the same shape, dtype and alignment every step
    r->flash_ok = a->flash_id > 0;
    a->flash_tile_m = r->flash_ok ? flash_find_version(a->flash_id)->tile_m : 0;
    r->prefill = r->flash_ok ? PREFILL_FLASH : r->prefill_ok ? PREFILL_PAGED : PREFILL_GEMM;
    CUDA_CHECK(cudaEventCreate(&r->ev0));
    CUDA_CHECK(cudaEventCreate(&r->ev1));
    // the graph buckets: 1, 2, 4, 8, then every multiple of 8, up to what one step and one lm_head
    // GEMM take (a decode step of B rows is B sequences)
    const int gmax_rows = paged ? (max_tokens_per_step < lcap ? max_tokens_per_step : lcap) : 0;
    for (int b = 1; b <= gmax_rows && b <= GRAPH_MAX_ROWS && r->ngb < GRAPH_MAX_BUCKETS; b = b < 8 ? 2 * b : b + 8)
        r->gb[r->ngb++] = b;
    r->graphs = paged && r->ngb > 0;
    CUDA_CHECK(cudaStreamCreate(&r->stream));
    r->blas_ws = dalloc_r(GRAPH_BLAS_WS, NULL);
    if (paged) batch_alloc(&r->gpad, r->ngb ? r->gb[r->ngb - 1] : 1, r->ngb ? r->gb[r->ngb - 1] : 1);
    CUDA_CHECK(cudaDeviceSynchronize());
    describe(r);
    return r;
}

extern "C" GpuRunner *gpu_runner_new(GpuModel *g, int n_slots, int max_len, int max_tokens_per_step, char *err,
                                     int errlen) {
    return runner_create("gpu_runner_new", g, n_slots, max_len, 0, 0, max_tokens_per_step, err, errlen);
}

extern "C" GpuRunner *gpu_runner_new_paged(GpuModel *g, int num_blocks, int block_size, int max_model_len,
                                           int max_tokens_per_step, char *err, int errlen) {
    if (block_size < 1) {
        snprintf(err, (size_t)errlen, "gpu_runner_new_paged: block_size %d: need >= 1", block_size);
        return NULL;
    }
    return runner_create("gpu_runner_new_paged", g, 0, max_model_len, num_blocks, block_size, max_tokens_per_step, err,
                         errlen);
}

// Every captured decode graph destroyed (their buckets start over: a warm-up step, then a capture).
static void graphs_drop(GpuRunner *r) {
    CUDA_CHECK(cudaStreamSynchronize(r->stream));
    for (int i = 0; i < r->ngb; i++)
        for (int v = 0; v < 2; v++)
            for (int m = 0; m < 2; m++) {
                if (r->gexec[i][v][m]) CUDA_CHECK(cudaGraphExecDestroy(r->gexec[i][v][m]));
                r->gexec[i][v][m] = NULL, r->gwarm[i][v][m] = 0;
            }
}

extern "C" void gpu_runner_free(GpuRunner *r) {
    if (!r) return;
    CUDA_CHECK(cudaDeviceSynchronize());
    void *ps[] = {r->ssn[0], r->ssn[1], r->kc, r->vc, r->x, r->xn, r->qkv, r->q16, r->att, r->gu, r->h, r->xg, r->logits, r->xnf, r->attf,
                  r->hf, r->cos_t, r->sin_t, r->inv_freq, r->d_pack, r->d_argmax, r->ac.S, r->ac.part_o, r->ac.part_ml,
                  r->ac.gk, r->ac.gv, r->arg_v, r->arg_i, r->arg_count, r->attn_count, r->pick_v, r->pick_i, r->pick_cnt};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) CUDA_CHECK(cudaFree(ps[i]));
    if (r->ac.P != r->ac.S) CUDA_CHECK(cudaFree(r->ac.P));
    CUDA_CHECK(cudaFreeHost(r->h_pack));
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaFreeHost(r->h_out[k]));
        CUDA_CHECK(cudaEventDestroy(r->eva[k]));
        CUDA_CHECK(cudaEventDestroy(r->evb[k]));
        CUDA_CHECK(cudaEventDestroy(r->evd[k]));
    }
    CUDA_CHECK(cudaEventDestroy(r->ev0));
    CUDA_CHECK(cudaEventDestroy(r->ev1));
    graphs_drop(r);
    CUDA_CHECK(cudaStreamDestroy(r->stream));
    CUDA_CHECK(cudaFree(r->blas_ws));
    if (r->block_size > 0) r->gpad.block_tables = NULL, batch_free(&r->gpad);  // the tables were borrowed
    free(r->plan.srow), free(r->plan.slen), free(r->plan.sbase), free(r->plan.lg), free(r->plan.pad0),
        free(r->plan.padn), free(r->plan.pc), free(r->plan.long_seq);
    free(r->sort_tmp);
    free(r);
}

extern "C" const char *gpu_runner_describe(const GpuRunner *r) { return r->desc; }
extern "C" double gpu_runner_kv_bytes(const GpuRunner *r) { return r->kv_bytes; }
extern "C" double gpu_runner_last_ms(const GpuRunner *r) { return r->last_ms; }
extern "C" int gpu_runner_launches(const GpuRunner *r) { return r->launches; }
extern "C" void gpu_runner_set_small_chunk(GpuRunner *r, int rows) {
    r->small_max = rows < 0 ? 0 : rows;
    describe(r);
}
extern "C" int gpu_runner_set_prefill_attn(GpuRunner *r, int mode) {
    r->prefill = mode == PREFILL_FLASH && r->flash_ok ? PREFILL_FLASH
                 : mode != PREFILL_GEMM && r->prefill_ok ? PREFILL_PAGED  // flash refused: the next fused kernel
                                                         : PREFILL_GEMM;
    describe(r);
    return r->prefill;
}

static float half_to_f(StDtype dt, const void *p, size_t i) {
    if (dt == ST_F32) return ((const float *)p)[i];
    const unsigned short u = ((const unsigned short *)p)[i];
    if (dt == ST_BF16) {
        const unsigned w = (unsigned)u << 16;
        float f;
        memcpy(&f, &w, 4);
        return f;
    }
    __half_raw raw;
    raw.x = u;
    return __half2float(__half(raw));
}

extern "C" int gpu_runner_read_kv(const GpuRunner *r, int layer, int row, float *k, float *v) {
    const ModelConfig *c = &r->g->cfg;
    if (layer < 0 || layer >= c->n_layers || row < 0 || row >= r->kv_rows) {
        fprintf(stderr, "gpu_runner_read_kv: layer %d / row %d out of range (%d layers, %d rows)\n", layer, row,
                c->n_layers, r->kv_rows);
        return -1;
    }
    const size_t kd = (size_t)c->n_kv_heads * c->head_dim, es = esize(r->cdt);
    const size_t off = (size_t)layer * r->lstride + (size_t)row * kd * es;
    void *tmp = xmalloc(kd * es);
    for (int w = 0; w < 2; w++) {
        CUDA_CHECK(cudaMemcpy(tmp, (const char *)(w ? r->vc : r->kc) + off, kd * es, cudaMemcpyDeviceToHost));
        float *dst = w ? v : k;
        for (size_t i = 0; i < kd; i++) dst[i] = half_to_f(r->cdt, tmp, i);
    }
    free(tmp);
    return 0;
}

// The checks that keep every device access in bounds (batch_check in batch.c checks the rest:
// positions contiguous, slot_mapping equal to its formula). 0, or -1 with a message.
// Paged: the batch's layout must be this pool's (block_size), and every block-table entry a
// sequence's context covers must name a real block (1 .. num_blocks-1), since the kernels read
// through the tables unchecked.
// out[r] = the Gumbel-max draw of logits row r at temperature temp[r] with key keys[r] (gumbel.h),
// or its argmax when temp[r] <= 0 (SAMPLE = false: the argmax of every row; temp, keys unread). The
// same first-maximum rule as sample_gumbel and argmax_f32 (the C references); all NaN: 0. Grid (S,
// rows), PICK_THREADS threads: block s of a row scans its s-th slice of the columns (float4 loads
// where the rows allow), the slices' bests go to pv/pi [row S + s], and the row's last block to
// finish (cnt[row], reset by it) reduces them (argmax_blocks_finish). One block a row read the 128256
// logits of a Llama-3 row through one multiprocessor: 16 rows took 49.6 us on an H100, ~1% of a
// decode step (step06 README "The small kernels of a 16-row step").
#define PICK_THREADS 512
template <bool SAMPLE>
__global__ void __launch_bounds__(PICK_THREADS) k_pick_rows(const float *logits, int vocab, const float *temp,
                                                            const unsigned long long *keys, int *out, float *pv, int *pi,
                                                            int *cnt) {
    pdl_trigger();
    pdl_wait();
    const int row = blockIdx.y, S = gridDim.x;
    const float *l = logits + (size_t)row * vocab;
    const int slice = ((vocab + S - 1) / S + 3) & ~3, c0 = blockIdx.x * slice, c1 = min(vocab, c0 + slice);
    const float t = SAMPLE ? temp[row] : 0.0f;
    const uint64_t key = SAMPLE ? keys[row] : 0;
    float best = -INFINITY;
    int bidx = INT_MAX;
    auto see = [&](float v, int i) {
        const float sc = SAMPLE && t > 0 ? v / t - logf(-logf(gumbel_uniform(key, i))) : v;
        if (sc > best) best = sc, bidx = i;
    };
    if ((vocab & 3) == 0) {  // a thread's columns in increasing order: the first maximum kept
#pragma unroll 4
        for (int i = c0 + 4 * (int)threadIdx.x; i < c1; i += 4 * PICK_THREADS) {
            const float4 v = *(const float4 *)(l + i);
            see(v.x, i), see(v.y, i + 1), see(v.z, i + 2), see(v.w, i + 3);
        }
    } else {
        for (int i = c0 + (int)threadIdx.x; i < c1; i += PICK_THREADS) see(l[i], i);
    }
    // the slice's best to pv/pi [row S + s]; the row's last block to finish picks among them (step07's
    // many-block argmax end, one row of S blocks: out[row], cnt[row] left 0)
    const ArgmaxOut am = {pv + (size_t)row * S, pi + (size_t)row * S, cnt + row, out + row, NULL, NULL};
    argmax_blocks_finish(best, bidx, am);
}
// Slices a row for `rows` rows: about two blocks an SM in all, at most PICK_SPLIT.
static int pick_split(int rows, int sms) {
    const int s = rows > 0 ? 2 * sms / rows : 1;
    return s < 1 ? 1 : s > PICK_SPLIT ? PICK_SPLIT : s;
}
// k_pick_rows over rows <= cap rows (pv, pi: cap * PICK_SPLIT; cnt: cap zeros).
static void pick_rows(bool pdl, cudaStream_t st, bool sample, const float *logits, int rows, int vocab, const float *temp,
                      const unsigned long long *keys, int *out, float *pv, int *pi, int *cnt, int sms) {
    const dim3 grid(pick_split(rows, sms), rows);
    if (sample) pdl_launch(pdl, k_pick_rows<true>, grid, dim3(PICK_THREADS), 0, st, logits, vocab, temp, keys, out, pv, pi, cnt);
    else pdl_launch(pdl, k_pick_rows<false>, grid, dim3(PICK_THREADS), 0, st, logits, vocab, temp, keys, out, pv, pi, cnt);
}

// k_pick_rows on rows x vocab logits from the host (test entry points): the draws (temperature,
// keys non-NULL) or the argmax of each row into tokens. 0, or -1 without a GPU.
static int pick_rows_check(const float *logits, int rows, int vocab, const float *temperature, const uint64_t *keys,
                           int *tokens) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0 || rows < 1 || vocab < 1) return -1;
    const bool sample = temperature && keys;
    float *dl = NULL, *dt = NULL, *pv = NULL;
    unsigned long long *dk = NULL;
    int *dout = NULL, *pi = NULL, *cnt = NULL;
    CUDA_CHECK(cudaMalloc(&dl, (size_t)rows * vocab * 4));
    CUDA_CHECK(cudaMalloc(&dt, (size_t)rows * 4));
    CUDA_CHECK(cudaMalloc(&dk, (size_t)rows * 8));
    CUDA_CHECK(cudaMalloc(&dout, (size_t)rows * 4));
    CUDA_CHECK(cudaMalloc(&pv, (size_t)rows * PICK_SPLIT * 4));
    CUDA_CHECK(cudaMalloc(&pi, (size_t)rows * PICK_SPLIT * 4));
    CUDA_CHECK(cudaMalloc(&cnt, (size_t)rows * 4));
    CUDA_CHECK(cudaMemset(cnt, 0, (size_t)rows * 4));
    CUDA_CHECK(cudaMemcpy(dl, logits, (size_t)rows * vocab * 4, cudaMemcpyHostToDevice));
    if (sample) {
        CUDA_CHECK(cudaMemcpy(dt, temperature, (size_t)rows * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dk, keys, (size_t)rows * 8, cudaMemcpyHostToDevice));
    }
    for (int rep = 0; rep < 2; rep++)  // twice: the row counters must be back at 0 after a launch
        pick_rows(false, 0, sample, dl, rows, vocab, dt, dk, dout, pv, pi, cnt, gi.sms);
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaMemcpy(tokens, dout, (size_t)rows * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dl));
    CUDA_CHECK(cudaFree(dt));
    CUDA_CHECK(cudaFree(dk));
    CUDA_CHECK(cudaFree(dout));
    CUDA_CHECK(cudaFree(pv));
    CUDA_CHECK(cudaFree(pi));
    CUDA_CHECK(cudaFree(cnt));
    return 0;
}
extern "C" int gumbel_sample_gpu_check(const float *logits, int rows, int vocab, const float *temperature,
                                       const uint64_t *keys, int *tokens) {
    if (!temperature || !keys) return -1;
    return pick_rows_check(logits, rows, vocab, temperature, keys, tokens);
}
extern "C" int argmax_rows_gpu_check(const float *logits, int rows, int vocab, int *tokens) {
    return pick_rows_check(logits, rows, vocab, NULL, NULL, tokens);
}

static int validate(const GpuRunner *r, const Batch *b) {
    const int T = b->n_tokens, S = b->n_seqs, V = r->g->cfg.vocab, rows = r->kv_rows, paged = r->block_size > 0;
#define BAD(...) do { fprintf(stderr, "gpu_runner_forward: " __VA_ARGS__); fputc('\n', stderr); return -1; } while (0)
    if (T < 1 || T > r->max_tok) BAD("n_tokens = %d: need 1 .. max_tokens_per_step = %d", T, r->max_tok);
    if (S < 1 || S > T) BAD("n_seqs = %d: need 1 .. n_tokens = %d", S, T);
    if (b->n_logits < 0 || b->n_logits > T) BAD("n_logits = %d: need 0 .. n_tokens = %d", b->n_logits, T);
    if (!b->token_ids || !b->positions || !b->slot_mapping || !b->cu_seqlens_q || !b->seq_lens_k ||
        (!paged && !b->seq_slot) || (paged && !b->block_tables) || (b->n_logits && !b->logit_rows))
        BAD("a batch array is NULL");
    if (b->block_size != r->block_size)
        BAD("batch block_size %d, runner %d (0 = step04 slots)", b->block_size, r->block_size);
    if (b->cu_seqlens_q[0] != 0 || b->cu_seqlens_q[S] != T)
        BAD("cu_seqlens_q must go from 0 to n_tokens = %d (got %d .. %d)", T, b->cu_seqlens_q[0], b->cu_seqlens_q[S]);
    for (int i = 0; i < S; i++) {
        const int n = b->cu_seqlens_q[i + 1] - b->cu_seqlens_q[i], L = b->seq_lens_k[i];
        if (n < 0) BAD("cu_seqlens_q decreases at sequence %d", i);
        if (L < 0 || L > r->max_len) BAD("seq_lens_k[%d] = %d: need 0 .. max_len = %d", i, L, r->max_len);
        if (L > 0 && n > L) BAD("sequence %d has %d new rows but a context of only %d", i, n, L);
        if (!paged && L > 0 && (b->seq_slot[i] < 0 || b->seq_slot[i] >= r->n_slots))
            BAD("seq_slot[%d] = %d: need 0 .. %d", i, b->seq_slot[i], r->n_slots - 1);
        if (paged && L > 0) {
            const int nb = (L + r->block_size - 1) / r->block_size;
            if (nb > b->bt_stride) BAD("sequence %d: a context of %d needs %d blocks, bt_stride is %d", i, L, nb, b->bt_stride);
            for (int k = 0; k < nb; k++) {
                const int blk = b->block_tables[(size_t)i * b->bt_stride + k];
                if (blk < 1 || blk >= r->num_blocks)
                    BAD("block_tables[%d][%d] = %d: need 1 .. num_blocks-1 = %d", i, k, blk, r->num_blocks - 1);
            }
        }
    }
    for (int t = 0; t < T; t++) {
        if (b->token_ids[t] < 0 || b->token_ids[t] >= V) BAD("token_ids[%d] = %d: outside the vocabulary [0, %d)", t, b->token_ids[t], V);
        if (b->positions[t] < 0 || b->positions[t] >= r->max_len) BAD("positions[%d] = %d: need 0 .. %d", t, b->positions[t], r->max_len - 1);
        if (b->slot_mapping[t] < -1 || b->slot_mapping[t] >= rows) BAD("slot_mapping[%d] = %d: need -1 .. %d", t, b->slot_mapping[t], rows - 1);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= T) BAD("logit_rows[%d] = %d: need 0 .. %d", i, b->logit_rows[i], T - 1);
#undef BAD
    return 0;
}

// proj_gemm over the step's T rows; batch-invariant (r->batch_inv): as GEMMs of exactly BI_ROWS rows.
static void rproj(const GpuRunner *r, cudaStream_t st, StDtype dt, const GpuQProj *q, int T, int n_out, int n_in, const void *X, int ldx,
                  const void *W, float *Y, int ldy, float beta) {
    cublasHandle_t h = r->g->blas;
    if (!r->batch_inv) {
        proj_gemm(h, dt, q, T, n_out, n_in, X, ldx, W, Y, ldy, beta, st);
        return;
    }
    const size_t es = esize(dt);
    for (int t0 = 0; t0 < T; t0 += BI_ROWS)
        proj_gemm(h, dt, q, BI_ROWS, n_out, n_in, (const char *)X + (size_t)t0 * ldx * es, ldx, W, Y + (size_t)t0 * ldy, ldy,
                  beta, st);
}

extern "C" int gpu_runner_set_batch_invariant(GpuRunner *r, int on) {
    // paged KV only: step04's slot path splits its decode rows by the step's longest row
    r->batch_inv = on && r->block_size > 0 ? 1 : 0;
    r->ac.decode_v2 = r->batch_inv;
    describe(r);
    return r->batch_inv;
}

extern "C" int gpu_runner_set_graphs(GpuRunner *r, int on) {
    r->graphs = on && r->block_size > 0 && r->ngb > 0 ? 1 : 0;
    return r->graphs;
}

extern "C" int gpu_runner_set_lone_decode(GpuRunner *r, int mode) {
    GpuInfo gi;
    const int was = r->b1_attn ? 3 : r->fused1 + r->pdl;
    r->fused1 = mode >= 1;
    r->pdl = mode >= 2 && gpu_info(&gi) == 0 && gi.cc_major >= 9;
    r->b1_attn = mode >= 3 && r->block_size > 0;
    const int now = r->b1_attn ? 3 : r->fused1 + r->pdl;
    if (now != was && r->stream) graphs_drop(r);  // the batch-1 graph was captured in the other mode
    return now;
}

extern "C" void gpu_runner_graph_stats(const GpuRunner *r, long *replays, long *captures) {
    *replays = r->replays, *captures = r->captures;
}

static int forward(GpuRunner *r, const Batch *b0, float *logits, int *out, const float *temps, const uint64_t *keys,
                   const int *fix_rows = NULL, const int *fix_src = NULL, int n_fix = 0, int slot = -1);

// Every decode graph made before the first real step (the file's top comment). For each bucket B:
// each decode kernel paged_decode_choose gives B rows (v1; v2 where max_model_len exceeds a
// partition and B rows are too few CTAs for v1), ending in the argmax and in the sampler. The
// dummy step: B sequences of token 0 with a context of 1 (v1) or PA_PART + 1 (v2) keys, every one
// in block 1, each writing its new K/V row into block 1 (the pool holds nothing yet; a block is
// written before any real step reads it). Its outputs are dropped. Returns the graphs made (0
// when the runner makes none), -1 when a step fails.
extern "C" int gpu_runner_capture_graphs(GpuRunner *r) {
    if (!r->upfront || !r->graphs || r->batch_inv || !r->ac.small_ok || r->ngb < 1 || r->num_blocks < 2) return 0;
    const int Bmax = r->gb[r->ngb - 1], KV = r->g->cfg.n_kv_heads, bs = r->block_size;
    const int long_len = r->max_len > PA_PART ? PA_PART + 1 : 0;
    Batch b;
    batch_alloc_paged(&b, Bmax, Bmax, bs, r->nbt);
    for (size_t i = 0; i < (size_t)Bmax * r->nbt; i++) b.block_tables[i] = 1;
    float *temps = (float *)xcalloc((size_t)Bmax, sizeof(float));
    uint64_t *keys = (uint64_t *)xcalloc((size_t)Bmax, sizeof(uint64_t));
    int *out = (int *)xmalloc((size_t)Bmax * sizeof(int));
    for (int i = 0; i < Bmax; i++) temps[i] = 1.0f, keys[i] = (uint64_t)i;
    const long before = r->captures;
    int rc = 0;
    for (int k = 0; k < r->ngb && rc == 0; k++) {
        const int B = r->gb[k];
        for (int v = 1; v <= 2 && rc == 0; v++) {
            const int L = v == 1 ? 1 : long_len;
            if (L < 1 || paged_decode_choose(B, KV, L, r->ac.num_sms) != v) continue;
            b.n_seqs = b.n_tokens = b.n_logits = B;
            for (int i = 0; i < B; i++) {
                b.cu_seqlens_q[i] = i, b.seq_lens_k[i] = L, b.logit_rows[i] = i;
                b.token_ids[i] = 0, b.positions[i] = L - 1, b.slot_mapping[i] = bs + (L - 1) % bs;
            }
            b.cu_seqlens_q[B] = B;
            for (int sm = 0; sm < 2 && rc == 0; sm++) {  // argmax, then the sampler
                const long c0 = r->captures;
                for (int pass = 0; pass < 2 && r->captures == c0 && rc == 0; pass++)  // eager, then the capture
                    rc = sm ? forward(r, &b, NULL, out, temps, keys) : forward(r, &b, NULL, out, NULL, NULL);
            }
        }
    }
    batch_free(&b);
    free(temps), free(keys), free(out);
    return rc ? -1 : (int)(r->captures - before);
}

// The graph bucket of a decode step, or -1 when the step is not one a graph takes: paged KV, not
// batch-invariant, every sequence exactly one new row over a context of >= 1 keys, its logit row
// its own row, a batch-size bucket that holds it, and the decode kernel taking the shape.
static int graph_bucket(const GpuRunner *r, const Batch *b) {
    if (!r->graphs || r->batch_inv || !r->ac.small_ok) return -1;
    const int S = b->n_seqs;
    if (S != b->n_tokens || b->n_logits != S || S > r->gb[r->ngb - 1]) return -1;
    for (int i = 0; i < S; i++)
        if (b->cu_seqlens_q[i + 1] - b->cu_seqlens_q[i] != 1 || b->seq_lens_k[i] < 1 || b->logit_rows[i] != i) return -1;
    int k = 0;
    while (r->gb[k] < S) k++;
    return k;
}

// The decode step b padded to B rows in r->gpad (the padding rows as the file's top comment says).
// The block tables are b's own: the upload reads a sequence's table only for its keys, and the
// padding rows have none.
static const Batch *graph_pad(GpuRunner *r, const Batch *b, int B) {
    Batch *g = &r->gpad;
    const int S = b->n_seqs;
    g->n_tokens = g->n_seqs = g->n_logits = B;
    g->block_size = r->block_size, g->block_tables = b->block_tables, g->bt_stride = b->bt_stride;
    for (int i = 0; i < B; i++) {
        const int real = i < S;
        g->token_ids[i] = real ? b->token_ids[i] : 0;
        g->positions[i] = real ? b->positions[i] : 0;
        g->slot_mapping[i] = real ? b->slot_mapping[i] : -1;
        g->cu_seqlens_q[i] = i;
        g->seq_lens_k[i] = real ? b->seq_lens_k[i] : 0;
        g->logit_rows[i] = i;
    }
    g->cu_seqlens_q[B] = B;
    return g;
}

// The forward of gpu_runner_forward / gpu_runner_forward_sampled: logits to the host when logits,
// tokens (argmax, or drawn when temps) to the host when out. gpu_runner_launch: slot 0 or 1 (out
// is then that slot's pinned buffer, and the call returns once the step is queued), and n_fix rows
// take their token from the previous launch's d_argmax on the device.
static int forward(GpuRunner *r, const Batch *b0, float *logits, int *out, const float *temps, const uint64_t *keys,
                   const int *fix_rows, const int *fix_src, int n_fix, int slot) {
    if (validate(r, b0) != 0) return -1;
    GpuModel *g = r->g;
    const ModelConfig *c = &g->cfg;
    // a decode step whose graph exists (or is captured now): padded to its bucket, on r->stream
    const int gi = logits || !out ? -1 : graph_bucket(r, b0);
    const Batch *b = gi >= 0 ? graph_pad(r, b0, r->gb[gi]) : b0;
    const int T = b->n_tokens, NL = b->n_logits, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    const int ff = c->intermediate, V = c->vocab, qd = H * hd, kd = KV * hd, nqkv = qd + 2 * kd;
    const StDtype dt = g->wdt;
    const size_t es = esize(dt);
    const float eps = c->rms_eps;

    // ---- the plan, on the host
    AttnPlan *p = &r->plan;
    p->ns = 0, p->nsplit = 0, p->maxlen = 0, p->nlg = 0, p->npad = 0;
    const int paged = r->block_size > 0;  // then an item's base is its sequence (its block-table row)
    for (int i = 0; i < b->n_seqs; i++) {
        const int nlg0 = p->nlg;
        plan_add(p, r->ac.small_ok, small_rows(r), b->cu_seqlens_q[i], b->cu_seqlens_q[i + 1] - b->cu_seqlens_q[i],
                 b->seq_lens_k[i], paged ? i : b->seq_lens_k[i] > 0 ? b->seq_slot[i] * r->max_len : 0);
        if (p->nlg > nlg0) p->long_seq[nlg0] = i;  // sequence i is a long item
    }
    if (r->lpt && paged && p->ns > 1)  // the decode items longest first (the file's top comment)
        paged_decode_order(p->srow, p->sbase, p->slen, p->ns, r->sort_tmp);
    // a graph is recorded for one decode kernel: v2's grid then covers max_model_len (the
    // partitions past a row's keys exit at once), v1's does not depend on the lengths
    const int gemv1 = r->use_gemv && !r->batch_inv && T == 1 && p->nlg == 0 && p->npad == 0;  // a lone decode: GEMV layers
    const int fused1 = gemv1 && r->fused1, pdl = fused1 && r->pdl;  // ... as step07's batch-1 chain
    const int bp = gi >= 0 && !gemv1 && r->bpdl;  // a graph step of several rows: PDL launches too
    r->ac.b1_part = fused1 && paged ? r->b1_part : 0;
    const int gv = gi < 0 ? 0 : r->ac.b1_part > 0 ? 2 : paged_decode_choose(T, KV, p->maxlen, r->ac.num_sms);
    if (gv == 2) p->maxlen = r->max_len;
    // graphs, and the batch-1 chain also when eager (programmatic launches need a stream of their own)
    const cudaStream_t st = gi >= 0 || fused1 ? r->stream : 0;
    // ---- one packed upload: token ids, positions, slots, logit rows, decode items
    int *hp = r->h_pack + (size_t)(slot + 1) * r->pack_cap;  // a launch's host copy may still be read by a queued upload
    size_t o = 0;
    const size_t o_tok = o; memcpy(hp + o, b->token_ids, (size_t)T * 4), o += T;
    const size_t o_pos = o; memcpy(hp + o, b->positions, (size_t)T * 4), o += T;
    const size_t o_slot = o; memcpy(hp + o, b->slot_mapping, (size_t)T * 4), o += T;
    const size_t o_lr = o; if (NL) memcpy(hp + o, b->logit_rows, (size_t)NL * 4); o += NL;
    const size_t o_sr = o; memcpy(hp + o, p->srow, (size_t)p->ns * 4), o += p->ns;
    const size_t o_sl = o; memcpy(hp + o, p->slen, (size_t)p->ns * 4), o += p->ns;
    const size_t o_sb = o; memcpy(hp + o, p->sbase, (size_t)p->ns * 4), o += p->ns;
    const size_t o_bt = o;  // paged: the block tables, nbt entries per sequence (the entries past a context: 0)
    if (paged) {
        for (int i = 0; i < b->n_seqs; i++) {
            const int L = b->seq_lens_k[i], nb = L > 0 ? (L + r->block_size - 1) / r->block_size : 0;
            if (nb) memcpy(hp + o, b->block_tables + (size_t)i * b->bt_stride, (size_t)nb * 4);  // (padding rows: none)
            memset(hp + o + nb, 0, (size_t)(r->nbt - nb) * 4);
            o += r->nbt;
        }
    }
    o += o & 1;  // the keys 8-byte aligned
    const size_t o_key = o, o_tmp = o + 2 * (size_t)NL;  // sampling: keys (2 ints each), temperatures
    if (temps) {
        for (int i = 0; i < NL; i++) {
            const uint64_t k = i < b0->n_logits ? keys[i] : 0;
            const float t = i < b0->n_logits ? temps[i] : 0.0f;
            memcpy(hp + o_key + 2 * i, &k, 8);
            memcpy(hp + o_tmp + i, &t, 4);
        }
        o = o_tmp + NL;
    }
    const size_t o_tiles = o;  // paged, fused: the long chunks' prefill tiles
    p->ntiles = 0;
    if (paged && r->prefill == PREFILL_PAGED && p->nlg) {
        for (int i = 0; i < p->nlg; i++) p->pc[i] = PrefillChunk{p->lg[i].base, p->lg[i].row0, p->lg[i].n, p->lg[i].L};
        p->ntiles = paged_prefill_plan(p->pc, p->nlg, H, KV, hp + o, (int)((r->pack_cap - o) / PP_TILE_INTS));
        if (p->ntiles < 1) die("gpu_runner_forward: the prefill tile plan does not fit the upload buffer");
        o += (size_t)p->ntiles * PP_TILE_INTS;
    }
    // flash: the call's sequences are the batch's, the ones not on its path with no rows (no tiles)
    FlashAttn *fa = &r->ac.fa;
    fa->ntiles = 0;
    if (r->prefill == PREFILL_FLASH && p->nlg) {
        const int S = b->n_seqs;
        int *fcu = hp + o, *frow = fcu + S + 1, *fctx = frow + S, *ftab = fctx + S, *ftiles = ftab + S;
        memset(fcu, 0, (size_t)(4 * S + 1) * 4);
        for (int j = 0; j < p->nlg; j++) {
            const int i = p->long_seq[j];
            fcu[i + 1] = p->lg[j].n, fctx[i] = p->lg[j].L - p->lg[j].n;
            ftab[i] = paged ? 0 : b->seq_slot[i];  // slots: sequence i's one block is its slot
        }
        for (int i = 0; i < S; i++) frow[i] = b->cu_seqlens_q[i], fcu[i + 1] += fcu[i];
        fa->ntiles = flash_plan(r->ac.flash_tile_m, fa->H, fa->KV, fcu, S, ftiles);
        if (fa->ntiles < 1) die("gpu_runner_forward: the flash attention plan failed");
        fa->nseq = S;
        const size_t of = o;
        o += (size_t)5 * S + 2;
        fa->cu_seqlens = r->d_pack + of, fa->q_rows = r->d_pack + of + S + 1, fa->ctx_lens = r->d_pack + of + 2 * S + 1;
        fa->block_tables = paged ? r->d_pack + o_bt : r->d_pack + of + 3 * S + 1;
        fa->cu_tiles = r->d_pack + of + 4 * S + 1;
    }
    const size_t o_fix = o;  // launch: (row, source) pairs of the rows whose token is on the device
    for (int j = 0; j < n_fix; j++) hp[o + 2 * j] = fix_rows[j], hp[o + 2 * j + 1] = fix_src[j];
    o += 2 * (size_t)n_fix;
    int *dp = r->d_pack;
    r->ac.d_bt = paged ? dp + o_bt : NULL;
    r->ac.d_tiles = dp + o_tiles;
    CUDA_CHECK(cudaEventRecord(slot >= 0 ? r->eva[slot] : r->ev0, st));
    CUDA_CHECK(cudaMemcpyAsync(dp, hp, o * 4, cudaMemcpyHostToDevice, st));
    if (n_fix > 0) {
        k_fix_tokens<<<(n_fix + 255) / 256, 256, 0, st>>>(dp + o_tok, dp + o_fix, n_fix, r->d_argmax);
        CUDA_CHECK_LAST();
    }

    // ---- the kernels of the step (captured once per bucket into a graph when gi >= 0)
    auto body = [&]() -> int {
        int launches = 0;
        DISPATCH(dt, A, k_embed<A><<<T, 256, 0, st>>>((const A *)g->embed, dp + o_tok, d, r->x));
        CUDA_CHECK_LAST();
        const int half = hd / 2;
        k_rope_rows<<<grid_for((size_t)T * half, 256), 256, 0, st>>>(dp + o_pos, r->inv_freq, T, half, r->cos_t, r->sin_t);
        CUDA_CHECK_LAST();
        launches += 2;
        const dim3 qkv_grid(T, (H + 2 * KV + 3) / 4), qkv_block(32, 4);
        // For measuring only: LLM_STEP_SKIP=mask leaves kernels out of a step of 2..64 rows (1 the
        // RMSNorms inside the layers, 2 q|k|v, 4 RoPE and the K/V write, 8 attention, 16 o, 32 gate|up
        // with its SwiGLU, 64 down), so that the step's time without them says what each costs where
        // it overlaps its neighbours. The step's output is then wrong. Read once.
        static int skip_env = -1;
        if (skip_env < 0) skip_env = getenv("LLM_STEP_SKIP") ? atoi(getenv("LLM_STEP_SKIP")) : 0;
        const int skip = !fused1 && !gemv1 && T >= 2 && T <= 64 ? skip_env : 0;
        // 2..16 rows, INT4 projections (qlinear_gpu_gemm_norm): o and down also write what the next
        // RMSNorm needs but the rows' RMS (xn = x * its weight, partial sums of squares in ssn[]), and
        // gate|up and the next q|k|v scale their sums by 1 / RMS: no RMSNorm launch between them.
        // pend: the partial sums per row that xn's pending norm left in ssn[pside] (0: none)
        const bool fnorm = r->gemm_norm && !fused1 && !gemv1 && !r->batch_inv && T >= 2 && T <= 16 &&
                           (dt == ST_BF16 || dt == ST_F16) && !skip;
        int pend = 0, pside = 0;
        auto norm_in = [&](QGemmNorm *nm) { nm->ss_in = r->ssn[pside], nm->nss_in = pend, nm->cols = d, nm->eps = eps; };
        auto norm_fix = [&]() {  // the consumer refused: finish the norm in xn itself
            QGemmNorm nm = {};
            norm_in(&nm);
            if (qlinear_gpu_norm_finish(dt, T, r->xn, d, &nm, st) != 0) die("qlinear_gpu_norm_finish failed (T = %d)", T);
            launches++;
        };
        for (int l = 0; l < c->n_layers; l++) {
            const GpuLayer *L = &g->layers[l];
            void *kc = (char *)r->kc + (size_t)l * r->lstride, *vc = (char *)r->vc + (size_t)l * r->lstride;
            // ---- attention block
            if (fused1) {  // the RMSNorm inside the qkv GEMV (step07)
                launches += fused_proj(pdl, st, dt, &L->qqkv, L->wqkv, r->x, L->attn_norm, eps, NULL, L->bqkv, r->qkv,
                                       nqkv, d, 0, 0, r->xnf, NULL);
            } else if (gemv1) {
                k_rmsnorm<float><<<1, 1024, 0, st>>>(r->x, L->attn_norm, d, 1, d, eps, r->xnf);
                CUDA_CHECK_LAST();
                proj_gemv(dt, &L->qqkv, L->wqkv, r->xnf, L->bqkv, r->qkv, nqkv, d, 0, st);
                launches += 2;
            } else {
                int done = 0;
                if (pend) {  // the norm folded into the last down and this q|k|v
                    QGemmNorm nm = {};
                    norm_in(&nm);
                    if (L->qqkv.n == 1)
                        done = qlinear_gpu_gemm_norm(L->qqkv.part[0], dt, T, r->xn, d, r->qkv, nqkv, 0.0f, &nm, st);
                    if (done < 0) die("qlinear_gpu_gemm_norm failed (q|k|v, T = %d)", T);
                    if (!done) norm_fix();
                } else if (!(skip & 1)) {
                    DISPATCH(dt, A, pdl_launch(bp, k_rmsnorm<A>, dim3(T), dim3(256), 0, st, r->x, L->attn_norm, d, 1, (size_t)d, eps, (A *)r->xn));
                    launches++;
                }
                if (!done && !(skip & 2)) rproj(r, st, dt, &L->qqkv, T, nqkv, d, r->xn, d, L->wqkv, r->qkv, nqkv, 0.0f);
                launches++, pend = 0;
            }
            bool fattn = false;  // the lone row's RoPE, K/V write and attention in one kernel (mode 3)
            if (fused1 && r->b1_attn && r->ac.part_cap >= (size_t)H * r->b1_nsplit * hd)
                DISPATCH(dt, A,
                         fattn = attn_fused2_paged<A>(pdl, st, r->b1_nsplit, r->qkv, L->q_norm, L->k_norm, r->cos_t,
                                                      r->sin_t, dp + o_pos, dp + o_slot, dp + o_bt, r->block_size, H, KV,
                                                      hd, eps, (A *)kc, (A *)vc, r->ac.part_o, r->ac.part_ml,
                                                      r->attn_count, r->attf));
            if (fattn) {
                launches++;
            } else {
                if (!(skip & 4))
                    DISPATCH(dt, A,
                             pdl_launch(pdl || bp, k_qkv_rows<A, A>, qkv_grid, qkv_block, 0, st, r->qkv,
                                        gemv1 ? (const float *)NULL : L->bqkv, L->q_norm, L->k_norm, r->cos_t, r->sin_t,
                                        dp + o_slot, H, KV, hd, eps, (A *)r->q16, (A *)kc, (A *)vc));
                launches++;
                if (!(skip & 8))
                    launches += attn_layer(&r->ac, p, dp + o_sr, dp + o_sl, dp + o_sb, r->qkv, nqkv, r->q16, kc, vc,
                                           gemv1 ? (void *)r->attf : r->att, gemv1, st, pdl || bp);
            }
            if (fused1) {
                launches += fused_proj(pdl, st, dt, &L->qo, L->wo, r->x, NULL, eps, r->attf, L->bo, r->x, d, qd, 1, 0,
                                       r->xnf, NULL);  // x += att Wo^T + bo
            } else if (gemv1) {
                proj_gemv(dt, &L->qo, L->wo, r->attf, L->bo, r->x, d, qd, 1, st);  // x += att Wo^T + bo
                launches++;
            } else {
                int done = 0;
                if (fnorm && L->qo.n == 1 && !L->bo) {  // x += att Wo^T, and the MLP's norm begun
                    QGemmNorm nm = {};
                    nm.nw = L->mlp_norm, nm.xn = r->xn, nm.ldxn = d, nm.ss_out = r->ssn[1];
                    done = qlinear_gpu_gemm_norm(L->qo.part[0], dt, T, r->att, qd, r->x, d, 1.0f, &nm, st);
                    if (done < 0) die("qlinear_gpu_gemm_norm failed (o, T = %d)", T);
                    if (done) pend = nm.nss_out, pside = 1;
                }
                if (!done && !(skip & 16)) rproj(r, st, dt, &L->qo, T, d, qd, r->att, qd, L->wo, r->x, d, 1.0f);  // x += att Wo^T
                launches++;
                if (L->bo) {
                    k_add_bias<<<grid_for((size_t)T * d, 256), 256, 0, st>>>(r->x, L->bo, T, d, d);
                    CUDA_CHECK_LAST();
                    launches++;
                }
            }
            // ---- MLP block
            if (fused1) {  // the RMSNorm and the SwiGLU inside the gate|up GEMV (step07)
                launches += fused_proj(pdl, st, dt, &L->qgu, L->wgu, r->x, L->mlp_norm, eps, NULL, NULL, r->hf, ff, d, 0, 1,
                                       r->xnf, r->gu);
                launches += fused_proj(pdl, st, dt, &L->qdown, L->wdown, r->x, NULL, eps, r->hf, NULL, r->x, d, ff, 1, 0,
                                       r->xnf, NULL);
            } else if (gemv1) {
                k_rmsnorm<float><<<1, 1024, 0, st>>>(r->x, L->mlp_norm, d, 1, d, eps, r->xnf);
                CUDA_CHECK_LAST();
                proj_gemv(dt, &L->qgu, L->wgu, r->xnf, NULL, r->gu, 2 * ff, d, 0, st);
                k_swiglu<float><<<(ff + 255) / 256, 256, 0, st>>>(r->gu, r->hf, 1, ff);
                CUDA_CHECK_LAST();
                proj_gemv(dt, &L->qdown, L->wdown, r->hf, NULL, r->x, d, ff, 1, st);
                launches += 4;
            } else {
                if (!pend && !(skip & 1)) {
                    DISPATCH(dt, A, pdl_launch(bp, k_rmsnorm<A>, dim3(T), dim3(256), 0, st, r->x, L->mlp_norm, d, 1, (size_t)d, eps, (A *)r->xn));
                    launches++;
                }
                // INT4 gate|up of <= 16 rows: the SwiGLU in the GEMM's epilogue (step06's k_qtmat), else apart
                // (and the norm folded into o finished here, or in xn by hand)
                int sw = skip & 32 ? 1 : 0;
                if (!sw && r->gemm_swiglu && !r->batch_inv && L->qgu.n == 1 && (dt == ST_BF16 || dt == ST_F16)) {
                    if (pend) {
                        QGemmNorm nm = {};
                        norm_in(&nm);
                        sw = qlinear_gpu_gemm_swiglu_norm(L->qgu.part[0], dt, T, r->xn, d, r->h, ff, ff, &nm, st);
                    } else {
                        sw = qlinear_gpu_gemm_swiglu(L->qgu.part[0], dt, T, r->xn, d, r->h, ff, ff, st);
                    }
                    if (sw < 0) die("qlinear_gpu_gemm_swiglu failed (T = %d)", T);
                }
                if (pend && !sw) norm_fix();
                pend = 0;
                if (!sw) {
                    rproj(r, st, dt, &L->qgu, T, 2 * ff, d, r->xn, d, L->wgu, r->gu, 2 * ff, 0.0f);
                    if (fused_swiglu_pdl(1, ST_F32, dt, r->gu, r->h, T, ff, st, bp) != 1) die("fused_swiglu: refused (see above)");
                }
                int done = 0;
                if (fnorm && l + 1 < c->n_layers && L->qdown.n == 1) {  // x += h Wd^T, the next attention's norm begun
                    QGemmNorm nm = {};
                    nm.nw = g->layers[l + 1].attn_norm, nm.xn = r->xn, nm.ldxn = d, nm.ss_out = r->ssn[0];
                    done = qlinear_gpu_gemm_norm(L->qdown.part[0], dt, T, r->h, ff, r->x, d, 1.0f, &nm, st);
                    if (done < 0) die("qlinear_gpu_gemm_norm failed (down, T = %d)", T);
                    if (done) pend = nm.nss_out, pside = 0;
                }
                if (!done && !(skip & 64)) rproj(r, st, dt, &L->qdown, T, d, ff, r->h, ff, L->wdown, r->x, d, 1.0f);
                launches += sw ? 2 : 3;
            }
        }
        // ---- logits only for the rows that sample, lcap rows per lm_head GEMM
        if (fused1) {  // the lone row: the final RMSNorm inside the lm_head GEMV, the argmax across many blocks
            int done = 0;
            if (out && !temps) {  // greedy: the argmax inside the lm_head's row loop where that runs
                const ArgmaxOut am = {r->arg_v, r->arg_i, r->arg_count, r->d_argmax, NULL, NULL};
                if (g->qlm.n == 0)
                    DISPATCH(dt, A, done = gemv_rows_launch<A, true>(pdl, st, (const A *)g->lm_head, r->x, g->final_norm, eps,
                                                                   (const float *)NULL, r->logits, V, d, 0, &am));
            }
            if (!done) launches += fused_proj(pdl, st, dt, &g->qlm, g->lm_head, r->x, g->final_norm, eps, NULL, NULL,
                                              r->logits, V, d, 0, 0, r->xnf, NULL);
            else launches++;
            if (out && temps) {
                pick_rows(pdl, st, true, r->logits, 1, V, (const float *)(dp + o_tmp), (const unsigned long long *)(dp + o_key),
                          r->d_argmax, r->pick_v, r->pick_i, r->pick_cnt, r->ac.num_sms);
                launches++;
            } else if (out && !done) {
                const int ab = (V + 1023) / 1024 < 1024 ? (V + 1023) / 1024 : 1024;
                pdl_launch(pdl, k_argmax_fused, dim3(ab), dim3(1024), 0, st, (const float *)r->logits, V, r->arg_v,
                           r->arg_i, r->arg_count, r->d_argmax, (int *)NULL, (int *)NULL);
                launches++;
            }
            if (logits) CUDA_CHECK(cudaMemcpyAsync(logits, r->logits, (size_t)V * 4, cudaMemcpyDeviceToHost, st));
            return launches;
        }
        for (int o0 = 0; o0 < NL; o0 += r->lcap) {
            const int nl = NL - o0 < r->lcap ? NL - o0 : r->lcap;
            k_gather_rows<<<nl, 256, 0, st>>>(r->x, dp + o_lr + o0, d, r->xg);
            CUDA_CHECK_LAST();
            if (r->use_gemv && !r->batch_inv && nl == 1) {
                k_rmsnorm<float><<<1, 1024, 0, st>>>(r->xg, g->final_norm, d, 1, d, eps, r->xnf);
                CUDA_CHECK_LAST();
                proj_gemv(dt, &g->qlm, g->lm_head, r->xnf, NULL, r->logits, V, d, 0, st);
            } else {
                DISPATCH(dt, A, pdl_launch(bp, k_rmsnorm<A>, dim3(nl), dim3(256), 0, st, (const float *)r->xg, g->final_norm, d, 1, (size_t)d, eps, (A *)r->xn));
                // batch-invariant: always lcap rows (the rows past nl are stale and ignored)
                proj_gemm(g->blas, dt, &g->qlm, r->batch_inv ? r->lcap : nl, V, d, r->xn, d, g->lm_head, r->logits, V, 0.0f,
                          st);
            }
            launches += 3;
            if (out) {  // the draws (temps), else the argmax, of the nl rows
                pick_rows(bp, st, temps != NULL, r->logits, nl, V, (const float *)(dp + o_tmp) + o0,
                          (const unsigned long long *)(dp + o_key) + o0, r->d_argmax + o0, r->pick_v, r->pick_i,
                          r->pick_cnt, r->ac.num_sms);
                launches++;
            }
            if (logits)
                CUDA_CHECK(cudaMemcpyAsync(logits + (size_t)o0 * V, r->logits, (size_t)nl * V * 4, cudaMemcpyDeviceToHost, st));
        }
        return launches;
    };
    int launches = 0;
    const int gk = gv > 0 ? gv - 1 : 0, gm = temps != NULL;  // the graph's decode kernel and last kernel
    // cuBLAS on the graph's stream, with a workspace it does not allocate during a capture: only for
    // the bucket's eager step and its capture (a replay makes no cuBLAS call; switching on every
    // replay, as before d7bddbc, ran nano the same on an H100)
    const int blas_on_st = gi >= 0 && !r->gexec[gi][gk][gm];
    if (blas_on_st) {
        CUBLAS_CHECK(cublasSetStream(g->blas, st));
        CUBLAS_CHECK(cublasSetWorkspace(g->blas, r->blas_ws, GRAPH_BLAS_WS));
    }
    if (gi >= 0 && r->gexec[gi][gk][gm]) {
        CUDA_CHECK(cudaGraphLaunch(r->gexec[gi][gk][gm], st));
        launches = r->glaunch[gi][gk][gm];
        r->replays++;
    } else if (gi >= 0 && r->gwarm[gi][gk][gm]) {
        cudaGraph_t gr;
        CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        launches = body();
        CUDA_CHECK(cudaStreamEndCapture(st, &gr));
        CUDA_CHECK(cudaGraphInstantiate(&r->gexec[gi][gk][gm], gr, 0));
        CUDA_CHECK(cudaGraphDestroy(gr));
        r->glaunch[gi][gk][gm] = launches;
        r->captures++;
        CUDA_CHECK(cudaGraphLaunch(r->gexec[gi][gk][gm], st));
    } else {
        launches = body();
        if (gi >= 0) r->gwarm[gi][gk][gm] = 1;
    }
    CUDA_CHECK(cudaEventRecord(slot >= 0 ? r->evb[slot] : r->ev1, st));
    const int NR = b0->n_logits;  // the padding rows' tokens stay on the device
    if (out && NR) CUDA_CHECK(cudaMemcpyAsync(out, r->d_argmax, (size_t)NR * 4, cudaMemcpyDeviceToHost, st));
    r->launches = launches;
    r->last_nl = NL;
    r->last_async = slot >= 0, r->last_nr = NR;
    if (slot >= 0) {  // queued: gpu_runner_collect waits for it
        CUDA_CHECK(cudaEventRecord(r->evd[slot], st));
        if (blas_on_st) CUBLAS_CHECK(cublasSetStream(g->blas, 0));
        r->pend[slot] = 1, r->pend_nr[slot] = NR;
        return 0;
    }
    CUDA_CHECK(cudaEventSynchronize(r->ev1));
    CUDA_CHECK(cudaStreamSynchronize(st));
    if (blas_on_st) CUBLAS_CHECK(cublasSetStream(g->blas, 0));  // (also back to cuBLAS's own workspace)
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, r->ev0, r->ev1));
    r->last_ms = ms;
    (void)es;
    return 0;
}

extern "C" int gpu_runner_last_logits(const GpuRunner *r, int k, float *out) {
    if (k < 0 || k >= r->last_nl || r->last_nl > r->lcap) return -1;
    const size_t V = (size_t)r->g->cfg.vocab;
    CUDA_CHECK(cudaMemcpy(out, r->logits + (size_t)k * V, V * 4, cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int gpu_runner_forward(GpuRunner *r, const Batch *b, float *logits, int *argmax) {
    return forward(r, b, logits, argmax, NULL, NULL);
}

extern "C" int gpu_runner_forward_sampled(GpuRunner *r, const Batch *b, const float *temperature, const uint64_t *keys,
                                          int *tokens) {
    if (!temperature || !keys || !tokens) {
        fprintf(stderr, "gpu_runner_forward_sampled: temperature, keys and tokens are required\n");
        return -1;
    }
    return forward(r, b, NULL, tokens, temperature, keys);
}

extern "C" int gpu_runner_launch(GpuRunner *r, const Batch *b, const float *temperature, const uint64_t *keys,
                                 const int *fix_rows, const int *fix_src, int n_fix, int slot) {
    if (runner_launch_check("gpu_runner_launch", b, temperature, keys, fix_rows, fix_src, n_fix, slot,
                            r->pend, r->last_async, r->last_nr) != 0)
        return -1;
    return forward(r, b, NULL, r->h_out[slot], temperature, keys, fix_rows, fix_src, n_fix, slot);
}

extern "C" int gpu_runner_collect(GpuRunner *r, int slot, int *tokens) {
    if (slot < 0 || slot > 1 || !r->pend[slot]) {
        fprintf(stderr, "gpu_runner_collect: slot %d holds no launch\n", slot);
        return -1;
    }
    CUDA_CHECK(cudaEventSynchronize(r->evd[slot]));
    memcpy(tokens, r->h_out[slot], (size_t)r->pend_nr[slot] * 4);
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, r->eva[slot], r->evb[slot]));
    r->last_ms = ms;
    r->pend[slot] = 0;
    return 0;
}

// ---------------------------------------------------------------- test entry point

// Both layouts: base (step04: each sequence's first cache row) or, when block_size > 0, the
// block tables bt (n_seqs, bt_stride) on the host (step05).
static int attention_check(const float *q, const float *kc, const float *vc, int cache_rows, int n_seqs,
                           const int *cu_q, const int *seq_lens_k, const int *base, const int *bt, int bt_stride,
                           int block_size, int H, int KV, int hd, StDtype dt, int small_chunk, float *out) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) return -1;
    if (H % KV || n_seqs < 1) return -1;
    if (dt == ST_BF16 && gi.cc_major < 8) dt = ST_F32;  // as gpu_model_load does on sm_75
    const int T = cu_q[n_seqs], qd = H * hd, kd = KV * hd;
    const size_t es = esize(dt);
    int maxL = 1;
    for (int i = 0; i < n_seqs; i++) maxL = seq_lens_k[i] > maxL ? seq_lens_k[i] : maxL;
    AttnCtx a = {};
    CUBLAS_CHECK(cublasCreate(&a.blas));
    a.dt = dt, a.H = H, a.KV = KV, a.hd = hd;
    const int paged = block_size > 0;
    a.small_ok = paged ? paged_decode_supported(dt, H, KV, hd) : (H / KV) <= ATTN_MAXG && hd <= 32 * ATTN_MAXE;
    a.vec_attn = 1;
    a.block_size = paged ? block_size : 0, a.bt_stride = bt_stride, a.num_sms = gi.sms;
    int *dbt = NULL;
    if (paged) {
        a.gk = dalloc_r((size_t)maxL * kd * es, NULL), a.gv = dalloc_r((size_t)maxL * kd * es, NULL);
        dbt = (int *)dalloc_r((size_t)n_seqs * bt_stride * 4, NULL);
        CUDA_CHECK(cudaMemcpy(dbt, bt, (size_t)n_seqs * bt_stride * 4, cudaMemcpyHostToDevice));
        a.d_bt = dbt;
    }
    a.s_cap = (size_t)H * (T < maxL ? T : maxL) * maxL;
    a.S = (float *)dalloc_r(a.s_cap * 4, NULL);
    a.P = dt == ST_F32 ? (void *)a.S : dalloc_r(a.s_cap * es, NULL);
    const int nsplit_max = (maxL + ATTN_CHUNK - 1) / ATTN_CHUNK;
    a.part_cap = (size_t)H * nsplit_max * hd * 3;  // 3 items per group: the grouping is exercised too
    a.part_o = (float *)dalloc_r(a.part_cap * 4, NULL);
    a.part_ml = (float *)dalloc_r(a.part_cap / hd * 8, NULL);
    AttnPlan p = {};
    p.srow = (int *)xmalloc((size_t)T * 4), p.slen = (int *)xmalloc((size_t)T * 4), p.sbase = (int *)xmalloc((size_t)T * 4);
    p.lg = (LongItem *)xmalloc((size_t)T * sizeof(LongItem));
    p.pad0 = (int *)xmalloc((size_t)T * 4), p.padn = (int *)xmalloc((size_t)T * 4);
    for (int i = 0; i < n_seqs; i++)
        plan_add(&p, a.small_ok, small_chunk, cu_q[i], cu_q[i + 1] - cu_q[i], seq_lens_k[i], paged ? i : base[i]);
    // inputs: q fp32 (decode path) and rounded (GEMM path); the cache rounded to dt
    const size_t nq = (size_t)T * qd, nk = (size_t)cache_rows * kd, big = nq > nk ? nq : nk;
    float *tmp = (float *)dalloc_r(big * 4, NULL), *dq = (float *)dalloc_r(nq * 4, NULL);
    void *dq16 = dalloc_r(nq * es, NULL), *dk = dalloc_r(nk * es, NULL), *dv = dalloc_r(nk * es, NULL);
    void *dout = dalloc_r(nq * es, NULL);
    CUDA_CHECK(cudaMemcpy(dq, q, nq * 4, cudaMemcpyHostToDevice));
    DISPATCH(dt, A, k_round_rows<A><<<256, 256>>>(dq, (A *)dq16, nq));
    CUDA_CHECK_LAST();
    const float *src[2] = {kc, vc};
    void *dst[2] = {dk, dv};
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaMemcpy(tmp, src[i], nk * 4, cudaMemcpyHostToDevice));
        DISPATCH(dt, A, k_round_rows<A><<<256, 256>>>(tmp, (A *)dst[i], nk));
        CUDA_CHECK_LAST();
    }
    int *dplan = (int *)dalloc_r((size_t)3 * (p.ns + 1) * 4, NULL);
    if (p.ns) {
        CUDA_CHECK(cudaMemcpy(dplan, p.srow, (size_t)p.ns * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dplan + p.ns, p.slen, (size_t)p.ns * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dplan + 2 * p.ns, p.sbase, (size_t)p.ns * 4, cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaMemset(dout, 0xff, nq * es));  // poison (NaN): every row must be written
    attn_layer(&a, &p, dplan, dplan + p.ns, dplan + 2 * p.ns, dq, qd, dq16, dk, dv, dout, 0, 0, 0);
    DISPATCH(dt, A, k_to_f32_rows<A><<<256, 256>>>((const A *)dout, tmp, nq));
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaMemcpy(out, tmp, nq * 4, cudaMemcpyDeviceToHost));
    void *ps[] = {tmp, dq, dq16, dk, dv, dout, dplan, a.S, a.part_o, a.part_ml, a.gk, a.gv, dbt};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) CUDA_CHECK(cudaFree(ps[i]));
    if (a.P != a.S) CUDA_CHECK(cudaFree(a.P));
    CUBLAS_CHECK(cublasDestroy(a.blas));
    free(p.srow), free(p.slen), free(p.sbase), free(p.lg), free(p.pad0), free(p.padn);
    return 0;
}

extern "C" int batch_attention_gpu_check(const float *q, const float *kc, const float *vc, int cache_rows, int n_seqs,
                                         const int *cu_q, const int *seq_lens_k, const int *base, int H, int KV, int hd,
                                         StDtype dt, int small_chunk, float *out) {
    return attention_check(q, kc, vc, cache_rows, n_seqs, cu_q, seq_lens_k, base, NULL, 0, 0, H, KV, hd, dt, small_chunk,
                           out);
}

extern "C" int batch_attention_gpu_check_paged(const float *q, const float *kc, const float *vc, int cache_rows,
                                               int n_seqs, const int *cu_q, const int *seq_lens_k, const int *block_tables,
                                               int bt_stride, int block_size, int H, int KV, int hd, StDtype dt,
                                               int small_chunk, float *out) {
    if (block_size < 1 || bt_stride < 1) return -1;
    return attention_check(q, kc, vc, cache_rows, n_seqs, cu_q, seq_lens_k, NULL, block_tables, bt_stride, block_size, H,
                           KV, hd, dt, small_chunk, out);
}

// ---------------------------------------------------------------- step04's decode kernel alone (a baseline)

extern "C" int step04_decode_attention_dev(StDtype dt, const float *q, int ldq, const void *kc, const void *vc,
                                           const int *rows, const int *lens, const int *bases, int n, int max_len, int H,
                                           int KV, int hd, void *out, float *part_o, float *part_ml, size_t part_cap) {
    AttnCtx a = {};
    a.dt = dt, a.H = H, a.KV = KV, a.hd = hd, a.vec_attn = 1;
    a.small_ok = (H / KV) <= ATTN_MAXG && hd <= 32 * ATTN_MAXE;
    a.part_o = part_o, a.part_ml = part_ml, a.part_cap = part_cap;
    const int nsplit = (max_len + ATTN_CHUNK - 1) / ATTN_CHUNK;
    if (!a.small_ok || n < 1 || part_cap < (size_t)H * (nsplit < 1 ? 1 : nsplit) * hd) return -1;
    AttnPlan p = {};
    p.ns = n, p.nsplit = nsplit, p.maxlen = max_len;
    return attn_layer(&a, &p, rows, lens, bases, q, ldq, NULL, kc, vc, out, 0, 0, 0);
}

// ---------------------------------------------------------------- step05's long-chunk attention alone (its ladder)

struct LongAttnBench {
    AttnCtx ac;
    AttnPlan plan;
    int ntiles;
    const float *q;
    int ldq;
    const void *kc, *vc;
    void *q16, *out;
    int *d_tiles;
};

extern "C" LongAttnBench *long_attn_bench_new(StDtype dt, int H, int KV, int hd, const float *q, int ldq, const void *kc,
                                              const void *vc, const int *d_bt, int bt_stride, int block_size,
                                              const PrefillChunk *chunks, int nchunks, void *out) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0 || nchunks < 1 || block_size < 1 || H % KV) return NULL;
    const int nt = paged_prefill_num_tiles(chunks, nchunks, H, KV);
    if (nt < 1) return NULL;
    LongAttnBench *b = (LongAttnBench *)xcalloc(1, sizeof(LongAttnBench));
    const size_t es = esize(dt), qd = (size_t)H * hd, kd = (size_t)KV * hd;
    int T = 0, maxL = 1, maxn = 1;
    for (int i = 0; i < nchunks; i++) {
        const PrefillChunk *c = &chunks[i];
        T = c->row0 + c->n > T ? c->row0 + c->n : T;
        maxL = c->L > maxL ? c->L : maxL, maxn = c->n > maxn ? c->n : maxn;
    }
    AttnCtx *a = &b->ac;
    CUBLAS_CHECK(cublasCreate(&a->blas));
    a->dt = dt, a->H = H, a->KV = KV, a->hd = hd, a->vec_attn = 1, a->small_ok = 1;
    a->block_size = block_size, a->bt_stride = bt_stride, a->num_sms = gi.sms, a->d_bt = d_bt;
    a->s_cap = (size_t)H * maxn * maxL;
    const size_t s_es = 4 + (dt == ST_F32 ? 0 : es);
    if (a->s_cap * s_es > SCORE_BUDGET) a->s_cap = SCORE_BUDGET / s_es;
    if (a->s_cap < (size_t)H * maxL) a->s_cap = (size_t)H * maxL;
    a->S = (float *)dalloc_r(a->s_cap * 4, NULL);
    a->P = dt == ST_F32 ? (void *)a->S : dalloc_r(a->s_cap * es, NULL);
    a->gk = dalloc_r((size_t)maxL * kd * es, NULL), a->gv = dalloc_r((size_t)maxL * kd * es, NULL);
    AttnPlan *p = &b->plan;
    p->lg = (LongItem *)xmalloc((size_t)nchunks * sizeof(LongItem));
    for (int i = 0; i < nchunks; i++) p->lg[i] = LongItem{chunks[i].row0, chunks[i].n, chunks[i].L, chunks[i].seq};
    p->nlg = nchunks;
    int *tiles = (int *)xmalloc((size_t)nt * PP_TILE_INTS * sizeof(int));
    if (paged_prefill_plan(chunks, nchunks, H, KV, tiles, nt) != nt) die("long_attn_bench_new: the tile plan failed");
    b->d_tiles = (int *)dalloc_r((size_t)nt * PP_TILE_INTS * 4, NULL);
    CUDA_CHECK(cudaMemcpy(b->d_tiles, tiles, (size_t)nt * PP_TILE_INTS * 4, cudaMemcpyHostToDevice));
    free(tiles);
    a->d_tiles = b->d_tiles, b->ntiles = nt;
    // the GEMM path's query copy in dt, (T, H*hd): as the runner's q16
    b->q16 = dalloc_r((size_t)T * qd * es, NULL);
    float *tmp = (float *)dalloc_r((size_t)T * qd * 4, NULL);
    CUDA_CHECK(cudaMemcpy2D(tmp, qd * 4, q, (size_t)ldq * 4, qd * 4, (size_t)T, cudaMemcpyDeviceToDevice));
    DISPATCH(dt, A, k_round_rows<A><<<256, 256>>>(tmp, (A *)b->q16, (size_t)T * qd));
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFree(tmp));
    b->q = q, b->ldq = ldq, b->kc = kc, b->vc = vc, b->out = out;
    return b;
}

extern "C" int long_attn_bench_run(LongAttnBench *b, int fused) {
    if (fused && !paged_prefill_supported(b->ac.dt, b->ac.H, b->ac.KV, b->ac.hd)) return -1;
    b->plan.ntiles = fused ? b->ntiles : 0;
    return attn_layer(&b->ac, &b->plan, NULL, NULL, NULL, b->q, b->ldq, b->q16, b->kc, b->vc, b->out, 0, 0, 0);
}

extern "C" void long_attn_bench_free(LongAttnBench *b) {
    if (!b) return;
    CUDA_CHECK(cudaDeviceSynchronize());
    void *ps[] = {b->ac.S, b->ac.gk, b->ac.gv, b->d_tiles, b->q16};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) CUDA_CHECK(cudaFree(ps[i]));
    if (b->ac.P != b->ac.S) CUDA_CHECK(cudaFree(b->ac.P));
    CUBLAS_CHECK(cublasDestroy(b->ac.blas));
    free(b->plan.lg);
    free(b);
}
