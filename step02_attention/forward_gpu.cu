// forward_gpu.cu — the Llama-family forward pass on CUDA (prefill, no KV cache). See forward.h.
//
// Precision: weights stay as stored (bf16 or fp16; an f32 checkpoint stays fp32 and runs fp32
// SGEMMs without TF32). The residual stream x and every GEMM output are fp32 (cuBLAS GemmEx,
// CUBLAS_COMPUTE_32F); a GEMM's inputs are in the weight dtype, so each op that feeds a GEMM
// (rmsnorm, the q/k/v conversion, softmax, swiglu) writes its output in that dtype. This is the
// precision transformers runs a bf16 model in, except that our residual stream stays fp32.
// On sm_75 (a T4: no bf16 tensor cores) bf16 weights are converted to fp32 at load.
//
// One layer = 4 weight GEMMs (q/k/v concatenated at load, gate/up concatenated) + naive
// attention: S = QK^T (one strided-batched GEMM per query head of a group, full T x T, the mask
// applied afterwards), a causal softmax kernel over each row of S, then PV (GEMM again). The
// (H, T, T) fp32 score matrix is stored: at T = 2048 and 32 heads that is 512 MiB, the
// quadratic memory term step07's flash attention removes. No synchronization and no host
// round trip inside the forward: all work is queued on one stream.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_check.h"
#include "forward.h"
#include "forward_gpu.cuh"
#include "gpu.h"

// ---------------------------------------------------------------- kernels (one op each)

// y (T, n) with row stride ld: y[t, j] += b[j]  (declared in forward_gpu.cuh)
__global__ void k_add_bias(float *y, const float *b, int T, int n, size_t ld) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)T * n; i += (size_t)gridDim.x * blockDim.x)
        y[(i / n) * ld + i % n] += b[i % n];
}

// Rotate-half RoPE in place on x (T, nh, hd) with row stride ld; cos, sin (T, hd/2).
__global__ void k_rope(float *x, int T, int nh, int hd, size_t ld, const float *cos_t, const float *sin_t) {
    const int half = hd / 2;
    const size_t total = (size_t)T * nh * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int e = (int)(i % half);
        const size_t th = i / half;
        const size_t t = th / nh, h = th % nh;
        float *p = x + t * ld + h * hd;
        const float c = cos_t[t * half + e], s = sin_t[t * half + e];
        const float x1 = p[e], x2 = p[e + half];
        p[e] = x1 * c - x2 * s;
        p[e + half] = x2 * c + x1 * s;
    }
}

template <class O> __global__ void k_convert(const float *in, O *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = fromf<O>(in[i]);
}
template <class I> __global__ void k_to_f32(const I *in, float *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = tof(in[i]);
}

// Causal softmax of S (H, nq, nk) fp32 into P (same shape, dtype O; may alias S when O = float).
// The nq queries are the last nq of nk positions: row r = h*nq + i holds query position
// nk - nq + i, keys j <= nk - nq + i are kept, later ones get probability 0. Grid (H*nq).
template <class O> __global__ void k_causal_softmax(const float *S, O *P, int nq, int nk) {
    const size_t r = blockIdx.x;
    const int i = (int)(r % nq) + nk - nq;
    const float *s = S + r * nk;
    O *p = P + r * nk;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, s[j]);
    mx = block_max(mx);
    float sum = 0;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += expf(s[j] - mx);
    const float inv = 1.0f / block_sum(sum);
    for (int j = threadIdx.x; j < nk; j += blockDim.x) p[j] = fromf<O>(j <= i ? expf(s[j] - mx) * inv : 0.0f);
}

// Random N(mean, std) fill from a counter-based hash (no state): the same seed, the same weights.
__device__ inline float u01(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((z >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
}
template <class W> __global__ void k_fill_normal(W *p, size_t n, unsigned long long seed, float mean, float std) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float a = u01(seed * 0x100000001B3ull + 2 * i), b = u01(seed * 0x100000001B3ull + 2 * i + 1);
        p[i] = fromf<W>(mean + std * sqrtf(-2.0f * logf(a)) * cosf(6.2831853f * b));
    }
}

int grid_for(size_t n, int block) {
    size_t g = (n + block - 1) / block;
    return (int)(g > 65535 * 16 ? 65535 * 16 : (g < 1 ? 1 : g));
}

// ---------------------------------------------------------------- the model on the device

static void *dalloc(size_t bytes, double *count) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    if (count) *count += (double)bytes;
    return p;
}

// Copy a tensor to dst (device) in dtype `to`: as stored when the dtypes agree, else via fp32.
static void upload(const StTensor *t, StDtype to, void *dst) {
    if (t->dtype == to) {
        CUDA_CHECK(cudaMemcpy(dst, t->data, t->nbytes, cudaMemcpyHostToDevice));
        return;
    }
    float *f = (float *)xmalloc((size_t)t->numel * 4);
    st_to_f32(t, f);
    if (to == ST_F32) {
        CUDA_CHECK(cudaMemcpy(dst, f, (size_t)t->numel * 4, cudaMemcpyHostToDevice));
    } else {
        void *h = xmalloc((size_t)t->numel * 2);
        for (int64_t i = 0; i < t->numel; i++) {
            if (to == ST_F16) ((__half *)h)[i] = __float2half_rn(f[i]);
            else ((__nv_bfloat16 *)h)[i] = __float2bfloat16_rn(f[i]);
        }
        CUDA_CHECK(cudaMemcpy(dst, h, (size_t)t->numel * 2, cudaMemcpyHostToDevice));
        free(h);
    }
    free(f);
}
static float *upload_f32(const StTensor *t, double *count) {
    if (!t) return NULL;
    float *p = (float *)dalloc((size_t)t->numel * 4, count);
    upload(t, ST_F32, p);
    return p;
}

static void fill(StDtype dt, void *p, size_t n, unsigned long long seed, float mean, float std) {
    DISPATCH(dt, A, k_fill_normal<A><<<grid_for(n, 256), 256>>>((A *)p, n, seed, mean, std));
    CUDA_CHECK_LAST();
}

// Device dtype for a checkpoint dtype on this GPU, and the sentence that says so.
static StDtype pick_dtype(StDtype stored, const GpuInfo *gi, char *desc, size_t n) {
    int cc = gi->cc_major * 10 + gi->cc_minor;
    if (stored == ST_BF16 && cc < 80) {
        snprintf(desc, n, "bf16 checkpoint converted to fp32 at load (sm_%d has no bf16 tensor cores): fp32 SGEMM", cc);
        return ST_F32;
    }
    if (stored == ST_F32)
        snprintf(desc, n, "fp32 weights, fp32 cuBLAS SGEMM (no TF32), fp32 attention");
    else
        snprintf(desc, n, "%s weights as stored, %s GEMM inputs, fp32 accumulation, residual and softmax (cuBLAS GemmEx)",
                 dt_name(stored), dt_name(stored));
    return stored;
}

// quant: the projections will be step06's GpuQProj (attach_q), no dense matrices for them.
static GpuModel *model_alloc(const ModelConfig *c, StDtype wdt, int quant) {
    GpuModel *g = (GpuModel *)xcalloc(1, sizeof(GpuModel));
    g->cfg = *c;
    g->wdt = wdt;
    const size_t d = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t ff = c->intermediate, es = esize(wdt);
    g->embed = dalloc((size_t)c->vocab * d * es, &g->weight_bytes);
    g->lm_head = c->tie_embeddings ? g->embed : dalloc((size_t)c->vocab * d * es, &g->weight_bytes);
    g->final_norm = (float *)dalloc(d * 4, &g->weight_bytes);
    g->layers = (GpuLayer *)xcalloc((size_t)c->n_layers, sizeof(GpuLayer));
    for (int l = 0; l < c->n_layers; l++) {
        GpuLayer *L = &g->layers[l];
        L->attn_norm = (float *)dalloc(d * 4, &g->weight_bytes);
        L->mlp_norm = (float *)dalloc(d * 4, &g->weight_bytes);
        if (quant) continue;
        L->wqkv = dalloc((qd + 2 * kd) * d * es, &g->weight_bytes);
        L->wo = dalloc(d * qd * es, &g->weight_bytes);
        L->wgu = dalloc(2 * ff * d * es, &g->weight_bytes);
        L->wdown = dalloc(d * ff * es, &g->weight_bytes);
    }
    CUBLAS_CHECK(cublasCreate(&g->blas));
    CUDA_CHECK(cudaEventCreate(&g->ev0));
    CUDA_CHECK(cudaEventCreate(&g->ev1));
    g->ea = (cudaEvent_t *)xcalloc((size_t)c->n_layers, sizeof(cudaEvent_t));
    g->eb = (cudaEvent_t *)xcalloc((size_t)c->n_layers, sizeof(cudaEvent_t));
    for (int l = 0; l < c->n_layers; l++) {
        CUDA_CHECK(cudaEventCreate(&g->ea[l]));
        CUDA_CHECK(cudaEventCreate(&g->eb[l]));
    }
    return g;
}

// Everything of w but the seven projections of each layer: embeddings, norms, biases.
static void upload_rest(const ModelWeights *w, GpuModel *g) {
    const ModelConfig *c = &w->cfg;
    const size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    upload(w->embed, g->wdt, g->embed);
    if (!g->cfg.tie_embeddings) upload(w->lm_head, g->wdt, g->lm_head);
    upload(w->final_norm, ST_F32, g->final_norm);
    for (int l = 0; l < c->n_layers; l++) {
        const LayerTensors *s = &w->layers[l];
        GpuLayer *L = &g->layers[l];
        upload(s->attn_norm, ST_F32, L->attn_norm);
        upload(s->mlp_norm, ST_F32, L->mlp_norm);
        L->q_norm = upload_f32(s->q_norm, &g->weight_bytes);
        L->k_norm = upload_f32(s->k_norm, &g->weight_bytes);
        L->bo = upload_f32(s->bo, &g->weight_bytes);
        if (s->bq || s->bk || s->bv) {
            L->bqkv = (float *)dalloc((qd + 2 * kd) * 4, &g->weight_bytes);
            CUDA_CHECK(cudaMemset(L->bqkv, 0, (qd + 2 * kd) * 4));  // a missing part of the bias is 0
            if (s->bq) upload(s->bq, ST_F32, L->bqkv);
            if (s->bk) upload(s->bk, ST_F32, L->bqkv + qd);
            if (s->bv) upload(s->bv, ST_F32, L->bqkv + qd + kd);
        }
    }
}

// The checks both loaders make; 0, or -1 + err.
static int load_checks(const ModelWeights *w, GpuInfo *gi, char *err, int errlen) {
    if (gpu_info(gi) != 0) {
        snprintf(err, (size_t)errlen, "%s", gi->reason);
        return -1;
    }
    if (w->cfg.mlp_bias) {
        snprintf(err, (size_t)errlen, "mlp_bias=true is not supported by this step");
        return -1;
    }
    return 0;
}

extern "C" GpuModel *gpu_model_load(const ModelWeights *w, char *err, int errlen) {
    GpuInfo gi;
    if (load_checks(w, &gi, err, errlen) != 0) return NULL;
    if (w->quantized) {
        snprintf(err, (size_t)errlen,
                 "%s is a quantized checkpoint (config.json has a quantization_config): this program runs dense "
                 "weights only; step06's loader runs it (batch_bench / generate / kv_bench load it)", w->dir);
        return NULL;
    }
    const ModelConfig *c = &w->cfg;
    char desc[224];
    StDtype wdt = pick_dtype(w->layers[0].wq->dtype, &gi, desc, sizeof desc);
    ModelConfig cc = *c;
    cc.tie_embeddings = (w->lm_head == w->embed || !w->lm_head);
    GpuModel *g = model_alloc(&cc, wdt, 0);
    snprintf(g->desc, sizeof g->desc, "%s", desc);
    upload_rest(w, g);
    const size_t d = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t ff = c->intermediate, es = esize(wdt);
    for (int l = 0; l < c->n_layers; l++) {
        const LayerTensors *s = &w->layers[l];
        GpuLayer *L = &g->layers[l];
        upload(s->wq, wdt, L->wqkv);
        upload(s->wk, wdt, (char *)L->wqkv + qd * d * es);
        upload(s->wv, wdt, (char *)L->wqkv + (qd + kd) * d * es);
        upload(s->wo, wdt, L->wo);
        upload(s->w_gate, wdt, L->wgu);
        upload(s->w_up, wdt, (char *)L->wgu + ff * d * es);
        upload(s->w_down, wdt, L->wdown);
    }
    return g;
}

// Random weights of g's config; dense = 0: the projections are left alone (quantized ones come
// later), their seeds still drawn, so the other tensors are the dense model's exactly.
static void fill_random(GpuModel *g, uint64_t seed, int dense) {
    const ModelConfig *c = &g->cfg;
    const StDtype wdt = g->wdt;
    const size_t d = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t ff = c->intermediate;
    unsigned long long s = seed * 1000003ull;
    fill(wdt, g->embed, (size_t)c->vocab * d, ++s, 0, 0.02f);
    if (!c->tie_embeddings) fill(wdt, g->lm_head, (size_t)c->vocab * d, ++s, 0, 0.02f);
    fill(ST_F32, g->final_norm, d, ++s, 1, 0.1f);
    for (int l = 0; l < c->n_layers; l++) {
        GpuLayer *L = &g->layers[l];
        fill(ST_F32, L->attn_norm, d, ++s, 1, 0.1f);
        fill(ST_F32, L->mlp_norm, d, ++s, 1, 0.1f);
        if (dense) {
            fill(wdt, L->wqkv, (qd + 2 * kd) * d, ++s, 0, 0.02f);
            fill(wdt, L->wo, d * qd, ++s, 0, 0.02f);
            fill(wdt, L->wgu, 2 * ff * d, ++s, 0, 0.02f);
            fill(wdt, L->wdown, d * ff, ++s, 0, 0.02f);
        } else s += 4;
        if (c->qk_norm) {
            L->q_norm = (float *)dalloc(c->head_dim * 4, &g->weight_bytes);
            L->k_norm = (float *)dalloc(c->head_dim * 4, &g->weight_bytes);
            fill(ST_F32, L->q_norm, c->head_dim, ++s, 1, 0.1f);
            fill(ST_F32, L->k_norm, c->head_dim, ++s, 1, 0.1f);
        }
        if (c->qkv_bias) {
            L->bqkv = (float *)dalloc((qd + 2 * kd) * 4, &g->weight_bytes);
            fill(ST_F32, L->bqkv, qd + 2 * kd, ++s, 0, 0.02f);
        }
        if (c->o_bias) {
            L->bo = (float *)dalloc(d * 4, &g->weight_bytes);
            fill(ST_F32, L->bo, d, ++s, 0, 0.02f);
        }
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

extern "C" GpuModel *gpu_model_random(const ModelConfig *c, StDtype dtype, uint64_t seed, char *err, int errlen) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        snprintf(err, (size_t)errlen, "%s", gi.reason);
        return NULL;
    }
    char desc[224];
    StDtype wdt = pick_dtype(dtype, &gi, desc, sizeof desc);
    GpuModel *g = model_alloc(c, wdt, 0);
    snprintf(g->desc, sizeof g->desc, "random weights; %s", desc);
    fill_random(g, seed, 1);
    return g;
}

// ---------------------------------------------------------------- quantized projections (step06)

// One projection from its parts (q|k|v, gate|up, or one): stacked into one QLinearGpu when
// qweight_stack_rows accepts them, else one QLinearGpu per part.
static int make_qproj(GpuQProj *p, const QWeight *const *parts, int n, double *bytes, char *err, int errlen) {
    QWeight st;
    const int rc = n > 1 ? qweight_stack_rows(parts, n, &st) : 1;
    if (rc < 0) {
        snprintf(err, (size_t)errlen, "out of host memory stacking quantized projections");
        return -1;
    }
    if (rc == 0 || n == 1) {
        p->part[0] = qlinear_gpu_new(rc == 0 ? &st : parts[0], err, errlen);
        p->rows[0] = rc == 0 ? st.rows : parts[0]->rows;
        if (rc == 0) qweight_free(&st);
        if (!p->part[0]) return -1;
        p->n = 1;
    } else {
        for (int i = 0; i < n; i++) {
            p->part[i] = qlinear_gpu_new(parts[i], err, errlen);
            if (!p->part[i]) return -1;
            p->rows[i] = parts[i]->rows;
            p->n = i + 1;
        }
    }
    for (int i = 0; i < p->n; i++) *bytes += (double)qlinear_gpu_bytes(p->part[i]);
    return 0;
}

// qlin (n_layers * N_PROJ): checked against the config, uploaded as the layers' GpuQProj.
static int attach_q(GpuModel *g, const QWeight *qlin, char *err, int errlen) {
    const ModelConfig *c = &g->cfg;
    const int d = c->hidden, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim, ff = c->intermediate;
    const int want_rows[N_PROJ] = {qd, kd, kd, d, ff, ff, d}, want_cols[N_PROJ] = {d, d, d, qd, d, d, ff};
    for (int l = 0; l < c->n_layers; l++) {
        const QWeight *q = qlin + (size_t)l * N_PROJ;
        for (int p = 0; p < N_PROJ; p++)
            if (!q[p].q || q[p].rows != want_rows[p] || q[p].cols != want_cols[p]) {
                snprintf(err, (size_t)errlen, "layer %d projection %d: quantized weight (%d, %d), the config needs (%d, %d)",
                         l, p, q[p].rows, q[p].cols, want_rows[p], want_cols[p]);
                return -1;
            }
        GpuLayer *L = &g->layers[l];
        const QWeight *qkv[3] = {&q[PROJ_Q], &q[PROJ_K], &q[PROJ_V]}, *gu[2] = {&q[PROJ_GATE], &q[PROJ_UP]};
        const QWeight *o[1] = {&q[PROJ_O]}, *dn[1] = {&q[PROJ_DOWN]};
        double *b = &g->weight_bytes;
        if (make_qproj(&L->qqkv, qkv, 3, b, err, errlen) || make_qproj(&L->qo, o, 1, b, err, errlen) ||
            make_qproj(&L->qgu, gu, 2, b, err, errlen) || make_qproj(&L->qdown, dn, 1, b, err, errlen))
            return -1;
    }
    g->quantized = 1;
    const GpuLayer *L0 = &g->layers[0];
    const size_t n = strlen(g->desc);
    snprintf(g->desc + n, sizeof g->desc - n, "; projections quantized: %s (q|k|v as %d weight%s, gate|up as %d)",
             qlinear_gpu_describe(L0->qqkv.part[0]), L0->qqkv.n, L0->qqkv.n > 1 ? "s" : "", L0->qgu.n);
    return 0;
}

extern "C" int gpu_model_quantize_lm_head(GpuModel *g, const QWeight *q, char *err, int errlen) {
    const ModelConfig *c = &g->cfg;
    if (g->qlm.n || !q->q || q->rows != c->vocab || q->cols != c->hidden) {
        snprintf(err, (size_t)errlen, "lm_head: quantized weight (%d, %d)%s, the config needs (%d, %d)", q->rows, q->cols,
                 g->qlm.n ? " given twice" : "", c->vocab, c->hidden);
        return -1;
    }
    const QWeight *parts[1] = {q};
    if (make_qproj(&g->qlm, parts, 1, &g->weight_bytes, err, errlen) != 0) {
        for (int k = 0; k < g->qlm.n; k++) qlinear_gpu_free(g->qlm.part[k]);
        g->qlm.n = 0;
        return -1;
    }
    if (g->lm_head != g->embed) {  // untied: the dense copy is not read any more
        CUDA_CHECK(cudaFree(g->lm_head));
        g->weight_bytes -= (double)c->vocab * c->hidden * esize(g->wdt);
    }
    g->lm_head = NULL;
    const size_t n = strlen(g->desc);
    snprintf(g->desc + n, sizeof g->desc - n, "; lm_head quantized: %s", qlinear_gpu_describe(g->qlm.part[0]));
    return 0;
}

extern "C" int gpu_model_lm_head_quantized(const GpuModel *g) { return g->qlm.n > 0; }

// The dtype of everything that is not a quantized projection: bf16 (fp16 on sm_75, which has no
// bf16 tensor cores), since the quantized GEMM takes bf16 / fp16 activations.
static StDtype quant_dtype(const GpuInfo *gi, char *desc, size_t n) {
    const StDtype dt = gi->cc_major >= 8 ? ST_BF16 : ST_F16;
    snprintf(desc, n, "%s embeddings, lm_head and GEMM inputs, fp32 accumulation, residual and softmax", dt_name(dt));
    return dt;
}

extern "C" GpuModel *gpu_model_load_q(const ModelWeights *w, const QWeight *qlin, char *err, int errlen) {
    if (!qlin) return gpu_model_load(w, err, errlen);
    GpuInfo gi;
    if (load_checks(w, &gi, err, errlen) != 0) return NULL;
    char desc[224];
    const StDtype wdt = quant_dtype(&gi, desc, sizeof desc);
    ModelConfig cc = w->cfg;
    cc.tie_embeddings = (w->lm_head == w->embed || !w->lm_head);
    GpuModel *g = model_alloc(&cc, wdt, 1);
    snprintf(g->desc, sizeof g->desc, "%s", desc);
    upload_rest(w, g);
    if (attach_q(g, qlin, err, errlen) != 0) {
        gpu_model_free(g);
        return NULL;
    }
    return g;
}

extern "C" GpuModel *gpu_model_random_q(const ModelConfig *c, uint64_t seed, const QWeight *qlin, char *err, int errlen) {
    if (!qlin) return gpu_model_random(c, ST_BF16, seed, err, errlen);
    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        snprintf(err, (size_t)errlen, "%s", gi.reason);
        return NULL;
    }
    char desc[224];
    const StDtype wdt = quant_dtype(&gi, desc, sizeof desc);
    GpuModel *g = model_alloc(c, wdt, 1);
    snprintf(g->desc, sizeof g->desc, "random weights; %s", desc);
    fill_random(g, seed, 0);
    if (attach_q(g, qlin, err, errlen) != 0) {
        gpu_model_free(g);
        return NULL;
    }
    return g;
}

static void ws_free(GpuModel *g) {
    void *ps[] = {g->ids, g->x, g->xn, g->qkv, g->S, g->att, g->gu, g->h, g->logits, g->cos_t, g->sin_t};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) CUDA_CHECK(cudaFree(ps[i]));
    if (g->qkv16 != g->qkv) CUDA_CHECK(cudaFree(g->qkv16));
    if (g->P != g->S) CUDA_CHECK(cudaFree(g->P));
    g->ws_T = 0;
    g->ws_bytes = 0;
}

static void ws_alloc(GpuModel *g, int T) {
    if (g->ws_T == T) return;
    if (g->ws_T) ws_free(g);
    const ModelConfig *c = &g->cfg;
    const size_t Tz = T, d = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t ff = c->intermediate, es = esize(g->wdt), half = c->head_dim / 2;
    double *n = &g->ws_bytes;
    g->ids = (int *)dalloc(Tz * 4, n);
    g->x = (float *)dalloc(Tz * d * 4, n);
    g->xn = dalloc(Tz * d * es, n);
    g->qkv = (float *)dalloc(Tz * (qd + 2 * kd) * 4, n);
    g->qkv16 = g->wdt == ST_F32 ? (void *)g->qkv : dalloc(Tz * (qd + 2 * kd) * es, n);
    g->S = (float *)dalloc((size_t)c->n_heads * Tz * Tz * 4, n);
    g->P = g->wdt == ST_F32 ? (void *)g->S : dalloc((size_t)c->n_heads * Tz * Tz * es, n);
    g->att = dalloc(Tz * qd * es, n);
    g->gu = (float *)dalloc(Tz * 2 * ff * 4, n);
    g->h = dalloc(Tz * ff * es, n);
    g->logits = (float *)dalloc(Tz * (size_t)c->vocab * 4, n);
    g->cos_t = (float *)dalloc(Tz * half * 4, n);
    g->sin_t = (float *)dalloc(Tz * half * 4, n);
    // The rope table is the CPU reference's own (same fp32 angles), computed once per T.
    float *ct = (float *)xmalloc(Tz * half * 4), *st = (float *)xmalloc(Tz * half * 4);
    rope_table_cpu(c, 0, T, ct, st);
    CUDA_CHECK(cudaMemcpy(g->cos_t, ct, Tz * half * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(g->sin_t, st, Tz * half * 4, cudaMemcpyHostToDevice));
    free(ct);
    free(st);
    g->ws_T = T;
}

extern "C" void gpu_model_free(GpuModel *g) {
    if (!g) return;
    if (g->ws_T) ws_free(g);
    for (int l = 0; l < g->cfg.n_layers; l++) {
        GpuLayer *L = &g->layers[l];
        void *ps[] = {L->attn_norm, L->mlp_norm, L->q_norm, L->k_norm, L->bqkv, L->bo, L->wqkv, L->wo, L->wgu, L->wdown};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) CUDA_CHECK(cudaFree(ps[i]));
        GpuQProj *qp[4] = {&L->qqkv, &L->qo, &L->qgu, &L->qdown};
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < qp[i]->n; k++) qlinear_gpu_free(qp[i]->part[k]);
        CUDA_CHECK(cudaEventDestroy(g->ea[l]));
        CUDA_CHECK(cudaEventDestroy(g->eb[l]));
    }
    if (g->lm_head != g->embed) CUDA_CHECK(cudaFree(g->lm_head));
    for (int k = 0; k < g->qlm.n; k++) qlinear_gpu_free(g->qlm.part[k]);
    CUDA_CHECK(cudaFree(g->embed));
    CUDA_CHECK(cudaFree(g->final_norm));
    CUDA_CHECK(cudaEventDestroy(g->ev0));
    CUDA_CHECK(cudaEventDestroy(g->ev1));
    CUBLAS_CHECK(cublasDestroy(g->blas));
    free(g->ea);
    free(g->eb);
    free(g->layers);
    free(g);
}

extern "C" const char *gpu_model_describe(const GpuModel *g) { return g->desc; }
extern "C" double gpu_model_weight_bytes(const GpuModel *g) { return g->weight_bytes; }
extern "C" double gpu_mem_used_bytes(void) {
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    return (double)(tot - fr);
}

// ---------------------------------------------------------------- GEMM helpers (row-major)

// Y (T, n_out) fp32 [ld ldy] = X (T, n_in) [ld ldx] W^T + beta * Y; W (n_out, n_in) row-major.
// cuBLAS is column-major: a row-major (r, c) matrix is a column-major (c, r) one, so this is
// Y^T = W . X^T: op(W) = T on the stored (n_in, n_out) column-major view.
void gemm_xwt(cublasHandle_t h, StDtype dt, int T, int n_out, int n_in, const void *X, int ldx, const void *W,
                     float *Y, int ldy, float beta) {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &one, W, cuda_type(dt), n_in, X,
                              cuda_type(dt), ldx, &beta, Y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void proj_gemm(cublasHandle_t h, StDtype dt, const GpuQProj *q, int T, int n_out, int n_in, const void *X, int ldx,
               const void *W, float *Y, int ldy, float beta, cudaStream_t s) {
    if (q->n == 0) {
        gemm_xwt(h, dt, T, n_out, n_in, X, ldx, W, Y, ldy, beta);
        return;
    }
    int off = 0;
    for (int i = 0; i < q->n; i++) {  // part i fills output columns off .. off + rows[i] - 1
        if (qlinear_gpu_gemm(q->part[i], dt, T, X, ldx, Y + off, ldy, beta, s) != 0)
            die("qlinear_gpu_gemm failed (%s, T = %d)", qlinear_gpu_describe(q->part[i]), T);
        off += q->rows[i];
    }
}

// Naive causal GQA attention (the part that is quadratic in T), for nq queries that are the
// last nq of nk positions (nq = nk = T for a whole prompt; step04 runs a chunk of nq new rows
// over a sequence's cached nk keys):
//   q (nq, H*hd) [ld ldq], k, v (nk, KV*hd) [ld ldk, ldv], all in dtype dt;
//   S (H, nq, nk) fp32 scores; P (H, nq, nk) dtype dt (may be S for fp32); out (nq, H*hd) dtype dt.
// Query head h = kv*g + j uses kv head kv. For each j one strided-batched GEMM covers the KV
// heads: head kv*g+j's columns start at (kv*g+j)*hd, so the batch stride is g*hd in q and out,
// hd in k and v, and g*nq*nk in S and P.
void attention_gpu(cublasHandle_t hb, StDtype dt, int nq, int nk, int H, int KV, int hd, const void *q, int ldq,
                   const void *k, int ldk, const void *v, int ldv, float *S, void *P, void *out) {
    const int g = H / KV;
    const size_t es = esize(dt);
    const cudaDataType_t ct = cuda_type(dt);
    const float scale = 1.0f / sqrtf((float)hd), one = 1.0f, zero = 0.0f;
    const long long QK = (long long)nq * nk;
    for (int j = 0; j < g; j++)  // S_h (nq, nk) = scale * q_h k_kv^T, column-major S_h^T = k_kv q_h^T
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, nk, nq, hd, &scale, k, ct, ldk, hd,
                                                (const char *)q + (size_t)j * hd * es, ct, ldq, (long long)g * hd, &zero,
                                                S + (size_t)j * QK, CUDA_R_32F, nk, g * QK, KV, CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT));
    DISPATCH(dt, A, k_causal_softmax<A><<<H * nq, 256>>>(S, (A *)P, nq, nk));
    CUDA_CHECK_LAST();
    for (int j = 0; j < g; j++)  // o_h (nq, hd) = P_h v_kv, column-major o_h^T = v_kv^T P_h^T
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, hd, nq, nk, &one, v, ct, ldv, hd,
                                                (const char *)P + (size_t)j * QK * es, ct, nk, g * QK, &zero,
                                                (char *)out + (size_t)j * hd * es, ct, H * hd, (long long)g * hd, KV,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------- forward

extern "C" int forward_cuda(GpuModel *g, const int *ids, int T, float *logits, ForwardTimes *times) {
    const ModelConfig *c = &g->cfg;
    if (T < 1) {
        fprintf(stderr, "forward_cuda: T = %d: need at least one token\n", T);
        return -1;
    }
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab) {
            fprintf(stderr, "forward_cuda: token id %d at position %d is outside the vocabulary [0, %d)\n", ids[t], t,
                    c->vocab);
            return -1;
        }
    ws_alloc(g, T);
    const int d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, ff = c->intermediate;
    const int qd = H * hd, kd = KV * hd, nqkv = qd + 2 * kd;
    const StDtype dt = g->wdt;
    const size_t es = esize(dt), Tz = T;
    const float eps = c->rms_eps;
    if (times) CUDA_CHECK(cudaEventRecord(g->ev0));
    CUDA_CHECK(cudaMemcpyAsync(g->ids, ids, Tz * 4, cudaMemcpyHostToDevice));

    DISPATCH(dt, A, k_embed<A><<<T, 256>>>((const A *)g->embed, g->ids, d, g->x));
    CUDA_CHECK_LAST();
    for (int l = 0; l < c->n_layers; l++) {
        const GpuLayer *L = &g->layers[l];
        // ---- attention block
        DISPATCH(dt, A, k_rmsnorm<A><<<T, 256>>>(g->x, L->attn_norm, d, 1, d, eps, (A *)g->xn));
        CUDA_CHECK_LAST();
        proj_gemm(g->blas, dt, &L->qqkv, T, nqkv, d, g->xn, d, L->wqkv, g->qkv, nqkv, 0.0f, 0);  // qkv (T, qd+2kd)
        if (L->bqkv) {
            k_add_bias<<<grid_for(Tz * nqkv, 256), 256>>>(g->qkv, L->bqkv, T, nqkv, nqkv);
            CUDA_CHECK_LAST();
        }
        if (L->q_norm) {  // Qwen3: RMSNorm of each q head and each k head over hd, before RoPE
            k_rmsnorm<float><<<T * H, 128>>>(g->qkv, L->q_norm, hd, H, nqkv, eps, g->qkv);
            CUDA_CHECK_LAST();
            k_rmsnorm<float><<<T * KV, 128>>>(g->qkv + qd, L->k_norm, hd, KV, nqkv, eps, g->qkv + qd);
            CUDA_CHECK_LAST();
        }
        // RoPE on the H q heads and the KV k heads: they are adjacent in each row.
        k_rope<<<grid_for(Tz * (H + KV) * (hd / 2), 256), 256>>>(g->qkv, T, H + KV, hd, nqkv, g->cos_t, g->sin_t);
        CUDA_CHECK_LAST();
        if (dt != ST_F32) {
            DISPATCH(dt, A, k_convert<A><<<grid_for(Tz * nqkv, 256), 256>>>(g->qkv, (A *)g->qkv16, Tz * nqkv));
            CUDA_CHECK_LAST();
        }
        if (times) CUDA_CHECK(cudaEventRecord(g->ea[l]));
        attention_gpu(g->blas, dt, T, T, H, KV, hd, g->qkv16, nqkv, (char *)g->qkv16 + (size_t)qd * es, nqkv,
                      (char *)g->qkv16 + (size_t)(qd + kd) * es, nqkv, g->S, g->P, g->att);
        if (times) CUDA_CHECK(cudaEventRecord(g->eb[l]));
        proj_gemm(g->blas, dt, &L->qo, T, d, qd, g->att, qd, L->wo, g->x, d, 1.0f, 0);  // x += att Wo^T (residual)
        if (L->bo) {
            k_add_bias<<<grid_for(Tz * d, 256), 256>>>(g->x, L->bo, T, d, d);
            CUDA_CHECK_LAST();
        }
        // ---- MLP block
        DISPATCH(dt, A, k_rmsnorm<A><<<T, 256>>>(g->x, L->mlp_norm, d, 1, d, eps, (A *)g->xn));
        CUDA_CHECK_LAST();
        proj_gemm(g->blas, dt, &L->qgu, T, 2 * ff, d, g->xn, d, L->wgu, g->gu, 2 * ff, 0.0f, 0);  // gate|up (T, 2ff)
        DISPATCH(dt, A, k_swiglu<A><<<grid_for(Tz * ff, 256), 256>>>(g->gu, (A *)g->h, T, ff));
        CUDA_CHECK_LAST();
        proj_gemm(g->blas, dt, &L->qdown, T, d, ff, g->h, ff, L->wdown, g->x, d, 1.0f, 0);  // x += h Wdown^T
    }
    DISPATCH(dt, A, k_rmsnorm<A><<<T, 256>>>(g->x, g->final_norm, d, 1, d, eps, (A *)g->xn));
    CUDA_CHECK_LAST();
    proj_gemm(g->blas, dt, &g->qlm, T, c->vocab, d, g->xn, d, g->lm_head, g->logits, c->vocab, 0.0f, 0);  // (T, vocab)
    if (times) CUDA_CHECK(cudaEventRecord(g->ev1));
    if (logits) CUDA_CHECK(cudaMemcpy(logits, g->logits, Tz * c->vocab * 4, cudaMemcpyDeviceToHost));
    if (times) {
        CUDA_CHECK(cudaEventSynchronize(g->ev1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, g->ev0, g->ev1));
        times->total_ms = ms;
        times->attn_ms = 0;
        for (int l = 0; l < c->n_layers; l++) {
            CUDA_CHECK(cudaEventElapsedTime(&ms, g->ea[l], g->eb[l]));
            times->attn_ms += ms;
        }
        times->scores_bytes = (double)H * T * T * 4.0;
        times->workspace_bytes = g->ws_bytes;
    }
    return 0;
}

extern "C" int attention_gpu_check(const float *q, const float *k, const float *v, int T, int H, int KV, int hd,
                                   StDtype dt, float *out) {
    GpuInfo gi;
    if (gpu_info(&gi) != 0) {
        fprintf(stderr, "attention_gpu_check: %s\n", gi.reason);
        return -1;
    }
    if (dt == ST_BF16 && gi.cc_major < 8) dt = ST_F32;  // as the model does on sm_75
    const size_t es = esize(dt), nq = (size_t)T * H * hd, nk = (size_t)T * KV * hd, nS = (size_t)H * T * T;
    float *tmp = (float *)dalloc((nq > nk ? nq : nk) * 4, NULL);
    void *dq = dalloc(nq * es, NULL), *dk = dalloc(nk * es, NULL), *dv = dalloc(nk * es, NULL);
    void *dout = dalloc(nq * es, NULL);
    float *S = (float *)dalloc(nS * 4, NULL);
    void *P = dt == ST_F32 ? (void *)S : dalloc(nS * es, NULL);
    const float *src[3] = {q, k, v};
    void *dst[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
        size_t n = i == 0 ? nq : nk;
        CUDA_CHECK(cudaMemcpy(tmp, src[i], n * 4, cudaMemcpyHostToDevice));
        DISPATCH(dt, A, k_convert<A><<<grid_for(n, 256), 256>>>(tmp, (A *)dst[i], n));
        CUDA_CHECK_LAST();
    }
    CUDA_CHECK(cudaMemset(dout, 0xff, nq * es));  // poison: NaN in every dtype
    cublasHandle_t hb;
    CUBLAS_CHECK(cublasCreate(&hb));
    attention_gpu(hb, dt, T, T, H, KV, hd, dq, H * hd, dk, KV * hd, dv, KV * hd, S, P, dout);
    DISPATCH(dt, A, k_to_f32<A><<<grid_for(nq, 256), 256>>>((const A *)dout, tmp, nq));
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaMemcpy(out, tmp, nq * 4, cudaMemcpyDeviceToHost));
    CUBLAS_CHECK(cublasDestroy(hb));
    void *ps[] = {tmp, dq, dk, dv, dout, S};
    for (int i = 0; i < 6; i++) CUDA_CHECK(cudaFree(ps[i]));
    if (P != S) CUDA_CHECK(cudaFree(P));
    return 0;
}
