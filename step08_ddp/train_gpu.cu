// train_gpu.cu — training on one GPU (train_gpu.h): the CPU trainer's forward, backward, clipping
// and AdamW (train_cpu.c) as CUDA kernels plus cuBLAS GEMMs, on the same flat fp32 buffers.
//
// Every kernel is the plain version of its CPU twin, one thread per element or one block per row,
// so that each can be read beside train_cpu.c: the speed comes from the GEMMs (cuBLAS, bf16 tensor
// cores in TRAIN_GPU_BF16) and nothing here is fused. Row-major throughout: gemm() below turns a
// row-major C = op(A) op(B) into cuBLAS's column-major call. Tests: tests/test_step08_gpu.c
// (build/tests/run_tests --filter 'step08_gpu/*') compare the loss, every gradient tensor and an
// AdamW step with the CPU's, and 20 steps of training.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_check.h"
#include "step02_attention/forward_gpu.cuh"  // block_sum, block_max, grid_for
#include "step08_ddp/train_gpu.h"

// ---------------------------------------------------------------- the device state

typedef struct {  // offsets of one layer's tensors in the flat buffers
    size_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
} LayerOff;

struct TrainGpu {
    ModelConfig cfg;
    TrainGpuMath math;
    int B, T, N;
    size_t n_params;
    int n_tensors;
    TrainTensor *tensors;  // host copy of the layout (offsets, decay flags)
    size_t off_embed, off_final_norm, off_lm_head;
    LayerOff *lo;  // [n_layers]
    float *p, *g, *m, *v;  // (n_params) params, grads, AdamW moments
    long t;                // AdamW steps taken
    int *ids, *targets;    // (N)
    int *emb_order, *emb_seg;  // (N), (3 N): embed_bwd_k's positions sorted by id and its segments
    int *h_order, *h_seg, *h_count;  // their host twins, and a count per vocabulary id (V + 1)
    float *h_row_loss;               // (N) row_loss's host copy
    int n_seg;
    int n_counted;
    float *cos_t, *sin_t;  // (T, hd/2)
    // activations, (L, N, width) as TrainActs
    float *x_in, *xn1, *q, *k, *v_act, *probs, *att, *x_mid, *xn2, *gate, *up, *hmid;
    float *x_out, *xn_f, *logits, *dlogits;  // (N, d) (N, d) (N, V) (N, V)
    // scratch
    float *kx, *vx, *dkx, *dvx;  // (B, H, T, hd) k and v repeated per query head (GQA), their grads
    float *dP;                   // (B, H, T, T)
    float *dx, *dxn, *dq, *dk, *dv, *datt, *dgate, *dup, *dh;
    float *rowbuf;  // (N, d) one row's share of an RMSNorm weight gradient, summed by colsum_*
    float *colpart; // (COLSUM_SPLIT, d) colsum_part_k's partial sums
    float *qh, *ah, *dqh;  // (B, H, T, hd): q, the attention output and dq in the head layout
    float *row_loss;  // (N)
    double *sumsq;    // (1)
    cublasHandle_t blas;
};

const char *train_gpu_math_name(TrainGpuMath math) {
    return math == TRAIN_GPU_FP32 ? "fp32 (CUBLAS_COMPUTE_32F)"
                                  : "bf16 tensor cores, fp32 master weights (CUBLAS_COMPUTE_32F_FAST_16BF)";
}

int train_gpu_check_config(const ModelConfig *c, char *err, int errlen) {
    if (c->qkv_bias || c->o_bias)
        return errf(err, errlen, "training on the GPU: q/k/v or o_proj biases are not supported yet (train on the CPU)");
    if (c->qk_norm) return errf(err, errlen, "training on the GPU: q/k RMSNorm (Qwen3) is not supported yet (train on the CPU)");
    return 0;
}

// block_sum, block_max (float, every thread gets the result) and grid_for: step02_attention/forward_gpu.cuh

#define ROW_THREADS 256
// threads for a row of n: a multiple of 32, at most ROW_THREADS (short softmax rows waste fewer)
static int row_threads(int n) { return n >= ROW_THREADS ? ROW_THREADS : (n + 31) / 32 * 32; }
#define FOR_EACH(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// ---------------------------------------------------------------- kernels (train_cpu.c's ops)

// each row's gradient goes to the table row it was read from; rows repeat, and atomics would add
// them in a different order each run (the last bits of the gradient, then of every weight, would
// differ between two runs and after a resume). Instead the host sorts the positions by id
// (order[], grouped: segment s = id seg[3s] at order[seg[3s+1] .. + seg[3s+2])) and block
// (s, column chunk) adds its id's rows in position order.
__global__ void embed_bwd_k(float *dE, const int *order, const int *seg, int d, const float *dx) {
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= d) return;
    const int id = seg[3 * blockIdx.x], p0 = seg[3 * blockIdx.x + 1], np = seg[3 * blockIdx.x + 2];
    float s = 0;
    for (int j = 0; j < np; j++) s += dx[(size_t)order[p0 + j] * d + col];
    dE[(size_t)id * d + col] += s;
}

// the forward's embedding gather and RMSNorm are step02's k_embed and k_rmsnorm (forward_gpu.cuh)

// dx (= or +=) r (dy w) - x r^3/n sum(dy w x);  rowbuf = dy x r (this row's share of dw).
// dx may alias dy (each element is read before it is written, by the same thread).
__global__ void rmsnorm_bwd_k(const float *x, const float *w, const float *dy, int n, float eps, float *dx, int acc,
                              float *rowbuf) {
    const size_t r0 = (size_t)blockIdx.x * n;
    float ss = 0, dot = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[r0 + i] * x[r0 + i], dot += dy[r0 + i] * w[i] * x[r0 + i];
    ss = block_sum(ss);
    dot = block_sum(dot);
    const float inv = 1.0f / sqrtf(ss / n + eps), c = inv * inv * inv * dot / n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float xi = x[r0 + i], dyi = dy[r0 + i];
        if (rowbuf) rowbuf[r0 + i] = dyi * xi * inv;
        const float g = inv * dyi * w[i] - xi * c;
        dx[r0 + i] = acc ? dx[r0 + i] + g : g;
    }
}
// dw[i] += sum over rows of buf[r, i], in two passes with a fixed order (deterministic): block
// (x, y) sums rows y, y + COLSUM_SPLIT, ... of its 256 columns into part[y][i], then one thread per
// column adds the COLSUM_SPLIT partial sums in order.
#define COLSUM_SPLIT 64
__global__ void colsum_part_k(const float *buf, int rows, int n, float *part) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = 0;
    for (int r = blockIdx.y; r < rows; r += COLSUM_SPLIT) s += buf[(size_t)r * n + i];
    part[(size_t)blockIdx.y * n + i] = s;
}
__global__ void colsum_fin_k(const float *part, int n, float *dw) {
    FOR_EACH(i, (size_t)n) {
        float s = 0;
        for (int y = 0; y < COLSUM_SPLIT; y++) s += part[(size_t)y * n + i];
        dw[i] += s;
    }
}

// rotate-half rope on (N, n_heads, hd) rows of stride ld; the row's position is row % T.
// sign +1: the forward (rope_apply_cpu); -1: its backward (rope_backward_cpu, the inverse rotation).
__global__ void rope_k(float *x, size_t N, int T, int n_heads, int hd, int ld, const float *cos_t, const float *sin_t,
                       float sign) {
    const int half = hd / 2;
    FOR_EACH(idx, N * n_heads * half) {
        const int i = (int)(idx % half);
        const size_t rh = idx / half, row = rh / n_heads;
        const int h = (int)(rh % n_heads), t = (int)(row % T);
        const float c = cos_t[(size_t)t * half + i], s = sign * sin_t[(size_t)t * half + i];
        float *xh = x + row * ld + (size_t)h * hd;
        const float x1 = xh[i], x2 = xh[i + half];
        xh[i] = x1 * c - x2 * s;
        xh[i + half] = x2 * c + x1 * s;
    }
}

// GQA: out (B, H, T, hd) = the kv head h / (H / KV) of in (B*T, KV*hd), for every query head h
__global__ void repeat_kv_k(const float *in, int B, int T, int H, int KV, int hd, float *out) {
    const int g = H / KV;
    FOR_EACH(i, (size_t)B * H * T * hd) {
        const int e = (int)(i % hd);
        const size_t r = i / hd;
        const int t = (int)(r % T), h = (int)(r / T % H);
        const size_t b = r / T / H;
        out[i] = in[(b * T + t) * (size_t)KV * hd + (size_t)(h / g) * hd + e];
    }
}
// (B*T, H*hd) rows (ld = H*hd) <-> (B, H, T, hd) heads, so that one strided-batched GEMM covers
// every (sequence, head) pair: to (dir 0) or from (dir 1) the head layout
__global__ void heads_k(const float *in, int B, int T, int H, int hd, float *out, int dir) {
    FOR_EACH(i, (size_t)B * H * T * hd) {  // i indexes the head layout
        const int e = (int)(i % hd);
        const size_t r = i / hd;
        const int t = (int)(r % T), h = (int)(r / T % H);
        const size_t b = r / T / H, j = (b * T + t) * (size_t)H * hd + (size_t)h * hd + e;
        if (dir == 0) out[i] = in[j];
        else out[j] = in[i];
    }
}
// its backward: out (B*T, KV*hd) = the sum over the g query heads of each kv head of in (B, H, T, hd)
__global__ void reduce_kv_k(const float *in, int B, int T, int H, int KV, int hd, float *out) {
    const int g = H / KV;
    FOR_EACH(i, (size_t)B * T * KV * hd) {
        const int e = (int)(i % hd), kvh = (int)(i / hd % KV);
        const size_t row = i / hd / KV, b = row / T;
        const int t = (int)(row % T);
        float s = 0;
        for (int j = 0; j < g; j++) s += in[((b * H + (size_t)kvh * g + j) * T + t) * hd + e];
        out[i] = s;
    }
}

// rows of (B*H*T, T) scores, already scaled: causal softmax in place (row i keeps j <= i, the rest 0)
__global__ void softmax_causal_k(float *S, int T) {
    float *s = S + (size_t)blockIdx.x * T;
    const int n = blockIdx.x % T + 1;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, s[j]);
    mx = block_max(mx);
    float sum = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) sum += expf(s[j] - mx);
    sum = block_sum(sum);
    for (int j = threadIdx.x; j < T; j += blockDim.x) s[j] = j < n ? expf(s[j] - mx) / sum : 0.0f;
}
// dS = P (dP - rowsum(P dP)) scale, in place over dP; 0 above the diagonal
__global__ void softmax_bwd_k(const float *P, float *dP, int T, float scale) {
    const size_t r0 = (size_t)blockIdx.x * T;
    const int n = blockIdx.x % T + 1;
    float rs = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) rs += P[r0 + j] * dP[r0 + j];
    rs = block_sum(rs);
    for (int j = threadIdx.x; j < T; j += blockDim.x) dP[r0 + j] = j < n ? P[r0 + j] * (dP[r0 + j] - rs) * scale : 0.0f;
}

__global__ void swiglu_fwd_k(const float *gate, const float *up, size_t n, float *h) {
    FOR_EACH(i, n) h[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
__global__ void swiglu_bwd_k(const float *gate, const float *up, const float *dh, size_t n, float *dgate, float *dup) {
    FOR_EACH(i, n) {
        const float gz = gate[i], s = 1.0f / (1.0f + expf(-gz));
        dgate[i] = dh[i] * up[i] * s * (1.0f + gz * (1.0f - s));
        dup[i] = dh[i] * gz * s;
    }
}

// one block per row: row_loss = logsumexp(z) - z[target]; dz = (softmax(z) - onehot) inv_cnt; an
// ignored row gets loss 0 and dz 0
__global__ void cross_entropy_k(const float *logits, const int *targets, int V, float inv_cnt, float *row_loss,
                                float *dlogits) {
    const size_t r0 = (size_t)blockIdx.x * V;
    const int tg = targets[blockIdx.x];
    if (tg < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) dlogits[r0 + j] = 0;
        if (threadIdx.x == 0) row_loss[blockIdx.x] = 0;
        return;
    }
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, logits[r0 + j]);
    mx = block_max(mx);
    float se = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) se += expf(logits[r0 + j] - mx);
    se = block_sum(se);
    const float lse = mx + logf(se);
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        dlogits[r0 + j] = expf(logits[r0 + j] - lse) * inv_cnt - (j == tg ? inv_cnt : 0.0f);
    if (threadIdx.x == 0) row_loss[blockIdx.x] = lse - logits[r0 + tg];
}

// the sum of squares in double, as grad_global_norm_clip, and in a fixed order (a run repeats
// bit for bit): SUMSQ_BLOCKS blocks of 256 threads write one partial each, one block adds them
#define SUMSQ_BLOCKS 1024
__device__ double block_sum_f64(double v) {
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < (int)(blockDim.x / 32); i++) s += part[i];
    return s;
}
__global__ void sumsq_part_k(const float *g, size_t n, double *part) {
    double s = 0;
    FOR_EACH(i, n) s += (double)g[i] * g[i];
    s = block_sum_f64(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ void sumsq_fin_k(double *part) {
    double s = 0;
    for (int i = threadIdx.x; i < SUMSQ_BLOCKS; i += blockDim.x) s += part[i];
    s = block_sum_f64(s);
    if (threadIdx.x == 0) part[SUMSQ_BLOCKS] = s;
}
__global__ void scale_k(float *g, size_t n, float s) {
    FOR_EACH(i, n) g[i] *= s;
}
// adamw_update_cpu's formula, element by element
__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float b1, float b2, float eps, float step,
                        float decay, float bc2_sqrt) {
    FOR_EACH(i, n) {
        float pi = p[i] * decay;
        const float mi = b1 * m[i] + (1.0f - b1) * g[i], vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        m[i] = mi, v[i] = vi;
        p[i] = pi - step * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

// ---------------------------------------------------------------- GEMMs

static cublasComputeType_t compute_type(const TrainGpu *g) {
    return g->math == TRAIN_GPU_FP32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
}
// Row-major C (M, N) = alpha op(A) op(B) + beta C, op(X) = X or X^T (ta, tb); lda.. are the
// row-major leading dimensions. cuBLAS is column-major, where a row-major matrix reads as its
// transpose: C^T = op(B)^T op(A)^T, so B goes first.
static void gemm(TrainGpu *g, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C, int ldc) {
    CUBLAS_CHECK(cublasGemmEx(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha,
                              B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, compute_type(g),
                              CUBLAS_GEMM_DEFAULT));
}
// the same for `count` problems, the i-th at A + i sa, B + i sb, C + i sc
static void gemm_batched(TrainGpu *g, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                         long long sa, const float *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc,
                         int count) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M,
                                            K, &alpha, B, CUDA_R_32F, ldb, sb, A, CUDA_R_32F, lda, sa, &beta, C,
                                            CUDA_R_32F, ldc, sc, count, compute_type(g), CUBLAS_GEMM_DEFAULT));
}
// y (N, n_out) = x (N, n_in) W^T (+ y when acc)
static void linear_fwd(TrainGpu *g, const float *x, const float *W, int n_in, int n_out, float *y, int acc) {
    gemm(g, 0, 1, g->N, n_out, n_in, 1.0f, x, n_in, W, n_in, acc ? 1.0f : 0.0f, y, n_out);
}
// dx (= or +=) dy W;  dW += dy^T x
static void linear_bwd(TrainGpu *g, const float *x, const float *W, const float *dy, int n_in, int n_out, float *dx,
                       int acc, float *dW) {
    gemm(g, 0, 0, g->N, n_in, n_out, 1.0f, dy, n_out, W, n_in, acc ? 1.0f : 0.0f, dx, n_in);
    gemm(g, 1, 0, n_out, n_in, g->N, 1.0f, dy, n_out, x, n_in, 1.0f, dW, n_in);
}

static void rmsnorm_bwd(TrainGpu *g, const float *x, const float *w, const float *dy, int n, float *dx, int acc, float *dw) {
    rmsnorm_bwd_k<<<g->N, ROW_THREADS>>>(x, w, dy, n, g->cfg.rms_eps, dx, acc, g->rowbuf);
    CUDA_CHECK_LAST();
    colsum_part_k<<<dim3((unsigned)((n + 255) / 256), COLSUM_SPLIT), 256>>>(g->rowbuf, g->N, n, g->colpart);
    CUDA_CHECK_LAST();
    colsum_fin_k<<<grid_for((size_t)n, 256), 256>>>(g->colpart, n, dw);
    CUDA_CHECK_LAST();
}

// ---------------------------------------------------------------- setup

static float *dalloc(size_t n) {
    float *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, (n ? n : 1) * sizeof(float)));
    CUDA_CHECK(cudaMemset(p, 0, (n ? n : 1) * sizeof(float)));
    return p;
}

TrainGpu *train_gpu_new(const TrainModel *m, int B, int T, TrainGpuMath math, char *desc, int desclen, char *err,
                        int errlen) {
    const ModelConfig *c = &m->cfg;
    if (train_gpu_check_config(c, err, errlen)) return NULL;
    int ndev = 0;
    const cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1) {
        errf(err, errlen, "training on the GPU: no CUDA device (%s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
        return NULL;
    }
    TrainGpu *g = (TrainGpu *)xcalloc(1, sizeof *g);
    g->cfg = *c, g->math = math, g->B = B, g->T = T, g->N = B * T;
    g->n_params = m->n_params, g->n_tensors = m->n_tensors;
    g->tensors = (TrainTensor *)xmalloc((size_t)m->n_tensors * sizeof(TrainTensor));
    memcpy(g->tensors, m->tensors, (size_t)m->n_tensors * sizeof(TrainTensor));
    g->off_embed = (size_t)(m->embed - m->params), g->off_final_norm = (size_t)(m->final_norm - m->params);
    g->off_lm_head = (size_t)(m->lm_head - m->params);
    g->lo = (LayerOff *)xcalloc((size_t)c->n_layers, sizeof(LayerOff));
    for (int l = 0; l < c->n_layers; l++) {
        const TrainLayer *L = &m->layers[l];
        LayerOff *o = &g->lo[l];
#define O_(f) o->f = (size_t)(L->f - m->params)
        O_(attn_norm), O_(wq), O_(wk), O_(wv), O_(wo), O_(mlp_norm), O_(w_gate), O_(w_up), O_(w_down);
#undef O_
    }
    const size_t N = (size_t)g->N, Lc = (size_t)c->n_layers, d = (size_t)c->hidden, ff = (size_t)c->intermediate;
    const size_t H = (size_t)c->n_heads, hd = (size_t)c->head_dim, qd = H * hd, kd = (size_t)c->n_kv_heads * hd;
    const size_t V = (size_t)c->vocab;
    size_t before_free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&before_free, &total));
    g->p = dalloc(g->n_params), g->g = dalloc(g->n_params), g->m = dalloc(g->n_params), g->v = dalloc(g->n_params);
    CUDA_CHECK(cudaMalloc(&g->ids, N * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&g->targets, N * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&g->emb_order, N * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&g->emb_seg, 3 * N * sizeof(int)));
    g->h_order = (int *)xmalloc(N * sizeof(int)), g->h_seg = (int *)xmalloc(3 * N * sizeof(int));
    g->h_count = (int *)xmalloc((V + 1) * sizeof(int));
    g->h_row_loss = (float *)xmalloc(N * sizeof(float));
    g->cos_t = dalloc((size_t)T * hd / 2), g->sin_t = dalloc((size_t)T * hd / 2);
    {
        float *ct = (float *)xmalloc((size_t)T * hd / 2 * sizeof(float)), *st = (float *)xmalloc((size_t)T * hd / 2 * sizeof(float));
        rope_table_cpu(c, 0, T, ct, st);  // the engine's table: the same cos/sin as the CPU trainer
        CUDA_CHECK(cudaMemcpy(g->cos_t, ct, (size_t)T * hd / 2 * sizeof(float), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(g->sin_t, st, (size_t)T * hd / 2 * sizeof(float), cudaMemcpyHostToDevice));
        free(ct), free(st);
    }
    g->x_in = dalloc(Lc * N * d), g->xn1 = dalloc(Lc * N * d), g->x_mid = dalloc(Lc * N * d), g->xn2 = dalloc(Lc * N * d);
    g->q = dalloc(Lc * N * qd), g->k = dalloc(Lc * N * kd), g->v_act = dalloc(Lc * N * kd), g->att = dalloc(Lc * N * qd);
    g->probs = dalloc(Lc * (size_t)B * H * T * T);
    g->gate = dalloc(Lc * N * ff), g->up = dalloc(Lc * N * ff), g->hmid = dalloc(Lc * N * ff);
    g->x_out = dalloc(N * d), g->xn_f = dalloc(N * d), g->logits = dalloc(N * V), g->dlogits = dalloc(N * V);
    g->kx = dalloc(N * qd), g->vx = dalloc(N * qd), g->dkx = dalloc(N * qd), g->dvx = dalloc(N * qd);
    g->dP = dalloc((size_t)B * H * T * T);
    g->dx = dalloc(N * d), g->dxn = dalloc(N * d), g->dq = dalloc(N * qd), g->dk = dalloc(N * kd), g->dv = dalloc(N * kd);
    g->datt = dalloc(N * qd), g->dgate = dalloc(N * ff), g->dup = dalloc(N * ff), g->dh = dalloc(N * ff);
    g->rowbuf = dalloc(N * d), g->row_loss = dalloc(N);
    CUDA_CHECK(cudaMalloc(&g->sumsq, (SUMSQ_BLOCKS + 1) * sizeof(double)));
    g->colpart = dalloc((size_t)COLSUM_SPLIT * d);
    g->qh = dalloc(N * qd), g->ah = dalloc(N * qd), g->dqh = dalloc(N * qd);
    CUBLAS_CHECK(cublasCreate(&g->blas));
    train_gpu_upload(g, m, 0);
    size_t after_free = 0;
    CUDA_CHECK(cudaMemGetInfo(&after_free, &total));
    if (desc) {
        cudaDeviceProp pr;
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaGetDeviceProperties(&pr, dev));
        snprintf(desc, (size_t)desclen, "%s (sm_%d%d, %.1f GiB): %.3f GiB allocated (params, grads, AdamW m and v: "
                 "%.3f GiB; activations of %d x %d tokens: the rest); matmuls %s", pr.name, pr.major, pr.minor,
                 (double)pr.totalGlobalMem / (1 << 30), (double)(before_free - after_free) / (1 << 30),
                 16.0 * g->n_params / (1 << 30), B, T, train_gpu_math_name(math));
    }
    return g;
}

void train_gpu_free(TrainGpu *g) {
    if (!g) return;
    void *ps[] = {g->p, g->g, g->m, g->v, g->ids, g->targets, g->cos_t, g->sin_t, g->x_in, g->xn1, g->q, g->k,
                  g->v_act, g->probs, g->att, g->x_mid, g->xn2, g->gate, g->up, g->hmid, g->x_out, g->xn_f,
                  g->logits, g->dlogits, g->kx, g->vx, g->dkx, g->dvx, g->dP, g->dx, g->dxn, g->dq, g->dk,
                  g->dv, g->datt, g->dgate, g->dup, g->dh, g->rowbuf, g->row_loss, g->sumsq, g->colpart, g->qh, g->ah, g->dqh, g->emb_order, g->emb_seg};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) CUDA_CHECK(cudaFree(ps[i]));
    CUBLAS_CHECK(cublasDestroy(g->blas));
    free(g->tensors), free(g->lo), free(g->h_order), free(g->h_seg), free(g->h_count), free(g->h_row_loss);
    free(g);
}

void train_gpu_upload(TrainGpu *g, const TrainModel *m, int with_grads) {
    CUDA_CHECK(cudaMemcpy(g->p, m->params, g->n_params * sizeof(float), cudaMemcpyHostToDevice));
    if (with_grads) CUDA_CHECK(cudaMemcpy(g->g, m->grads, g->n_params * sizeof(float), cudaMemcpyHostToDevice));
}
void train_gpu_download(TrainGpu *g, TrainModel *m) {
    CUDA_CHECK(cudaMemcpy(m->params, g->p, g->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(m->grads, g->g, g->n_params * sizeof(float), cudaMemcpyDeviceToHost));
}
void train_gpu_upload_adamw(TrainGpu *g, const AdamW *o) {
    CUDA_CHECK(cudaMemcpy(g->m, o->m, g->n_params * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(g->v, o->v, g->n_params * sizeof(float), cudaMemcpyHostToDevice));
    g->t = o->t;
}
void train_gpu_download_adamw(TrainGpu *g, AdamW *o) {
    CUDA_CHECK(cudaMemcpy(o->m, g->m, g->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(o->v, g->v, g->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    o->t = g->t;
}

void train_gpu_snapshot(TrainGpu *g, float *params, float *m, float *v, long *adam_t) {
    CUDA_CHECK(cudaMemcpy(params, g->p, g->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(m, g->m, g->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(v, g->v, g->n_params * sizeof(float), cudaMemcpyDeviceToHost));
    *adam_t = g->t;
}
void *train_gpu_host_alloc(size_t bytes) {
    void *p = NULL;
    return cudaMallocHost(&p, bytes) == cudaSuccess ? p : NULL;
}
void train_gpu_host_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

// ---------------------------------------------------------------- forward + backward

float *train_gpu_grads(TrainGpu *g) { return g->g; }

double train_gpu_forward_backward(TrainGpu *g, const int *ids, const int *targets, int *n_counted) {
    return train_gpu_forward_backward_hooked(g, ids, targets, n_counted, NULL, NULL);
}

double train_gpu_forward_backward_hooked(TrainGpu *g, const int *ids, const int *targets, int *n_counted,
                                         TrainGradReady ready, void *ctx) {
    const ModelConfig *c = &g->cfg;
    const int B = g->B, T = g->T, N = g->N, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    const int ff = c->intermediate, qd = H * hd, kd = KV * hd, V = c->vocab;
    const float eps = c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    int cnt = 0;
    for (int t = 0; t < N; t++) {
        if (ids[t] < 0 || ids[t] >= V || (targets[t] != TRAIN_IGNORE && (targets[t] < 0 || targets[t] >= V))) {
            fprintf(stderr, "train_gpu_forward_backward: id %d / target %d at row %d is outside the vocabulary [0, %d)\n",
                    ids[t], targets[t], t, V);
            return -1;
        }
        cnt += targets[t] != TRAIN_IGNORE;
    }
    g->n_counted = cnt;
    if (n_counted) *n_counted = cnt;
    CUDA_CHECK(cudaMemcpy(g->ids, ids, (size_t)N * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(g->targets, targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice));
    {  // the positions grouped by id (a counting sort, stable), for the embedding's backward
        int *cnt = g->h_count;
        memset(cnt, 0, (size_t)(V + 1) * sizeof(int));
        for (int t = 0; t < N; t++) cnt[ids[t] + 1]++;
        g->n_seg = 0;
        for (int v = 0; v < V; v++) {
            if (cnt[v + 1]) {
                int *sg = g->h_seg + 3 * g->n_seg++;
                sg[0] = v, sg[1] = cnt[v], sg[2] = cnt[v + 1];
            }
            cnt[v + 1] += cnt[v];  // cnt[v] = where id v's positions start
        }
        for (int t = 0; t < N; t++) g->h_order[cnt[ids[t]]++] = t;
        CUDA_CHECK(cudaMemcpy(g->emb_order, g->h_order, (size_t)N * sizeof(int), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(g->emb_seg, g->h_seg, (size_t)3 * g->n_seg * sizeof(int), cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaMemset(g->g, 0, g->n_params * sizeof(float)));
    const size_t Nd = (size_t)N * d, Nq = (size_t)N * qd, Nk = (size_t)N * kd, Nf = (size_t)N * ff;
    const long long TT = (long long)T * T, Thd = (long long)T * hd;
    float *P_ = g->p, *G_ = g->g;
    // ---- forward (train_forward's order)
    float *x = g->x_out;  // the running residual stream (N, d)
    k_embed<float><<<N, ROW_THREADS>>>(P_ + g->off_embed, g->ids, d, x);
    CUDA_CHECK_LAST();
    for (int l = 0; l < c->n_layers; l++) {
        const LayerOff *o = &g->lo[l];
        float *xin = g->x_in + l * Nd, *xn1 = g->xn1 + l * Nd, *xmid = g->x_mid + l * Nd, *xn2 = g->xn2 + l * Nd;
        float *q = g->q + l * Nq, *k = g->k + l * Nk, *v = g->v_act + l * Nk, *att = g->att + l * Nq;
        float *P = g->probs + (size_t)l * B * H * T * T;
        float *gate = g->gate + l * Nf, *up = g->up + l * Nf, *hm = g->hmid + l * Nf;
        CUDA_CHECK(cudaMemcpyAsync(xin, x, Nd * sizeof(float), cudaMemcpyDeviceToDevice));
        k_rmsnorm<float><<<N, ROW_THREADS>>>(x, P_ + o->attn_norm, d, 1, (size_t)d, eps, xn1);
        CUDA_CHECK_LAST();
        linear_fwd(g, xn1, P_ + o->wq, d, qd, q, 0);
        linear_fwd(g, xn1, P_ + o->wk, d, kd, k, 0);
        linear_fwd(g, xn1, P_ + o->wv, d, kd, v, 0);
        rope_k<<<grid_for(Nq / 2, 256), 256>>>(q, (size_t)N, T, H, hd, qd, g->cos_t, g->sin_t, 1.0f);
        CUDA_CHECK_LAST();
        rope_k<<<grid_for(Nk / 2, 256), 256>>>(k, (size_t)N, T, KV, hd, kd, g->cos_t, g->sin_t, 1.0f);
        CUDA_CHECK_LAST();
        repeat_kv_k<<<grid_for(Nq, 256), 256>>>(k, B, T, H, KV, hd, g->kx);
        CUDA_CHECK_LAST();
        repeat_kv_k<<<grid_for(Nq, 256), 256>>>(v, B, T, H, KV, hd, g->vx);
        CUDA_CHECK_LAST();
        heads_k<<<grid_for(Nq, 256), 256>>>(q, B, T, H, hd, g->qh, 0);
        CUDA_CHECK_LAST();
        // S = q k^T / sqrt(hd), one (T, T) product per (sequence, head): B H of them in one call
        gemm_batched(g, 0, 1, T, T, hd, scale, g->qh, hd, Thd, g->kx, hd, Thd, 0.0f, P, T, TT, B * H);
        softmax_causal_k<<<B * H * T, row_threads(T)>>>(P, T);
        CUDA_CHECK_LAST();
        gemm_batched(g, 0, 0, T, hd, T, 1.0f, P, T, TT, g->vx, hd, Thd, 0.0f, g->ah, hd, Thd, B * H);  // o = P v
        heads_k<<<grid_for(Nq, 256), 256>>>(g->ah, B, T, H, hd, att, 1);
        CUDA_CHECK_LAST();
        linear_fwd(g, att, P_ + o->wo, qd, d, x, 1);  // x += o Wo^T
        CUDA_CHECK(cudaMemcpyAsync(xmid, x, Nd * sizeof(float), cudaMemcpyDeviceToDevice));
        k_rmsnorm<float><<<N, ROW_THREADS>>>(x, P_ + o->mlp_norm, d, 1, (size_t)d, eps, xn2);
        CUDA_CHECK_LAST();
        linear_fwd(g, xn2, P_ + o->w_gate, d, ff, gate, 0);
        linear_fwd(g, xn2, P_ + o->w_up, d, ff, up, 0);
        swiglu_fwd_k<<<grid_for(Nf, 256), 256>>>(gate, up, Nf, hm);
        CUDA_CHECK_LAST();
        linear_fwd(g, hm, P_ + o->w_down, ff, d, x, 1);  // x += h Wd^T
    }
    k_rmsnorm<float><<<N, ROW_THREADS>>>(x, P_ + g->off_final_norm, d, 1, (size_t)d, eps, g->xn_f);
    CUDA_CHECK_LAST();
    linear_fwd(g, g->xn_f, P_ + g->off_lm_head, d, V, g->logits, 0);
    cross_entropy_k<<<N, ROW_THREADS>>>(g->logits, g->targets, V, cnt ? 1.0f / (float)cnt : 0.0f, g->row_loss, g->dlogits);
    CUDA_CHECK_LAST();
    // ---- backward (train_backward_hooked's order); weight gradients accumulate into G_ (zeroed
    // above; with tied embeddings the lm_head's and the embedding's land in the same rows)
    linear_bwd(g, g->xn_f, P_ + g->off_lm_head, g->dlogits, d, V, g->dxn, 0, G_ + g->off_lm_head);
    rmsnorm_bwd(g, x, P_ + g->off_final_norm, g->dxn, d, g->dx, 0, G_ + g->off_final_norm);
    // the ready ranges (train.h's TrainGradReady, the CPU's order): final on the device once the
    // work enqueued so far has run
    if (ready) ready(ctx, g->off_final_norm, g->n_params - g->off_final_norm);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        const LayerOff *o = &g->lo[l];
        const float *xin = g->x_in + l * Nd, *xn1 = g->xn1 + l * Nd, *xmid = g->x_mid + l * Nd, *xn2 = g->xn2 + l * Nd;
        const float *q = g->q + l * Nq, *k = g->k + l * Nk, *v = g->v_act + l * Nk, *att = g->att + l * Nq;
        const float *P = g->probs + (size_t)l * B * H * T * T;
        const float *gate = g->gate + l * Nf, *up = g->up + l * Nf, *hm = g->hmid + l * Nf;
        // MLP block
        linear_bwd(g, hm, P_ + o->w_down, g->dx, ff, d, g->dh, 0, G_ + o->w_down);
        swiglu_bwd_k<<<grid_for(Nf, 256), 256>>>(gate, up, g->dh, Nf, g->dgate, g->dup);
        CUDA_CHECK_LAST();
        linear_bwd(g, xn2, P_ + o->w_gate, g->dgate, d, ff, g->dxn, 0, G_ + o->w_gate);
        linear_bwd(g, xn2, P_ + o->w_up, g->dup, d, ff, g->dxn, 1, G_ + o->w_up);
        rmsnorm_bwd(g, xmid, P_ + o->mlp_norm, g->dxn, d, g->dx, 1, G_ + o->mlp_norm);  // dx += through the norm
        // attention block
        linear_bwd(g, att, P_ + o->wo, g->dx, qd, d, g->datt, 0, G_ + o->wo);
        repeat_kv_k<<<grid_for(Nq, 256), 256>>>(k, B, T, H, KV, hd, g->kx);
        CUDA_CHECK_LAST();
        repeat_kv_k<<<grid_for(Nq, 256), 256>>>(v, B, T, H, KV, hd, g->vx);
        CUDA_CHECK_LAST();
        heads_k<<<grid_for(Nq, 256), 256>>>(q, B, T, H, hd, g->qh, 0);  // q and do in the head layout
        CUDA_CHECK_LAST();
        heads_k<<<grid_for(Nq, 256), 256>>>(g->datt, B, T, H, hd, g->ah, 0);
        CUDA_CHECK_LAST();
        gemm_batched(g, 0, 1, T, T, hd, 1.0f, g->ah, hd, Thd, g->vx, hd, Thd, 0.0f, g->dP, T, TT, B * H);  // dP = do v^T
        softmax_bwd_k<<<B * H * T, row_threads(T)>>>(P, g->dP, T, scale);  // dP -> dS (with the 1/sqrt(hd))
        CUDA_CHECK_LAST();
        // dq = dS k;  dk (per query head) = dS^T q;  dv (per query head) = P^T do
        gemm_batched(g, 0, 0, T, hd, T, 1.0f, g->dP, T, TT, g->kx, hd, Thd, 0.0f, g->dqh, hd, Thd, B * H);
        gemm_batched(g, 1, 0, T, hd, T, 1.0f, g->dP, T, TT, g->qh, hd, Thd, 0.0f, g->dkx, hd, Thd, B * H);
        gemm_batched(g, 1, 0, T, hd, T, 1.0f, P, T, TT, g->ah, hd, Thd, 0.0f, g->dvx, hd, Thd, B * H);
        heads_k<<<grid_for(Nq, 256), 256>>>(g->dqh, B, T, H, hd, g->dq, 1);
        CUDA_CHECK_LAST();
        reduce_kv_k<<<grid_for(Nk, 256), 256>>>(g->dkx, B, T, H, KV, hd, g->dk);  // sum the heads sharing a kv head
        CUDA_CHECK_LAST();
        reduce_kv_k<<<grid_for(Nk, 256), 256>>>(g->dvx, B, T, H, KV, hd, g->dv);
        CUDA_CHECK_LAST();
        rope_k<<<grid_for(Nq / 2, 256), 256>>>(g->dq, (size_t)N, T, H, hd, qd, g->cos_t, g->sin_t, -1.0f);
        CUDA_CHECK_LAST();
        rope_k<<<grid_for(Nk / 2, 256), 256>>>(g->dk, (size_t)N, T, KV, hd, kd, g->cos_t, g->sin_t, -1.0f);
        CUDA_CHECK_LAST();
        linear_bwd(g, xn1, P_ + o->wq, g->dq, d, qd, g->dxn, 0, G_ + o->wq);
        linear_bwd(g, xn1, P_ + o->wk, g->dk, d, kd, g->dxn, 1, G_ + o->wk);
        linear_bwd(g, xn1, P_ + o->wv, g->dv, d, kd, g->dxn, 1, G_ + o->wv);
        rmsnorm_bwd(g, xin, P_ + o->attn_norm, g->dxn, d, g->dx, 1, G_ + o->attn_norm);
        if (ready) ready(ctx, o->attn_norm, o->w_down + (size_t)d * ff - o->attn_norm);
    }
    embed_bwd_k<<<dim3((unsigned)g->n_seg, (unsigned)((d + 255) / 256)), 256>>>(G_ + g->off_embed, g->emb_order,
                                                                             g->emb_seg, d, g->dx);
    CUDA_CHECK_LAST();
    if (ready) ready(ctx, 0, g->lo[0].attn_norm);
    // the loss: the rows' shares summed on the host in double (a synchronizing copy)
    CUDA_CHECK(cudaMemcpy(g->h_row_loss, g->row_loss, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost));
    double loss = 0;
    for (int t = 0; t < N; t++) loss += g->h_row_loss[t];
    return cnt ? loss / cnt : 0.0;
}

// ---------------------------------------------------------------- clipping and AdamW

double train_gpu_clip(TrainGpu *g, double max_norm) {
    sumsq_part_k<<<SUMSQ_BLOCKS, 256>>>(g->g, g->n_params, g->sumsq);
    CUDA_CHECK_LAST();
    sumsq_fin_k<<<1, 256>>>(g->sumsq);
    CUDA_CHECK_LAST();
    double ss = 0;
    CUDA_CHECK(cudaMemcpy(&ss, g->sumsq + SUMSQ_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost));
    const double norm = sqrt(ss);
    if (max_norm > 0 && norm > max_norm) {
        scale_k<<<grid_for(g->n_params, 256), 256>>>(g->g, g->n_params, (float)(max_norm / (norm + 1e-6)));
        CUDA_CHECK_LAST();
    }
    return norm;
}

void train_gpu_adamw_step(TrainGpu *g, const AdamWConfig *c, float lr) {
    g->t++;
    const float bc1 = 1.0f - powf(c->beta1, (float)g->t), bc2_sqrt = sqrtf(1.0f - powf(c->beta2, (float)g->t));
    for (int i = 0; i < g->n_tensors; i++) {
        const TrainTensor *t = &g->tensors[i];
        const float wd = t->decay ? c->weight_decay : 0.0f;
        adamw_k<<<grid_for(t->numel, 256), 256>>>(g->p + t->off, g->g + t->off, g->m + t->off, g->v + t->off, t->numel,
                                             c->beta1, c->beta2, c->eps, lr / bc1, 1.0f - lr * wd, bc2_sqrt);
        CUDA_CHECK_LAST();
    }
    CUDA_CHECK(cudaDeviceSynchronize());  // the step is done when this returns: host timers measure it
}
