// decode_gpu.cu — one decode step on CUDA: bf16 GEMVs, a decode-attention kernel over the KV
// cache, the whole step captured in a CUDA graph (see kvcache.h).
//
// Why these kernels: at batch 1 every projection is a matrix-VECTOR product. Each weight is
// read once and used for one multiply-add, so the step is bound by how fast the weights stream
// from HBM (2 bytes per 2 FLOPs in bf16), not by the tensor cores. cuBLAS at M = 1 moved
// ~1.3 TB/s on the H200 (step01's batch scan); k_gemv below is written for the stream:
//   - one warp per R = 2 rows; each lane loads 16 bytes (8 bf16) of each row per iteration,
//     so a warp reads 512 contiguous bytes per row per load instruction (coalesced);
//   - U = 4 iterations' loads are issued before any is used (8 independent 16-byte loads in
//     flight per lane) to cover HBM latency; x (fp32) comes through the read-only L1 path;
//   - fp32 accumulation, a warp-shuffle reduction at the end, lane 0 writes (+ bias, + y for
//     the residual add), so o_proj and down_proj add into the residual stream directly;
//   - 8 warps per block, rows/16 blocks: 256 blocks for a 4096-row matrix, all resident.
// q/k/v and gate/up are concatenated at load (step02), so a layer has 4 GEMVs.
//
// Decode attention (one query per head over len cached positions), split over the keys so that
// enough blocks run (flash-decoding's idea, done simply; step07 refines it):
//   k_attn_split   grid (KV, ceil(max_seq/128)); block b handles keys [128b, 128b+128) for the
//                  g = H/KV query heads that share kv head blockIdx.x (each K/V row read once):
//                  scores -> local max m and sum l -> unnormalized o = sum_j exp(s_j - m) v_j
//   k_attn_combine grid (H): out = sum_b exp(m_b - M) o_b / sum_b exp(m_b - M) l_b
// Blocks past the current length exit at once, so the grid is fixed and the graph replayable.
//
// That is this step's own decode step (gpu_decoder_set_fused(0)); by default the graph holds
// step07's fused step instead (decode_enqueue_fused, step07_kernels/decode_fused.cuh).
//
// The step's kernels read the token id and its position from device memory (d_tok, d_pos) and
// the last kernel advances them (argmax -> d_tok, pos + 1), so the same graph is replayed for
// every token; the host only overrides d_tok when it samples.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_check.h"
#include "gpu.h"
#include "decode_gpu.cuh"
#include "kvcache.h"
#include "step02_attention/forward_gpu.cuh"
#include "step07_kernels/decode_fused.cuh"  // the fused step (gpu_decoder_set_fused)

// ---------------------------------------------------------------- GEMV
#define GEMV_WARPS 8  // warps per block

// y (rows) [+]= W (rows, n_in) x (n_in) + b. accumulate: y += (the residual add).
// Vector path when n_in % N == 0 (every row then starts 16-byte aligned); else a scalar loop.
// R rows per warp; U 16-byte chunks per lane per row issued before the first is used.
template <class W, int GEMV_R, int GEMV_U>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(const W *__restrict__ Wm, const float *__restrict__ x, const float *__restrict__ b, float *y, int rows,
           int n_in, int accumulate) {
    constexpr int N = Vec16<W>::N;
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + threadIdx.x / 32) * GEMV_R;
    if (row0 >= rows) return;
    const W *wr[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) wr[r] = Wm + (size_t)min(row0 + r, rows - 1) * n_in;  // clamp: read, not written
    float acc[GEMV_R] = {};
    if (n_in % N == 0) {
        const int nv = n_in / N;  // 16-byte chunks per row
        int c = lane;
        for (; c + 32 * (GEMV_U - 1) < nv; c += 32 * GEMV_U) {
            uint4 w[GEMV_U][GEMV_R];
#pragma unroll
            for (int u = 0; u < GEMV_U; u++)
#pragma unroll
                for (int r = 0; r < GEMV_R; r++) w[u][r] = __ldcs((const uint4 *)wr[r] + c + 32 * u);  // streamed once
#pragma unroll
            for (int u = 0; u < GEMV_U; u++) {
                float xf[N];
#pragma unroll
                for (int i = 0; i < N; i += 4) {
                    const float4 t = __ldg((const float4 *)(x + (size_t)(c + 32 * u) * N + i));
                    xf[i] = t.x, xf[i + 1] = t.y, xf[i + 2] = t.z, xf[i + 3] = t.w;
                }
#pragma unroll
                for (int r = 0; r < GEMV_R; r++) {
                    float wf[N];
                    Vec16<W>::unpack(w[u][r], wf);
#pragma unroll
                    for (int i = 0; i < N; i++) acc[r] = fmaf(wf[i], xf[i], acc[r]);
                }
            }
        }
        for (; c < nv; c += 32) {  // the tail: fewer than U chunks per lane left
            float xf[N];
#pragma unroll
            for (int i = 0; i < N; i += 4) {
                const float4 t = __ldg((const float4 *)(x + (size_t)c * N + i));
                xf[i] = t.x, xf[i + 1] = t.y, xf[i + 2] = t.z, xf[i + 3] = t.w;
            }
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) {
                float wf[N];
                Vec16<W>::unpack(__ldcs((const uint4 *)wr[r] + c), wf);
#pragma unroll
                for (int i = 0; i < N; i++) acc[r] = fmaf(wf[i], xf[i], acc[r]);
            }
        }
    } else {
        for (int i = lane; i < n_in; i += 32) {
            const float xi = x[i];
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) acc[r] = fmaf(tof(wr[r][i]), xi, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
        float v = acc[r];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        const int row = row0 + r;
        if (lane == 0 && row < rows) y[row] = v + (b ? b[row] : 0.0f) + (accumulate ? y[row] : 0.0f);
    }
}

// The GEMV ladder: the only list of versions (kv_bench times each; the decoder uses g_gemv_version).
//   v1 r2u4: 2 rows per warp, 4 chunks in flight per row (8 loads per lane)   — the first version
//   v2 r1u8: 1 row per warp, 8 chunks in flight: twice the warps for the same rows, so narrow
//            matrices (o_proj 4096 rows, down_proj) spread over more of the 132 SMs
//   v3 r1u4: 1 row per warp, 4 chunks in flight
//   v4 r4u2: 4 rows per warp, 2 chunks each (x reused 4 times from registers)
typedef struct {
    const char *name;
    int R, U;
} GemvVersion;
static const GemvVersion GEMV_VERSIONS[] = {{"v1_r2u4", 2, 4}, {"v2_r1u8", 1, 8}, {"v3_r1u4", 1, 4}, {"v4_r4u2", 4, 2}};
#define N_GEMV_VERSIONS 4
static int g_gemv_version = 1;  // v2

template <class A, int R, int U>
static void gemv_launch(const void *W, const float *x, const float *b, float *y, int rows, int n_in, int acc,
                        cudaStream_t s) {
    const int per_block = GEMV_WARPS * R;
    k_gemv<A, R, U><<<(rows + per_block - 1) / per_block, GEMV_WARPS * 32, 0, s>>>((const A *)W, x, b, y, rows, n_in, acc);
}

static void gemv_v(int ver, StDtype dt, const void *W, const float *x, const float *b, float *y, int rows, int n_in,
                   int acc, cudaStream_t s) {
    switch (ver) {
    case 0: DISPATCH(dt, A, gemv_launch<A, 2, 4>(W, x, b, y, rows, n_in, acc, s)); break;
    case 1: DISPATCH(dt, A, gemv_launch<A, 1, 8>(W, x, b, y, rows, n_in, acc, s)); break;
    case 2: DISPATCH(dt, A, gemv_launch<A, 1, 4>(W, x, b, y, rows, n_in, acc, s)); break;
    default: DISPATCH(dt, A, gemv_launch<A, 4, 2>(W, x, b, y, rows, n_in, acc, s)); break;
    }
    CUDA_CHECK_LAST();
}
static void gemv(StDtype dt, const void *W, const float *x, const float *b, float *y, int rows, int n_in, int acc,
                 cudaStream_t s) {
    gemv_v(g_gemv_version, dt, W, x, b, y, rows, n_in, acc, s);
}

void proj_gemv(StDtype dt, const GpuQProj *q, const void *W, const float *x, const float *b, float *y, int rows,
               int n_in, int acc, cudaStream_t s) {
    if (q->n == 0) {
        gemv(dt, W, x, b, y, rows, n_in, acc, s);
        return;
    }
    int off = 0;
    for (int i = 0; i < q->n; i++) {  // part i: outputs off .. off + rows[i] - 1 (and their bias)
        if (qlinear_gpu_gemv(q->part[i], x, b ? b + off : NULL, y + off, acc, s) != 0)
            die("qlinear_gpu_gemv failed (%s)", qlinear_gpu_describe(q->part[i]));
        off += q->rows[i];
    }
}

extern "C" int gemv_n_versions(void) { return N_GEMV_VERSIONS; }
extern "C" const char *gemv_version_name(int v) { return v >= 0 && v < N_GEMV_VERSIONS ? GEMV_VERSIONS[v].name : "?"; }
extern "C" void gemv_set_version(int v) {
    if (v >= 0 && v < N_GEMV_VERSIONS) g_gemv_version = v;
}

// ---------------------------------------------------------------- rope + cache append
// One block (32 threads) per head of the new token's qkv row (fp32, (H + 2KV) * hd):
// q heads: (q_norm) + rope, written back in place; k heads: (k_norm) + rope, written to the
// cache row *pos in the cache dtype; v heads: copied to the cache. inv_freq (hd/2) is the CPU
// reference's table; the angle is the same fp32 product pos * inv_freq, cos/sin in double.
template <class C>
__global__ void k_rope_append(float *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                              const int *d_pos, int H, int KV, int hd, float eps, C *kc, C *vc) {
    const int h = blockIdx.x, lane = threadIdx.x, half = hd / 2;
    const int pos = *d_pos;
    float *x = qkv + (size_t)h * hd;
    const int is_q = h < H, is_k = !is_q && h < H + KV;
    const float *nw = is_q ? q_norm : is_k ? k_norm : NULL;
    const float inv = nw ? head_rms_inv(x, hd, eps) : 1.0f;
    if (is_q || is_k) {
        C *dst = is_k ? kc + (size_t)pos * KV * hd + (size_t)(h - H) * hd : NULL;
        for (int i = lane; i < half; i += 32) {
            float x1 = x[i] * inv, x2 = x[i + half] * inv;
            if (nw) x1 *= nw[i], x2 *= nw[i + half];
            const float ang = (float)pos * inv_freq[i];
            const float c = (float)cos((double)ang), s = (float)sin((double)ang);
            const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
            if (is_q) x[i] = y1, x[i + half] = y2;
            else dst[i] = fromf<C>(y1), dst[i + half] = fromf<C>(y2);
        }
    } else {
        C *dst = vc + (size_t)pos * KV * hd + (size_t)(h - H - KV) * hd;
        for (int e = lane; e < hd; e += 32) dst[e] = fromf<C>(x[e]);
    }
}

// ---------------------------------------------------------------- decode attention
// The kernels' bodies are in decode_gpu.cuh (step04 runs them per row of a flat batch); here
// the length of the one sequence comes from device memory: len = *d_pos + len_add.
template <class C>
__global__ void __launch_bounds__(ATTN_CHUNK)
    k_attn_split(const float *q, const C *kc, const C *vc, const int *d_pos, int len_add, int H, int KV, int hd,
                 float scale, float *part_o, float *part_ml) {
    attn_split_block<C>(q, kc, vc, *d_pos + len_add, H, KV, hd, scale, part_o, part_ml, blockIdx.x, blockIdx.y, gridDim.y);
}

// out (H*hd) fp32 from the splits that hold keys (ceil(len / ATTN_CHUNK) of them). Grid (H).
__global__ void k_attn_combine(const float *part_o, const float *part_ml, const int *d_pos, int len_add, int nsplit,
                               int hd, float *out) {
    const int h = blockIdx.x;
    attn_combine_heads<float>(part_o + (size_t)h * nsplit * hd, part_ml + (size_t)h * nsplit * 2, nsplit, 1,
                              *d_pos + len_add, hd, out + (size_t)h * hd);
}

// ---------------------------------------------------------------- small kernels
// silu(gate) * up, fp32 in and out: gu (2*ff) = gate | up
__global__ void k_swiglu_f32(const float *gu, float *h, int ff) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < ff; i += gridDim.x * blockDim.x) {
        const float gt = gu[i];
        h[i] = gt / (1.0f + expf(-gt)) * gu[ff + i];
    }
}

// argmax of logits (vocab) -> *d_tok (the next token), out_ids[*d_pos] = it, then pos += 1.
// One block of 1024 threads; ties: the lower id (as argmax_f32).
__global__ void k_argmax_advance(const float *logits, int vocab, int *d_tok, int *d_pos, int *out_ids) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) argmax_pair(best, bi, logits[i], i);
    block_argmax(best, bi);
    if (threadIdx.x == 0) {
        const int p = *d_pos;
        out_ids[p] = bi;
        *d_tok = bi;
        *d_pos = p + 1;
    }
}

// ---------------------------------------------------------------- the decoder
struct GpuDecoder {
    GpuModel *g;
    int max_seq, len, nsplit;
    StDtype cdt;              // cache dtype = weight dtype
    void *kc, *vc;            // (n_layers, max_seq, KV*hd) each
    double kv_bytes;          // measured: device memory the two allocations took
    float *x, *qkv, *att, *gu, *h, *xn, *logits;  // (d) (H*hd+2KV*hd) (H*hd) (2ff) (ff) (d) (vocab)
    float *part_o, *part_ml;  // (H, nsplit, hd) (H, nsplit, 2)
    float *inv_freq;          // (hd/2)
    float *cos_t, *sin_t;     // (max_seq, hd/2): the fused step's RoPE table
    int *count;               // (KV) the fused attention's finished splits per kv head
    float *arg_v;             // (1024) the fused argmax's per-block maxima,
    int *arg_i, *arg_count;   // (1024) their indices, (1) its finished blocks
    int cc_major;             // the device's compute capability (attention v4 needs sm_80)
    int *d_tok, *d_pos, *d_out;  // token id, position, argmax per position (max_seq)
    int kernels;              // kernel nodes in the graph
    int lm_argmax;            // 1: the argmax runs inside the lm_head GEMV (k_gemv_rows)
    unsigned int *chain_bar;  // (1) the fused step's k_qtmc grid barrier (qlinear_gpu_gemv_chain)
    cudaStream_t stream;
    cudaGraphExec_t graph;
};

// Which decode step gpu_decoder_new captures: 0 step03's own (10 kernels a layer), 1 step07's
// fusions (5 a layer), 2 the same with programmatic dependent launch on sm_90 (the default).
static int g_decode_fused = 2;
static const char *const FUSED_NAMES[] = {"unfused", "fused", "fused_pdl"};
// The fused step's attention: 1 k_attn_fused (4 warps a block), 2 k_attn_fused2 (the short chain,
// 8-16 warps a block, only the rounds that hold keys), 4 k_attn_mma (the default: the scores and
// P V on the tensor cores, for a bf16 cache of head_dim 64 or 128 on sm_80+; elsewhere version 2
// runs). All three: step07_kernels/decode_fused.cuh.
static int g_decode_attn = 4;

// Enqueue one decode step on d->stream (what the graph holds).
static void decode_enqueue(GpuDecoder *d) {
    GpuModel *g = d->g;
    const ModelConfig *c = &g->cfg;
    const int dm = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, ff = c->intermediate;
    const int qd = H * hd, kd = KV * hd, nqkv = qd + 2 * kd, gq = H / KV;
    const StDtype dt = g->wdt;
    const float eps = c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    const size_t es = esize(d->cdt), lstride = (size_t)d->max_seq * kd * es;
    const size_t attn_smem = attn_smem_bytes(gq, hd);
    cudaStream_t s = d->stream;
    DISPATCH(dt, A, k_embed<A><<<1, 256, 0, s>>>((const A *)g->embed, d->d_tok, dm, d->x));
    CUDA_CHECK_LAST();
    for (int l = 0; l < c->n_layers; l++) {
        const GpuLayer *L = &g->layers[l];
        void *kc = (char *)d->kc + l * lstride, *vc = (char *)d->vc + l * lstride;
        k_rmsnorm<float><<<1, 1024, 0, s>>>(d->x, L->attn_norm, dm, 1, dm, eps, d->xn);
        CUDA_CHECK_LAST();
        proj_gemv(dt, &L->qqkv, L->wqkv, d->xn, L->bqkv, d->qkv, nqkv, dm, 0, s);
        DISPATCH(d->cdt, C, k_rope_append<C><<<H + 2 * KV, 32, 0, s>>>(d->qkv, L->q_norm, L->k_norm, d->inv_freq,
                                                                        d->d_pos, H, KV, hd, eps, (C *)kc, (C *)vc));
        CUDA_CHECK_LAST();
        DISPATCH(d->cdt, C,
                 k_attn_split<C><<<dim3(KV, d->nsplit), ATTN_CHUNK, attn_smem, s>>>(
                     d->qkv, (const C *)kc, (const C *)vc, d->d_pos, 1, H, KV, hd, scale, d->part_o, d->part_ml));
        CUDA_CHECK_LAST();
        k_attn_combine<<<H, hd < 32 ? 32 : (hd > 256 ? 256 : hd), 0, s>>>(d->part_o, d->part_ml, d->d_pos, 1,
                                                                          d->nsplit, hd, d->att);
        CUDA_CHECK_LAST();
        proj_gemv(dt, &L->qo, L->wo, d->att, L->bo, d->x, dm, qd, 1, s);  // x += att Wo^T
        k_rmsnorm<float><<<1, 1024, 0, s>>>(d->x, L->mlp_norm, dm, 1, dm, eps, d->xn);
        CUDA_CHECK_LAST();
        proj_gemv(dt, &L->qgu, L->wgu, d->xn, NULL, d->gu, 2 * ff, dm, 0, s);
        k_swiglu_f32<<<(ff + 255) / 256, 256, 0, s>>>(d->gu, d->h, ff);
        CUDA_CHECK_LAST();
        proj_gemv(dt, &L->qdown, L->wdown, d->h, NULL, d->x, dm, ff, 1, s);  // x += h Wdown^T
    }
    k_rmsnorm<float><<<1, 1024, 0, s>>>(d->x, g->final_norm, dm, 1, dm, eps, d->xn);
    CUDA_CHECK_LAST();
    proj_gemv(dt, &g->qlm, g->lm_head, d->xn, NULL, d->logits, c->vocab, dm, 0, s);
    k_argmax_advance<<<1, 1024, 0, s>>>(d->logits, c->vocab, d->d_tok, d->d_pos, d->d_out);
    CUDA_CHECK_LAST();
}

// The fused attention for this cache dtype, head_dim and group: the vectorized core where
// hd = LPR * N (LPR a power of two, 2..32), else the scalar one; G the smallest of 1, 2, 4, 8 >= g.
template <class C, int G>
static void attn_fused_g(int pdl, dim3 grid, size_t smem, cudaStream_t s, const float *qkv, const GpuLayer *L,
                         const GpuDecoder *d, int H, int KV, int hd, float eps, float scale, C *kc, C *vc) {
    constexpr int N = Vec16<C>::N;
    const int lpr = hd % N ? 0 : hd / N;
    if constexpr (std::is_same<C, __nv_bfloat16>::value) {
        if (g_decode_attn == 4 && d->cc_major >= 8 && (hd == 64 || hd == 128)) {
#define ATTN_MMA(HDV)                                                                                                    \
    pdl_launch(pdl, k_attn_mma<HDV, G>, grid, dim3(ATTN4_WARPS * 32), attn4_smem_bytes<HDV, G>(), s, qkv,             \
               (const float *)L->q_norm, (const float *)L->k_norm, (const float *)d->cos_t, (const float *)d->sin_t, \
               (const int *)d->d_pos, H, KV, eps, scale, kc, vc, d->part_o, d->part_ml, d->count, d->att)
            if (hd == 64) ATTN_MMA(64);
            else ATTN_MMA(128);
#undef ATTN_MMA
            return;
        }
    }
#define ATTN_FUSED(P)                                                                                                     pdl_launch(pdl, k_attn_fused<C, P, G>, grid, dim3(ATTN_CHUNK), smem, s, qkv, (const float *)L->q_norm,                            (const float *)L->k_norm, (const float *)d->cos_t, (const float *)d->sin_t, (const int *)d->d_pos, H, KV,                hd, eps, scale, kc, vc, d->part_o, d->part_ml, d->count, d->att)
    // version 2 (k_attn_fused2) where the vectorized core runs and its shared memory fits in 48 KB
#define ATTN_FUSED2(P)                                                                                                    \
    do {                                                                                                                  \
        using S2 = Attn2Shape<C, P, G>;                                                                                   \
        const size_t smem2 = attn2_smem_bytes(H / KV, hd, S2::NW);                                                        \
        if (g_decode_attn == 2 && smem2 <= 48 * 1024) {                                                                   \
            pdl_launch(pdl, k_attn_fused2<C, P, G>, grid, dim3(S2::NW * 32), smem2, s, qkv, (const float *)L->q_norm,     \
                       (const float *)L->k_norm, (const float *)d->cos_t, (const float *)d->sin_t, (const int *)d->d_pos, \
                       H, KV, hd, eps, scale, kc, vc, d->part_o, d->part_ml, d->count, d->att, (const int *)NULL, 0,  \
                       (const int *)NULL);                                                                                \
        } else {                                                                                                          \
            ATTN_FUSED(P);                                                                                                \
        }                                                                                                                 \
    } while (0)
    switch (lpr) {
    case 2: ATTN_FUSED2(2); break;
    case 4: ATTN_FUSED2(4); break;
    case 8: ATTN_FUSED2(8); break;
    case 16: ATTN_FUSED2(16); break;
    case 32: ATTN_FUSED2(32); break;
    default: ATTN_FUSED(0); break;
    }
#undef ATTN_FUSED2
#undef ATTN_FUSED
}
template <class C>
static void attn_fused(int pdl, dim3 grid, size_t smem, cudaStream_t s, const float *qkv, const GpuLayer *L,
                       const GpuDecoder *d, int H, int KV, int hd, float eps, float scale, C *kc, C *vc) {
    const int g = H / KV;
    if (g <= 1) attn_fused_g<C, 1>(pdl, grid, smem, s, qkv, L, d, H, KV, hd, eps, scale, kc, vc);
    else if (g <= 2) attn_fused_g<C, 2>(pdl, grid, smem, s, qkv, L, d, H, KV, hd, eps, scale, kc, vc);
    else if (g <= 4) attn_fused_g<C, 4>(pdl, grid, smem, s, qkv, L, d, H, KV, hd, eps, scale, kc, vc);
    else attn_fused_g<C, ATTN_MAXG>(pdl, grid, smem, s, qkv, L, d, H, KV, hd, eps, scale, kc, vc);
}

// The fused step (step07_kernels/decode_fused.cuh): 5 kernels a layer where the projections are
// dense. A quantized projection (step06) is one kernel too where its GEMV rung folds the RMSNorm
// and SwiGLU in (qlinear_gpu_gemv_fused: v12+ on sm_90a); otherwise it runs as in the unfused
// step, its RMSNorm or SwiGLU as a kernel of its own.
static void decode_enqueue_fused(GpuDecoder *d, int pdl) {
    GpuModel *g = d->g;
    const ModelConfig *c = &g->cfg;
    const int dm = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, ff = c->intermediate;
    const int qd = H * hd, kd = KV * hd, nqkv = qd + 2 * kd, gq = H / KV;
    const StDtype dt = g->wdt;
    const float eps = c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    const size_t es = esize(d->cdt), lstride = (size_t)d->max_seq * kd * es;
    const size_t attn_smem = attn_smem_bytes(gq, hd);
    cudaStream_t s = d->stream;
    // y [+]= W rmsnorm(x, nw) (+ b) when nw != NULL, else y [+]= W in (+ b) (decode_fused.cuh)
    auto proj = [&](const GpuQProj *q, const void *W, const float *nw, const float *in, const float *b, float *y,
                    int rows, int n_in, int acc) {
        fused_proj(pdl, s, dt, q, W, d->x, nw, eps, in, b, y, rows, n_in, acc, 0, d->xn, d->gu);
    };
    DISPATCH(dt, A, k_embed<A><<<1, 256, 0, s>>>((const A *)g->embed, d->d_tok, dm, d->x));
    CUDA_CHECK_LAST();
    // step06's chain kernel (k_qtmc): where every projection is one INT4 layer it takes, the four
    // between two attentions (o, gate|up, down, the next layer's q|k|v; the last layer's lm_head
    // when it is quantized) run as one kernel whose weights stream without a gap between layers
    auto qone = [](const GpuQProj *p) -> const QLinearGpu * { return p->n == 1 ? p->part[0] : NULL; };
    bool qkv_done = false, lm_done = false;
    // For measuring only: DECODE_SKIP=mask leaves kernels out of the step (1 q|k|v, 2 the attention,
    // 4 o, 8 gate|up, 16 down_proj), so that the step's time without them says what each costs where
    // it overlaps its neighbours; the step's output is then wrong (read once)
    static int skip = -1;
    if (skip < 0) skip = getenv("DECODE_SKIP") ? atoi(getenv("DECODE_SKIP")) : 0;
    for (int l = 0; l < c->n_layers; l++) {
        const GpuLayer *L = &g->layers[l];
        void *kc = (char *)d->kc + l * lstride, *vc = (char *)d->vc + l * lstride;
        if (!qkv_done && !(skip & 1)) proj(&L->qqkv, L->wqkv, L->attn_norm, NULL, L->bqkv, d->qkv, nqkv, dm, 0);
        qkv_done = false;
        if (!(skip & 2)) {
            DISPATCH(d->cdt, C, attn_fused<C>(pdl, dim3(KV, d->nsplit), attn_smem, s, d->qkv, L, d, H, KV, hd, eps,
                                              scale, (C *)kc, (C *)vc));
        }
        if (d->chain_bar) {
            const bool last = l + 1 == c->n_layers;
            const GpuLayer *N = last ? NULL : &g->layers[l + 1];
            QChainPhase ph[4] = {{qone(&L->qo), d->att, NULL, L->bo, d->x, 1, 0},
                                 {qone(&L->qgu), d->x, L->mlp_norm, NULL, d->h, 0, ff},
                                 {qone(&L->qdown), d->h, NULL, NULL, d->x, 1, 0},
                                 {NULL, d->x, NULL, NULL, NULL, 0, 0}};
            if (N) ph[3].q = qone(&N->qqkv), ph[3].nw = N->attn_norm, ph[3].bias = N->bqkv, ph[3].y = d->qkv;
            else if (g->qlm.n == 1) ph[3].q = qone(&g->qlm), ph[3].nw = g->final_norm, ph[3].y = d->logits;
            const int n = ph[3].q ? 4 : 3;
            static int most = -1;  // QLINEAR_CHAIN_PH: at most that many layers a kernel (for measuring)
            if (most < 0) {
                const char *e = getenv("QLINEAR_CHAIN_PH");
                most = e && atoi(e) >= 1 && atoi(e) <= 4 ? atoi(e) : 4;
            }
            if (ph[0].q && ph[1].q && ph[2].q && qlinear_gpu_gemv_chain_ok(ph, n)) {
                for (int i0 = 0; i0 < n; i0 += most)  // (the parts of a chain that runs run too)
                    if (qlinear_gpu_gemv_chain(ph + i0, n - i0 < most ? n - i0 : most, eps, d->chain_bar, pdl, s) != 1)
                        die("qlinear_gpu_gemv_chain failed (layer %d)", l);
                qkv_done = n == 4 && !last, lm_done = n == 4 && last;
                continue;
            }
        }
        if (!(skip & 4)) proj(&L->qo, L->wo, NULL, d->att, L->bo, d->x, dm, qd, 1);  // x += att Wo^T
        // h = swiglu(Wgu rmsnorm(x)): one kernel where the projection allows
        if (!(skip & 8))
            fused_proj(pdl, s, dt, &L->qgu, L->wgu, d->x, L->mlp_norm, eps, NULL, NULL, d->h, ff, dm, 0, 1, d->xn, d->gu);
        if (!(skip & 16)) proj(&L->qdown, L->wdown, NULL, d->h, NULL, d->x, dm, ff, 1);  // x += h Wdown^T
    }
    // the lm_head with the argmax in it where the row loop takes it (a small model's), else the two
    const ArgmaxOut am = {d->arg_v, d->arg_i, d->arg_count, d->d_tok, d->d_pos, d->d_out};
    int fused_argmax = 0;
    if (g->qlm.n == 0)
        DISPATCH(dt, A, fused_argmax = gemv_rows_launch<A, true>(pdl, s, (const A *)g->lm_head, (const float *)d->x,
                                                                   (const float *)g->final_norm, eps, (const float *)NULL,
                                                                   d->logits, c->vocab, dm, 0, &am));
    d->lm_argmax = fused_argmax;
    if (fused_argmax) return;
    if (!lm_done) proj(&g->qlm, g->lm_head, g->final_norm, NULL, NULL, d->logits, c->vocab, dm, 0);  // dense or quantized
    const int ablocks = (c->vocab + 1023) / 1024 < 1024 ? (c->vocab + 1023) / 1024 : 1024;
    pdl_launch(pdl, k_argmax_fused, dim3(ablocks), dim3(1024), 0, s, (const float *)d->logits, c->vocab, d->arg_v,
               d->arg_i, d->arg_count, d->d_tok, d->d_pos, d->d_out);
}

static void *dmalloc(size_t n) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, n));
    return p;
}

extern "C" GpuDecoder *gpu_decoder_new(GpuModel *g, int max_seq, char *err, int errlen) {
    const ModelConfig *c = &g->cfg;
    const int H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, gq = H / KV;
    if (gq > ATTN_MAXG || hd > 32 * ATTN_MAXE || H % KV) {
        snprintf(err, (size_t)errlen, "decode attention supports H/KV <= %d and head_dim <= %d; this model has %d/%d, %d",
                 ATTN_MAXG, 32 * ATTN_MAXE, H, KV, hd);
        return NULL;
    }
    if (max_seq < 1) {
        snprintf(err, (size_t)errlen, "max_seq = %d", max_seq);
        return NULL;
    }
    GpuDecoder *d = (GpuDecoder *)xcalloc(1, sizeof(GpuDecoder));
    d->g = g;
    d->max_seq = max_seq;
    d->cdt = g->wdt;
    d->nsplit = (max_seq + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const size_t kvn = (size_t)c->n_layers * max_seq * KV * hd * esize(d->cdt);
    CUDA_CHECK(cudaDeviceSynchronize());
    size_t f0, f1, tot;
    CUDA_CHECK(cudaMemGetInfo(&f0, &tot));
    d->kc = dmalloc(kvn);
    d->vc = dmalloc(kvn);
    CUDA_CHECK(cudaMemGetInfo(&f1, &tot));
    d->kv_bytes = (double)f0 - (double)f1;
    const size_t dm = c->hidden, nqkv = (size_t)(H + 2 * KV) * hd, ff = c->intermediate;
    d->x = (float *)dmalloc(dm * 4);
    d->xn = (float *)dmalloc(dm * 4);
    d->qkv = (float *)dmalloc(nqkv * 4);
    d->att = (float *)dmalloc((size_t)H * hd * 4);
    d->gu = (float *)dmalloc(2 * ff * 4);
    d->h = (float *)dmalloc(ff * 4);
    d->logits = (float *)dmalloc((size_t)c->vocab * 4);
    d->part_o = (float *)dmalloc((size_t)H * d->nsplit * hd * 4);
    d->part_ml = (float *)dmalloc((size_t)H * d->nsplit * 2 * 4);
    d->inv_freq = (float *)dmalloc((size_t)(hd / 2) * 4);
    d->d_tok = (int *)dmalloc(4);
    d->d_pos = (int *)dmalloc(4);
    d->d_out = (int *)dmalloc((size_t)(max_seq + 1) * 4);
    float *inv = (float *)xmalloc((size_t)(hd / 2) * 4);
    rope_inv_freq(c, inv);
    CUDA_CHECK(cudaMemcpy(d->inv_freq, inv, (size_t)(hd / 2) * 4, cudaMemcpyHostToDevice));
    free(inv);
    const int fused = g_decode_fused;  // the fused step's buffers: its RoPE table, counters, argmax partials
    if (fused) {
        d->cos_t = (float *)dmalloc((size_t)max_seq * (hd / 2) * 4);
        d->sin_t = (float *)dmalloc((size_t)max_seq * (hd / 2) * 4);
        k_rope_table<<<grid_for((size_t)max_seq * (hd / 2), 256), 256>>>(d->inv_freq, max_seq, hd / 2, d->cos_t, d->sin_t);
        CUDA_CHECK_LAST();
        d->count = (int *)dmalloc((size_t)KV * 4);
        CUDA_CHECK(cudaMemset(d->count, 0, (size_t)KV * 4));
        d->arg_v = (float *)dmalloc(1024 * 4);
        d->arg_i = (int *)dmalloc(1024 * 4);
        d->arg_count = (int *)dmalloc(4);
        CUDA_CHECK(cudaMemset(d->arg_count, 0, 4));
        d->chain_bar = (unsigned int *)dmalloc(4);
        CUDA_CHECK(cudaMemset(d->chain_bar, 0, 4));
    }
    CUDA_CHECK(cudaStreamCreate(&d->stream));
    gpu_decoder_reset(d);
    // capture the step once; every token replays it
    GpuInfo gi;
    d->cc_major = gpu_info(&gi) == 0 ? gi.cc_major : 0;
    const int pdl = fused == 2 && d->cc_major >= 9;
    cudaGraph_t gr;
    CUDA_CHECK(cudaStreamBeginCapture(d->stream, cudaStreamCaptureModeThreadLocal));
    if (fused) decode_enqueue_fused(d, pdl);
    else decode_enqueue(d);
    CUDA_CHECK(cudaStreamEndCapture(d->stream, &gr));
    size_t nn = 0;
    CUDA_CHECK(cudaGraphGetNodes(gr, NULL, &nn));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)xmalloc((nn ? nn : 1) * sizeof(cudaGraphNode_t));
    CUDA_CHECK(cudaGraphGetNodes(gr, nodes, &nn));
    for (size_t i = 0; i < nn; i++) {
        cudaGraphNodeType ty;
        CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &ty));
        d->kernels += ty == cudaGraphNodeTypeKernel;
    }
    free(nodes);
    CUDA_CHECK(cudaGraphInstantiate(&d->graph, gr, 0));
    CUDA_CHECK(cudaGraphDestroy(gr));
    return d;
}

extern "C" void gpu_decoder_free(GpuDecoder *d) {
    if (!d) return;
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
    CUDA_CHECK(cudaGraphExecDestroy(d->graph));
    void *ps[] = {d->kc, d->vc, d->x, d->xn, d->qkv, d->att, d->gu, d->h, d->logits, d->part_o, d->part_ml,
                  d->inv_freq, d->cos_t, d->sin_t, d->count, d->arg_v, d->arg_i, d->arg_count, d->chain_bar, d->d_tok, d->d_pos,
                  d->d_out};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) CUDA_CHECK(cudaFree(ps[i]));
    CUDA_CHECK(cudaStreamDestroy(d->stream));
    free(d);
}

extern "C" void gpu_decoder_reset(GpuDecoder *d) {
    d->len = 0;
    CUDA_CHECK(cudaMemsetAsync(d->d_pos, 0, 4, d->stream));
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
}

extern "C" int gpu_decoder_len(const GpuDecoder *d) { return d->len; }
extern "C" int gpu_decoder_kernels(const GpuDecoder *d) { return d->kernels; }
extern "C" int gpu_decoder_lm_argmax(const GpuDecoder *d) { return d->lm_argmax; }
extern "C" int gpu_decoder_argmax_ids(GpuDecoder *d, int p0, int n, int *out_ids) {
    if (p0 < 0 || n < 0 || p0 + n > d->len) return -1;
    CUDA_CHECK(cudaMemcpy(out_ids, d->d_out + p0, (size_t)n * 4, cudaMemcpyDeviceToHost));
    return 0;
}
extern "C" void gpu_decoder_set_fused(int mode) {
    if (mode >= 0 && mode <= 2) g_decode_fused = mode;
}
extern "C" const char *gpu_decoder_fused_name(int mode) { return mode >= 0 && mode <= 2 ? FUSED_NAMES[mode] : "?"; }
extern "C" void gpu_decoder_set_attn(int version) {
    if (version == 1 || version == 2 || version == 4) g_decode_attn = version;
}
extern "C" int gpu_decoder_get_attn(void) { return g_decode_attn; }
extern "C" void gpu_decoder_set_gemv_split(int ks) {
    if (ks == 0 || ks == 1 || ks == 2 || ks == 4) g_gemvf_split = ks;
}
extern "C" void gpu_decoder_set_gemv_rows(int mode) {
    if (mode >= 0 && mode <= 3) g_gemvf_rows = mode;
}
extern "C" void gpu_decoder_set_gemv_short(int on) { g_gemvf_short = on != 0; }
extern "C" double gpu_decoder_kv_bytes(const GpuDecoder *d) { return d->kv_bytes; }
extern "C" double gpu_decoder_kv_elem_bytes(const GpuDecoder *d) { return (double)esize(d->cdt); }

extern "C" int gpu_decoder_step(GpuDecoder *d, int id, float *logits) {
    if (id < 0 || id >= d->g->cfg.vocab) {
        fprintf(stderr, "gpu_decoder_step: token id %d is outside the vocabulary [0, %d)\n", id, d->g->cfg.vocab);
        return -1;
    }
    if (d->len >= d->max_seq) {
        fprintf(stderr, "gpu_decoder_step: the cache is full (%d positions)\n", d->max_seq);
        return -1;
    }
    CUDA_CHECK(cudaMemcpyAsync(d->d_tok, &id, 4, cudaMemcpyHostToDevice, d->stream));
    CUDA_CHECK(cudaGraphLaunch(d->graph, d->stream));
    d->len++;
    if (logits)
        CUDA_CHECK(cudaMemcpyAsync(logits, d->logits, (size_t)d->g->cfg.vocab * 4, cudaMemcpyDeviceToHost, d->stream));
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
    return 0;
}

extern "C" int gpu_decoder_greedy(GpuDecoder *d, int first_id, int n, int *out_ids, float *step_ms) {
    if (first_id < 0 || first_id >= d->g->cfg.vocab || d->len + n > d->max_seq || n < 1) {
        fprintf(stderr, "gpu_decoder_greedy: bad id %d or %d + %d steps exceed the cache (%d)\n", first_id, d->len, n,
                d->max_seq);
        return -1;
    }
    cudaEvent_t *ev = NULL;
    if (step_ms) {
        ev = (cudaEvent_t *)xmalloc((size_t)(n + 1) * sizeof(cudaEvent_t));
        for (int i = 0; i <= n; i++) CUDA_CHECK(cudaEventCreate(&ev[i]));
    }
    const int p0 = d->len;
    CUDA_CHECK(cudaMemcpyAsync(d->d_tok, &first_id, 4, cudaMemcpyHostToDevice, d->stream));
    if (ev) CUDA_CHECK(cudaEventRecord(ev[0], d->stream));
    for (int i = 0; i < n; i++) {  // no host synchronization: the argmax feeds the next replay
        CUDA_CHECK(cudaGraphLaunch(d->graph, d->stream));
        if (ev) CUDA_CHECK(cudaEventRecord(ev[i + 1], d->stream));
    }
    CUDA_CHECK(cudaMemcpyAsync(out_ids, d->d_out + p0, (size_t)n * 4, cudaMemcpyDeviceToHost, d->stream));
    CUDA_CHECK(cudaStreamSynchronize(d->stream));
    d->len += n;
    if (ev) {
        for (int i = 0; i < n; i++) CUDA_CHECK(cudaEventElapsedTime(&step_ms[i], ev[i], ev[i + 1]));
        for (int i = 0; i <= n; i++) CUDA_CHECK(cudaEventDestroy(ev[i]));
        free(ev);
    }
    return 0;
}

extern "C" int forward_last_cuda(GpuModel *g, const int *ids, int T, float *logits, double *ms) {
    ForwardTimes ft;
    if (forward_cuda(g, ids, T, NULL, ms ? &ft : NULL) != 0) return -1;
    if (logits)
        CUDA_CHECK(cudaMemcpy(logits, g->logits + (size_t)(T - 1) * g->cfg.vocab, (size_t)g->cfg.vocab * 4,
                              cudaMemcpyDeviceToHost));
    else CUDA_CHECK(cudaDeviceSynchronize());
    if (ms) *ms = ft.total_ms;
    return 0;
}

// ---------------------------------------------------------------- GEMV alone, timed
// Random-looking values from a hash of the index (never time on zeros or constants).
template <class A> __global__ void k_fill_hash(A *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = fromf<A>(((h & 0xffff) / 65536.0f - 0.5f) * 0.04f);
    }
}

typedef struct {
    int ver;
    StDtype dt;
    void **W;  // nw copies, used in turn: together far larger than L2, so every call reads HBM
    int nw, next;
    const float *x;
    float *y;
    int rows, n_in;
} GemvArgs;
static void gemv_call(void *p) {
    GemvArgs *a = (GemvArgs *)p;
    gemv_v(a->ver, a->dt, a->W[a->next], a->x, NULL, a->y, a->rows, a->n_in, 0, 0);
    a->next = (a->next + 1) % a->nw;
}

extern "C" double gemv_gpu_bench_gbps(int ver, int rows, int n_in, StDtype dt) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) return -1;
    const size_t wn = (size_t)rows * n_in, wb = wn * esize(dt);
    const int nw = (int)(wb >= ((size_t)512 << 20) ? 2 : (((size_t)512 << 20) + wb - 1) / wb);
    GemvArgs a = {ver, dt, (void **)xmalloc((size_t)nw * sizeof(void *)), nw, 0, NULL, NULL, rows, n_in};
    for (int i = 0; i < nw; i++) {
        a.W[i] = dmalloc(wb);
        DISPATCH(dt, A, k_fill_hash<A><<<1024, 256>>>((A *)a.W[i], wn, 17u + i));
        CUDA_CHECK_LAST();
    }
    float *x = (float *)dmalloc((size_t)n_in * 4), *y = (float *)dmalloc((size_t)rows * 4);
    k_fill_hash<float><<<64, 256>>>(x, (size_t)n_in, 5u);
    CUDA_CHECK_LAST();
    a.x = x, a.y = y;
    const double ms = gpu_bench(gemv_call, &a, 2 * nw, 50, 1);
    for (int i = 0; i < nw; i++) CUDA_CHECK(cudaFree(a.W[i]));
    free(a.W);
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
    return ((double)wb + 4.0 * n_in + 4.0 * rows) / ms * 1e-6;
}

// ---------------------------------------------------------------- test entry points
template <class A> __global__ void k_round(const float *in, A *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = fromf<A>(in[i]);
}

static StDtype usable_dtype(StDtype dt) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) return dt;
    return (dt == ST_BF16 && gi.cc_major < 8) ? ST_F32 : dt;  // as gpu_model_load does on sm_75
}

static void *upload_as(const float *h, size_t n, StDtype dt) {
    float *tmp = (float *)dmalloc(n * 4);
    CUDA_CHECK(cudaMemcpy(tmp, h, n * 4, cudaMemcpyHostToDevice));
    void *out = dmalloc(n * esize(dt));
    DISPATCH(dt, A, k_round<A><<<256, 256>>>(tmp, (A *)out, n));
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFree(tmp));
    return out;
}

extern "C" int gemv_gpu_check(int ver, const float *W, const float *x, const float *b, int rows, int n_in, StDtype dt,
                              float *y) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) return -1;
    dt = usable_dtype(dt);
    void *dW = upload_as(W, (size_t)rows * n_in, dt);
    float *dx = (float *)dmalloc((size_t)n_in * 4), *dy = (float *)dmalloc((size_t)rows * 4), *db = NULL;
    CUDA_CHECK(cudaMemcpy(dx, x, (size_t)n_in * 4, cudaMemcpyHostToDevice));
    if (b) {
        db = (float *)dmalloc((size_t)rows * 4);
        CUDA_CHECK(cudaMemcpy(db, b, (size_t)rows * 4, cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaMemset(dy, 0xff, (size_t)rows * 4));  // poison (NaN): every row must be written
    gemv_v(ver, dt, dW, dx, db, dy, rows, n_in, 0, 0);
    CUDA_CHECK(cudaMemcpy(y, dy, (size_t)rows * 4, cudaMemcpyDeviceToHost));
    void *ps[] = {dW, dx, dy, db};
    for (int i = 0; i < 4; i++) CUDA_CHECK(cudaFree(ps[i]));
    return 0;
}

extern "C" int decode_attention_gpu_check(const float *q, const float *kc, const float *vc, int len, int H, int KV,
                                          int hd, StDtype dt, float *out) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) return -1;
    const int gq = H / KV;
    if (gq > ATTN_MAXG || hd > 32 * ATTN_MAXE) return -1;
    dt = usable_dtype(dt);
    const size_t nk = (size_t)len * KV * hd, nq = (size_t)H * hd;
    const int nsplit = (len + ATTN_CHUNK - 1) / ATTN_CHUNK;
    void *dk = upload_as(kc, nk, dt), *dv = upload_as(vc, nk, dt);
    float *dq = (float *)dmalloc(nq * 4), *dout = (float *)dmalloc(nq * 4);
    float *po = (float *)dmalloc((size_t)H * nsplit * hd * 4), *pml = (float *)dmalloc((size_t)H * nsplit * 2 * 4);
    int *dpos = (int *)dmalloc(4);
    const int pos = len - 1;
    CUDA_CHECK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dq, q, nq * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dout, 0xff, nq * 4));
    const size_t smem = attn_smem_bytes(gq, hd);
    DISPATCH(dt, C,
             k_attn_split<C><<<dim3(KV, nsplit), ATTN_CHUNK, smem>>>(dq, (const C *)dk, (const C *)dv, dpos, 1, H, KV,
                                                                     hd, 1.0f / sqrtf((float)hd), po, pml));
    CUDA_CHECK_LAST();
    k_attn_combine<<<H, 64>>>(po, pml, dpos, 1, nsplit, hd, dout);
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaMemcpy(out, dout, nq * 4, cudaMemcpyDeviceToHost));
    void *ps[] = {dk, dv, dq, dout, po, pml, dpos};
    for (int i = 0; i < 7; i++) CUDA_CHECK(cudaFree(ps[i]));
    return 0;
}
