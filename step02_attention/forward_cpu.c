// forward_cpu.c — the fp32 CPU reference of the Llama-family forward pass (see forward.h).
//
// Every op is a plain function over row-major fp32 arrays; OpenMP where a loop is wide enough
// to pay (rows of a norm, heads x queries of attention); the projections go to OpenBLAS
// (cblas_sgemm), the library step01 measured. This is what CI checks end to end against the
// transformers goldens, and what the CUDA version is checked against.
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "forward.h"
#include "rng.h"
#include "timer.h"

// ---------------------------------------------------------------- ops

void embed_cpu(const float *table, const int *ids, int T, int d, float *out) {
    for (int t = 0; t < T; t++) memcpy(out + (size_t)t * d, table + (size_t)ids[t] * d, (size_t)d * sizeof(float));
}

void rmsnorm_cpu(const float *x, const float *w, int rows, int n, float eps, float *y) {
#pragma omp parallel for schedule(static) if (rows >= 64)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        double ss = 0;  // sum of squares in double: exact enough for any row length
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / n + eps));
        for (int i = 0; i < n; i++) yr[i] = xr[i] * inv * w[i];
    }
}

void rope_inv_freq(const ModelConfig *c, float *inv_freq) {
    const int hd = c->head_dim, half = hd / 2;
    for (int i = 0; i < half; i++) {
        // torch: 1.0 / base ** (arange(0, hd, 2).float() / hd), all in fp32
        float expo = (float)(2 * i) / (float)hd;
        float f = (float)(1.0 / (float)pow(c->rope_theta, (double)expo));
        if (c->rope_type == ROPE_LLAMA3) {
            // Llama 3.1: long wavelengths (low frequencies) are slowed down by `factor`, short
            // ones kept, the band between interpolated smoothly.
            const double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
            const double old_len = c->rope_original_max_pos;
            const double lo_wavelen = old_len / lo, hi_wavelen = old_len / hi;
            double wavelen = 2.0 * M_PI / f;
            double g = f;
            if (wavelen > lo_wavelen) g = f / factor;  // low frequency: scaled
            if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {
                double smooth = (old_len / wavelen - lo) / (hi - lo);
                g = (1.0 - smooth) * g / factor + smooth * g;  // medium: blend
            }
            f = (float)g;
        }
        inv_freq[i] = f;
    }
}

void rope_table_cpu(const ModelConfig *c, int pos0, int T, float *cos_t, float *sin_t) {
    const int half = c->head_dim / 2;
    float *inv = xmalloc((size_t)half * sizeof(float));
    rope_inv_freq(c, inv);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)(pos0 + t) * inv[i];  // one fp32 product, as torch's fp32 matmul
            cos_t[(size_t)t * half + i] = (float)cos((double)ang);
            sin_t[(size_t)t * half + i] = (float)sin((double)ang);
        }
    free(inv);
}

void rope_apply_cpu(float *x, int T, int n_heads, int hd, int ld, const float *cos_t, const float *sin_t) {
    const int half = hd / 2;
#pragma omp parallel for schedule(static) if (T >= 64)
    for (int t = 0; t < T; t++) {
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + (size_t)t * ld + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c[i] - x2 * s[i];
                xh[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

void linear_cpu(const float *x, const float *W, const float *b, int T, int n_in, int n_out, float *y) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n_out, n_in, 1.0f, x, n_in, W, n_in, 0.0f, y, n_out);
    if (b)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < n_out; j++) y[(size_t)t * n_out + j] += b[j];
}

void attention_row_cpu(const float *qi, const float *k, const float *v, int n, size_t ldk, int hd, float scale,
                       float *s, float *oi) {
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *kj = k + (size_t)j * ldk;
        float dot = 0;
        for (int e = 0; e < hd; e++) dot += qi[e] * kj[e];
        s[j] = dot * scale;
        if (s[j] > mx) mx = s[j];
    }
    float sum = 0;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    for (int e = 0; e < hd; e++) oi[e] = 0;
    for (int j = 0; j < n; j++) {
        s[j] = s[j] / sum;
        const float *vj = v + (size_t)j * ldk;
        for (int e = 0; e < hd; e++) oi[e] += s[j] * vj[e];
    }
}

void attention_cpu(const float *q, const float *k, const float *v, int T, int H, int KV, int hd, float *out) {
    attention_at_cpu(q, k, v, 0, T, H, KV, hd, out);
}

void attention_at_cpu(const float *q, const float *k, const float *v, int pos0, int T, int H, int KV, int hd,
                      float *out) {
    const int g = H / KV;  // query heads per kv head
    const size_t ldq = (size_t)H * hd, ldk = (size_t)KV * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const int len = pos0 + T;
    // Threads only when there is enough work: a parallel region right after an OpenBLAS call
    // can wait for OpenBLAS's own (spinning) threads, which costs more than a tiny attention.
#pragma omp parallel if ((double)T * len * H * hd >= 1e6)
    {
        float *s = xmalloc((size_t)len * sizeof(float));  // one row of scores (fp32)
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const int n = pos0 + i + 1;  // causal: the query at position pos0+i sees keys 0 .. pos0+i
                const size_t kvo = (size_t)(h / g) * hd;
                attention_row_cpu(q + (size_t)i * ldq + (size_t)h * hd, k + kvo, v + kvo, n, ldk, hd, scale, s,
                                  out + (size_t)i * ldq + (size_t)h * hd);
            }
        free(s);
    }
}

void swiglu_cpu(const float *gate, const float *up, long n, float *out) {
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (long i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void add_cpu(float *x, const float *y, long n) {
    for (long i = 0; i < n; i++) x[i] += y[i];
}

void proj_cpu(const CpuLayer *L, Proj p, LinearFn lin, const float *x, int T, int n_in, int n_out, float *y) {
    const float *W[N_PROJ] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
    const float *b[N_PROJ] = {L->bq, L->bk, L->bv, L->bo, NULL, NULL, NULL};
    if (L->q[p]) linear_q_cpu(x, L->q[p], b[p], T, y);
    else lin(x, W[p], b[p], T, n_in, n_out, y);
}

void lm_head_cpu(const CpuModel *m, LinearFn lin, const float *xn, int T, float *logits) {
    if (m->q_lm_head) linear_q_cpu(xn, m->q_lm_head, NULL, T, logits);
    else lin(xn, m->lm_head, NULL, T, m->cfg.hidden, m->cfg.vocab, logits);
}

void mlp_block_lin_cpu(const CpuLayer *L, const ModelConfig *c, LinearFn lin, float *x, int T, float *xn, float *gate,
                       float *up, float *tmp) {
    const int d = c->hidden, ff = c->intermediate;
    rmsnorm_cpu(x, L->mlp_norm, T, d, c->rms_eps, xn);
    proj_cpu(L, PROJ_GATE, lin, xn, T, d, ff, gate);
    proj_cpu(L, PROJ_UP, lin, xn, T, d, ff, up);
    swiglu_cpu(gate, up, (long)T * ff, gate);
    proj_cpu(L, PROJ_DOWN, lin, gate, T, ff, d, tmp);
    add_cpu(x, tmp, (long)T * d);
}

void mlp_block_cpu(const CpuLayer *L, const ModelConfig *c, float *x, int T, float *xn, float *gate, float *up,
                   float *tmp) {
    mlp_block_lin_cpu(L, c, linear_cpu, x, T, xn, gate, up, tmp);
}

void forward_topk(const float *x, int n, int k, int *idx) {
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int p = 0; p < r; p++) taken |= idx[p] == i;
            if (taken) continue;
            if (best < 0 || x[i] > x[best]) best = i;
        }
        idx[r] = best;
    }
}

// ---------------------------------------------------------------- the model

static float *to_f32(const StTensor *t) {
    if (!t) return NULL;
    float *p = xmalloc((size_t)t->numel * sizeof(float));
    st_to_f32(t, p);
    return p;
}

int cpu_model_load(const ModelWeights *w, CpuModel *m, char *err, int errlen) {
    if (w->quantized) {
        memset(m, 0, sizeof *m);
        snprintf(err, (size_t)errlen,
                 "%s is a quantized checkpoint (config.json has a quantization_config): this program runs dense "
                 "weights only; step06's loader runs it (batch_bench / generate / kv_bench load it)", w->dir);
        return -1;
    }
    return cpu_model_load_base(w, m, err, errlen);
}

int cpu_model_load_base(const ModelWeights *w, CpuModel *m, char *err, int errlen) {
    memset(m, 0, sizeof *m);
    m->cfg = w->cfg;
    if (w->cfg.mlp_bias) {
        snprintf(err, (size_t)errlen, "mlp_bias=true is not supported by this step");
        return -1;
    }
    m->embed = to_f32(w->embed);
    m->final_norm = to_f32(w->final_norm);
    m->lm_head = (w->lm_head == w->embed || !w->lm_head) ? m->embed : to_f32(w->lm_head);
    m->layers = xcalloc((size_t)w->cfg.n_layers, sizeof(CpuLayer));
    for (int l = 0; l < w->cfg.n_layers; l++) {
        const LayerTensors *s = &w->layers[l];
        CpuLayer *d = &m->layers[l];
        d->attn_norm = to_f32(s->attn_norm);
        d->wq = to_f32(s->wq), d->wk = to_f32(s->wk), d->wv = to_f32(s->wv), d->wo = to_f32(s->wo);
        d->bq = to_f32(s->bq), d->bk = to_f32(s->bk), d->bv = to_f32(s->bv), d->bo = to_f32(s->bo);
        d->q_norm = to_f32(s->q_norm), d->k_norm = to_f32(s->k_norm);
        d->mlp_norm = to_f32(s->mlp_norm);
        d->w_gate = to_f32(s->w_gate), d->w_up = to_f32(s->w_up), d->w_down = to_f32(s->w_down);
    }
    return 0;
}

void cpu_model_random(const ModelConfig *c, uint64_t seed, CpuModel *m) {
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    Rng r;
    rng_seed(&r, seed);
    const size_t d = (size_t)c->hidden, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t ff = (size_t)c->intermediate;
    m->embed = rng_new_normal(&r, (size_t)c->vocab * d, 0, 0.02f);
    m->final_norm = rng_new_normal(&r, d, 1, 0.1f);
    m->lm_head = c->tie_embeddings ? m->embed : rng_new_normal(&r, (size_t)c->vocab * d, 0, 0.02f);
    m->layers = xcalloc((size_t)c->n_layers, sizeof(CpuLayer));
    for (int l = 0; l < c->n_layers; l++) {
        CpuLayer *L = &m->layers[l];
        L->attn_norm = rng_new_normal(&r, d, 1, 0.1f);
        L->wq = rng_new_normal(&r, qd * d, 0, 0.02f), L->wk = rng_new_normal(&r, kd * d, 0, 0.02f);
        L->wv = rng_new_normal(&r, kd * d, 0, 0.02f), L->wo = rng_new_normal(&r, d * qd, 0, 0.02f);
        if (c->qkv_bias)
            L->bq = rng_new_normal(&r, qd, 0, 0.02f), L->bk = rng_new_normal(&r, kd, 0, 0.02f), L->bv = rng_new_normal(&r, kd, 0, 0.02f);
        if (c->o_bias) L->bo = rng_new_normal(&r, d, 0, 0.02f);
        if (c->qk_norm) L->q_norm = rng_new_normal(&r, c->head_dim, 1, 0.1f), L->k_norm = rng_new_normal(&r, c->head_dim, 1, 0.1f);
        L->mlp_norm = rng_new_normal(&r, d, 1, 0.1f);
        L->w_gate = rng_new_normal(&r, ff * d, 0, 0.02f), L->w_up = rng_new_normal(&r, ff * d, 0, 0.02f);
        L->w_down = rng_new_normal(&r, d * ff, 0, 0.02f);
    }
}

void cpu_model_free(CpuModel *m) {
    if (!m->layers && !m->embed) return;
    for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
        CpuLayer *L = &m->layers[l];
        float *ps[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv, L->bo,
                       L->q_norm, L->k_norm, L->mlp_norm, L->w_gate, L->w_up, L->w_down};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
        for (int p = 0; p < N_PROJ; p++)
            if (L->q[p]) qweight_free(L->q[p]), free(L->q[p]);
    }
    free(m->layers);
    if (m->lm_head != m->embed) free(m->lm_head);
    if (m->q_lm_head) qweight_free(m->q_lm_head), free(m->q_lm_head);
    free(m->embed);
    free(m->final_norm);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------- forward

int forward_cpu(const CpuModel *m, const int *ids, int T, float *logits, ForwardTimes *times) {
    const ModelConfig *c = &m->cfg;
    if (T < 1) {
        fprintf(stderr, "forward_cpu: T = %d: need at least one token\n", T);
        return -1;
    }
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab) {
            fprintf(stderr, "forward_cpu: token id %d at position %d is outside the vocabulary [0, %d)\n", ids[t], t,
                    c->vocab);
            return -1;
        }
    const double t0 = now_sec();
    double t_attn = 0;
    const int d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, ff = c->intermediate;
    const int qd = H * hd, kd = KV * hd;
    const size_t Tz = (size_t)T;
    float *x = xmalloc(Tz * d * 4), *xn = xmalloc(Tz * d * 4), *tmp = xmalloc(Tz * d * 4);  // (T, d)
    float *q = xmalloc(Tz * qd * 4), *att = xmalloc(Tz * qd * 4);                           // (T, H*hd)
    float *k = xmalloc(Tz * kd * 4), *v = xmalloc(Tz * kd * 4);                             // (T, KV*hd)
    float *gate = xmalloc(Tz * ff * 4), *up = xmalloc(Tz * ff * 4);                         // (T, ff)
    float *cos_t = xmalloc(Tz * (hd / 2) * 4), *sin_t = xmalloc(Tz * (hd / 2) * 4);         // (T, hd/2)
    rope_table_cpu(c, 0, T, cos_t, sin_t);

    embed_cpu(m->embed, ids, T, d, x);
    for (int l = 0; l < c->n_layers; l++) {
        const CpuLayer *L = &m->layers[l];
        // attention block
        rmsnorm_cpu(x, L->attn_norm, T, d, c->rms_eps, xn);
        proj_cpu(L, PROJ_Q, linear_cpu, xn, T, d, qd, q);
        proj_cpu(L, PROJ_K, linear_cpu, xn, T, d, kd, k);
        proj_cpu(L, PROJ_V, linear_cpu, xn, T, d, kd, v);
        if (L->q_norm) rmsnorm_cpu(q, L->q_norm, T * H, hd, c->rms_eps, q);  // per head, over hd
        if (L->k_norm) rmsnorm_cpu(k, L->k_norm, T * KV, hd, c->rms_eps, k);
        rope_apply_cpu(q, T, H, hd, qd, cos_t, sin_t);
        rope_apply_cpu(k, T, KV, hd, kd, cos_t, sin_t);
        const double ta = now_sec();
        attention_cpu(q, k, v, T, H, KV, hd, att);
        t_attn += now_sec() - ta;
        proj_cpu(L, PROJ_O, linear_cpu, att, T, qd, d, tmp);
        add_cpu(x, tmp, (long)Tz * d);
        mlp_block_cpu(L, c, x, T, xn, gate, up, tmp);
    }
    rmsnorm_cpu(x, m->final_norm, T, d, c->rms_eps, xn);
    lm_head_cpu(m, linear_cpu, xn, T, logits);

    if (times) {
        times->total_ms = (now_sec() - t0) * 1e3;
        times->attn_ms = t_attn * 1e3;
        times->scores_bytes = (double)H * T * T * 4.0;
        // The CPU keeps one score row per thread; what it holds is the activations above.
        times->workspace_bytes = (double)Tz * (3.0 * d + 2.0 * qd + 2.0 * kd + 2.0 * ff + hd) * 4.0;
    }
    float *bufs[] = {x, xn, tmp, q, att, k, v, gate, up, cos_t, sin_t};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    return 0;
}
