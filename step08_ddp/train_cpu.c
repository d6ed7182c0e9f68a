// train_cpu.c — the fp32 CPU reference of training (see train.h): parameter layout, forward that
// keeps its activations, one backward function per op, AdamW, clipping, the schedule.
//
// The forward calls step02's ops (rmsnorm_cpu, linear_cpu, rope_apply_cpu, swiglu_cpu) so that its
// logits are the engine's; only attention is re-written here, to keep the probabilities P that
// the backward needs (same loop order as attention_at_cpu, so the same numbers). Matmuls of the
// backward go to OpenBLAS; everything else is plain loops. tests/test_step08_train.c checks the
// backward against finite differences and the forward against forward_cpu.
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"
#include "train.h"

// ---------------------------------------------------------------- parameter layout

// Pass 1 (m->params NULL) counts; pass 2 records each tensor and returns its view.
static float *take(TrainModel *m, const char *name, int rows, int cols, int decay) {
    const size_t off = m->n_params, numel = (size_t)rows * cols;
    if (m->params) {
        TrainTensor *t = &m->tensors[m->n_tensors];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->off = off, t->numel = numel, t->rows = rows, t->cols = cols, t->decay = decay;
    }
    m->n_tensors++;
    m->n_params += numel;
    return m->params ? m->params + off : NULL;
}

static void layout(TrainModel *m) {
    const ModelConfig *c = &m->cfg;
    const int d = c->hidden, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    const int ff = c->intermediate, V = c->vocab, hd = c->head_dim;
    char nm[TRAIN_NAME_MAX];
    m->n_tensors = 0, m->n_params = 0;
    m->embed = take(m, "model.embed_tokens.weight", V, d, 1);
    for (int l = 0; l < c->n_layers; l++) {
        TrainLayer *L = m->layers ? &m->layers[l] : &(TrainLayer){0};
#define T_(field, suffix, r, cc, dec) \
    (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), L->field = take(m, nm, r, cc, dec))
        T_(attn_norm, "input_layernorm.weight", 1, d, 0);
        T_(wq, "self_attn.q_proj.weight", qd, d, 1);
        if (c->qkv_bias) T_(bq, "self_attn.q_proj.bias", 1, qd, 0);
        T_(wk, "self_attn.k_proj.weight", kd, d, 1);
        if (c->qkv_bias) T_(bk, "self_attn.k_proj.bias", 1, kd, 0);
        T_(wv, "self_attn.v_proj.weight", kd, d, 1);
        if (c->qkv_bias) T_(bv, "self_attn.v_proj.bias", 1, kd, 0);
        T_(wo, "self_attn.o_proj.weight", d, qd, 1);
        if (c->o_bias) T_(bo, "self_attn.o_proj.bias", 1, d, 0);
        if (c->qk_norm) T_(q_norm, "self_attn.q_norm.weight", 1, hd, 0), T_(k_norm, "self_attn.k_norm.weight", 1, hd, 0);
        T_(mlp_norm, "post_attention_layernorm.weight", 1, d, 0);
        T_(w_gate, "mlp.gate_proj.weight", ff, d, 1);
        T_(w_up, "mlp.up_proj.weight", ff, d, 1);
        T_(w_down, "mlp.down_proj.weight", d, ff, 1);
#undef T_
    }
    m->final_norm = take(m, "model.norm.weight", 1, d, 0);
    m->lm_head = c->tie_embeddings ? m->embed : take(m, "lm_head.weight", V, d, 1);
}

int train_model_new(const ModelConfig *cfg, TrainModel *m, char *err, int errlen) {
    memset(m, 0, sizeof *m);
    const ModelConfig *c = cfg;
    if (c->mlp_bias) return errf(err, errlen, "training: mlp_bias=true is not supported (nor by the engine)");
    if (c->hidden < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->vocab < 1 ||
        c->intermediate < 1 || c->head_dim < 2)
        return errf(err, errlen, "training: config has a size < 1 (hidden %d, layers %d, heads %d/%d, head_dim %d, "
                    "intermediate %d, vocab %d)", c->hidden, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
                    c->intermediate, c->vocab);
    if (c->head_dim % 2) return errf(err, errlen, "training: head_dim %d is odd: rotate-half rope needs pairs", c->head_dim);
    if (c->n_heads % c->n_kv_heads)
        return errf(err, errlen, "training: %d query heads are not a multiple of %d kv heads", c->n_heads, c->n_kv_heads);
    m->cfg = *cfg;
    layout(m);  // count
    m->params = xcalloc(m->n_params, sizeof(float));
    m->grads = xcalloc(m->n_params, sizeof(float));
    m->tensors = xcalloc((size_t)m->n_tensors, sizeof(TrainTensor));
    m->layers = xcalloc((size_t)c->n_layers, sizeof(TrainLayer));
    layout(m);  // record the views
    return 0;
}

void train_model_init_random(TrainModel *m, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    const ModelConfig *c = &m->cfg;
    const float resid = 1.0f / sqrtf(2.0f * c->n_layers);
    for (int i = 0; i < m->n_tensors; i++) {
        const TrainTensor *t = &m->tensors[i];
        float *p = m->params + t->off;
        const char *nm = t->name;
        if (strstr(nm, "norm.weight") || strstr(nm, "layernorm.weight")) {
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        } else if (strstr(nm, ".bias")) {
            memset(p, 0, t->numel * sizeof(float));
        } else if (!strcmp(nm, "model.embed_tokens.weight")) {
            rng_fill_normal(&r, p, t->numel, 0, c->tie_embeddings ? 1.0f / sqrtf((float)c->hidden) : 1.0f);
        } else if (!strcmp(nm, "lm_head.weight")) {
            rng_fill_normal(&r, p, t->numel, 0, 1.0f / sqrtf((float)c->hidden));
        } else {
            float std = 1.0f / sqrtf((float)t->cols);
            if (strstr(nm, "o_proj") || strstr(nm, "down_proj")) std *= resid;
            rng_fill_normal(&r, p, t->numel, 0, std);
        }
    }
}

int train_model_from_weights(const ModelWeights *w, TrainModel *m, char *err, int errlen) {
    if (w->quantized) return errf(err, errlen, "%s is a quantized checkpoint: training needs dense weights", w->dir);
    if (train_model_new(&w->cfg, m, err, errlen)) return -1;
    const ModelConfig *c = &m->cfg;
    // (view, source) pairs in layout order; a NULL view is a tensor this config does not have.
    for (int i = -1; i <= c->n_layers; i++) {
        float *dst[16] = {0};
        const StTensor *src[16] = {0};
        int n = 0;
        if (i == -1) {
            dst[n] = m->embed, src[n++] = w->embed;
        } else if (i == c->n_layers) {
            dst[n] = m->final_norm, src[n++] = w->final_norm;
            if (!c->tie_embeddings) dst[n] = m->lm_head, src[n++] = w->lm_head;
        } else {
            const TrainLayer *L = &m->layers[i];
            const LayerTensors *S = &w->layers[i];
            float *d_[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv, L->bo,
                           L->q_norm, L->k_norm, L->mlp_norm, L->w_gate, L->w_up, L->w_down};
            const StTensor *s_[] = {S->attn_norm, S->wq, S->wk, S->wv, S->wo, S->bq, S->bk, S->bv, S->bo,
                                    S->q_norm, S->k_norm, S->mlp_norm, S->w_gate, S->w_up, S->w_down};
            for (int j = 0; j < 15; j++) dst[n] = d_[j], src[n++] = s_[j];
        }
        for (int j = 0; j < n; j++) {
            if (!dst[j] && !src[j]) continue;
            const size_t off = dst[j] ? (size_t)(dst[j] - m->params) : 0;
            const TrainTensor *t = NULL;
            for (int k = 0; k < m->n_tensors && dst[j]; k++)
                if (m->tensors[k].off == off) t = &m->tensors[k];
            if (!dst[j] || !src[j] || !t || (size_t)src[j]->numel != t->numel) {
                train_model_free(m);
                return errf(err, errlen, "%s: layer %d: a tensor of the checkpoint does not match the training layout "
                            "(present in one only, or %lld vs %zu elements)", w->dir, i,
                            src[j] ? (long long)src[j]->numel : -1LL, t ? t->numel : (size_t)0);
            }
            st_to_f32(src[j], dst[j]);
        }
    }
    return 0;
}

void train_model_free(TrainModel *m) {
    free(m->params), free(m->grads), free(m->tensors), free(m->layers);
    memset(m, 0, sizeof *m);
}

const TrainTensor *train_tensor_find(const TrainModel *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

void train_zero_grad(TrainModel *m) { memset(m->grads, 0, m->n_params * sizeof(float)); }

void train_cpu_view(const TrainModel *m, CpuModel *cm) {
    memset(cm, 0, sizeof *cm);
    cm->cfg = m->cfg;
    cm->embed = m->embed, cm->final_norm = m->final_norm, cm->lm_head = m->lm_head;
    cm->layers = xcalloc((size_t)m->cfg.n_layers, sizeof(CpuLayer));
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const TrainLayer *s = &m->layers[l];
        CpuLayer *d = &cm->layers[l];
        d->attn_norm = s->attn_norm, d->wq = s->wq, d->wk = s->wk, d->wv = s->wv, d->wo = s->wo;
        d->bq = s->bq, d->bk = s->bk, d->bv = s->bv, d->bo = s->bo, d->q_norm = s->q_norm, d->k_norm = s->k_norm;
        d->mlp_norm = s->mlp_norm, d->w_gate = s->w_gate, d->w_up = s->w_up, d->w_down = s->w_down;
    }
}

void train_cpu_view_free(CpuModel *cm) {
    free(cm->layers);
    memset(cm, 0, sizeof *cm);
}

// ---------------------------------------------------------------- activations

void train_acts_new(const ModelConfig *c, int B, int T, TrainActs *a) {
    memset(a, 0, sizeof *a);
    const size_t N = (size_t)B * T, L = (size_t)c->n_layers, d = (size_t)c->hidden, ff = (size_t)c->intermediate;
    const size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim, V = (size_t)c->vocab;
    a->B = B, a->T = T, a->N = (int)N;
#define F_(n) xcalloc((n), sizeof(float))
    a->ids = xcalloc(N, sizeof(int)), a->targets = xcalloc(N, sizeof(int));
    a->cos_t = F_((size_t)T * (c->head_dim / 2)), a->sin_t = F_((size_t)T * (c->head_dim / 2));
    rope_table_cpu(c, 0, T, a->cos_t, a->sin_t);
    a->x_in = F_(L * N * d), a->xn1 = F_(L * N * d), a->x_mid = F_(L * N * d), a->xn2 = F_(L * N * d);
    if (c->qk_norm) a->q_raw = F_(L * N * qd), a->k_raw = F_(L * N * kd);
    a->q = F_(L * N * qd), a->k = F_(L * N * kd), a->v = F_(L * N * kd), a->att = F_(L * N * qd);
    a->probs = F_(L * (size_t)B * c->n_heads * T * T);
    a->gate = F_(L * N * ff), a->up = F_(L * N * ff), a->hmid = F_(L * N * ff);
    a->x_out = F_(N * d), a->xn_f = F_(N * d), a->logits = F_(N * V), a->dlogits = F_(N * V);
    a->dx = F_(N * d), a->dxn = F_(N * d), a->dtmp = F_(N * d);
    a->dq = F_(N * qd), a->dk = F_(N * kd), a->dv = F_(N * kd), a->datt = F_(N * qd);
    a->dgate = F_(N * ff), a->dup = F_(N * ff), a->dh = F_(N * ff);
#undef F_
}

void train_acts_free(TrainActs *a) {
    void *ps[] = {a->ids, a->targets, a->cos_t, a->sin_t, a->x_in, a->xn1, a->q_raw, a->k_raw, a->q, a->k, a->v,
                  a->probs, a->att, a->x_mid, a->xn2, a->gate, a->up, a->hmid, a->x_out, a->xn_f, a->logits,
                  a->dlogits, a->dx, a->dxn, a->dtmp, a->dq, a->dk, a->dv, a->datt, a->dgate, a->dup, a->dh};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
    memset(a, 0, sizeof *a);
}

// ---------------------------------------------------------------- forward

void attention_train_cpu(const float *q, const float *k, const float *v, int T, int H, int KV, int hd, float *P,
                         float *out) {
    const int g = H / KV;
    const size_t ldq = (size_t)H * hd, ldk = (size_t)KV * hd;
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(2) schedule(dynamic, 4) if ((double)T * T * H * hd >= 1e6)
    for (int h = 0; h < H; h++)
        for (int i = 0; i < T; i++) {
            const int n = i + 1;
            const size_t kvo = (size_t)(h / g) * hd;
            float *s = P + ((size_t)h * T + i) * T;  // this row of P: step02's row attention keeps it
            attention_row_cpu(q + (size_t)i * ldq + (size_t)h * hd, k + kvo, v + kvo, n, ldk, hd, scale, s,
                              out + (size_t)i * ldq + (size_t)h * hd);
            for (int j = n; j < T; j++) s[j] = 0;  // masked: exactly zero probability
        }
}

double cross_entropy_cpu(const float *logits, const int *targets, int N, int V, float *dlogits, int *n_counted) {
    int cnt = 0;
    for (int t = 0; t < N; t++) cnt += targets[t] != TRAIN_IGNORE;
    if (n_counted) *n_counted = cnt;
    double loss = 0;
    for (int t = 0; t < N; t++) {
        const float *z = logits + (size_t)t * V;
        float *dz = dlogits ? dlogits + (size_t)t * V : NULL;
        if (targets[t] == TRAIN_IGNORE) {
            if (dz) memset(dz, 0, (size_t)V * sizeof(float));
            continue;
        }
        double mx = z[0], se = 0;
        for (int j = 1; j < V; j++) mx = z[j] > mx ? z[j] : mx;
        for (int j = 0; j < V; j++) se += exp((double)z[j] - mx);
        const double lse = mx + log(se);
        loss += lse - z[targets[t]];
        if (dz) {
            for (int j = 0; j < V; j++) dz[j] = (float)(exp((double)z[j] - lse) / cnt);
            dz[targets[t]] -= 1.0f / (float)cnt;
        }
    }
    return cnt ? loss / cnt : 0.0;
}

double train_forward(const TrainModel *m, TrainActs *a, const int *ids, const int *targets, int B, int T) {
    const ModelConfig *c = &m->cfg;
    if (B != a->B || T != a->T) {
        fprintf(stderr, "train_forward: activations are for B=%d T=%d, called with B=%d T=%d\n", a->B, a->T, B, T);
        return -1;
    }
    const int N = B * T, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, ff = c->intermediate;
    const int qd = H * hd, kd = KV * hd, V = c->vocab;
    for (int t = 0; t < N; t++)
        if (ids[t] < 0 || ids[t] >= V || (targets && targets[t] != TRAIN_IGNORE && (targets[t] < 0 || targets[t] >= V))) {
            fprintf(stderr, "train_forward: id %d / target %d at row %d is outside the vocabulary [0, %d)\n", ids[t],
                    targets ? targets[t] : 0, t, V);
            return -1;
        }
    memcpy(a->ids, ids, (size_t)N * sizeof(int));
    for (int t = 0; t < N; t++) a->targets[t] = targets ? targets[t] : TRAIN_IGNORE;
    const size_t Nd = (size_t)N * d, Nq = (size_t)N * qd, Nk = (size_t)N * kd, Nf = (size_t)N * ff;
    float *x = a->x_out;  // the running residual stream (N, d)
    embed_cpu(m->embed, ids, N, d, x);
    for (int l = 0; l < c->n_layers; l++) {
        const TrainLayer *L = &m->layers[l];
        float *xin = a->x_in + l * Nd, *xn1 = a->xn1 + l * Nd, *xmid = a->x_mid + l * Nd, *xn2 = a->xn2 + l * Nd;
        float *q = a->q + l * Nq, *k = a->k + l * Nk, *v = a->v + l * Nk, *att = a->att + l * Nq;
        float *P = a->probs + (size_t)l * B * H * T * T;
        float *gate = a->gate + l * Nf, *up = a->up + l * Nf, *hm = a->hmid + l * Nf;
        memcpy(xin, x, Nd * sizeof(float));
        rmsnorm_cpu(x, L->attn_norm, N, d, c->rms_eps, xn1);
        float *qr = c->qk_norm ? a->q_raw + l * Nq : q, *kr = c->qk_norm ? a->k_raw + l * Nk : k;
        linear_cpu(xn1, L->wq, L->bq, N, d, qd, qr);
        linear_cpu(xn1, L->wk, L->bk, N, d, kd, kr);
        linear_cpu(xn1, L->wv, L->bv, N, d, kd, v);
        if (c->qk_norm) {
            rmsnorm_cpu(qr, L->q_norm, N * H, hd, c->rms_eps, q);
            rmsnorm_cpu(kr, L->k_norm, N * KV, hd, c->rms_eps, k);
        }
        for (int b = 0; b < B; b++) {
            const size_t r0 = (size_t)b * T;
            rope_apply_cpu(q + r0 * qd, T, H, hd, qd, a->cos_t, a->sin_t);
            rope_apply_cpu(k + r0 * kd, T, KV, hd, kd, a->cos_t, a->sin_t);
            attention_train_cpu(q + r0 * qd, k + r0 * kd, v + r0 * kd, T, H, KV, hd, P + (size_t)b * H * T * T,
                                att + r0 * qd);
        }
        linear_cpu(att, L->wo, L->bo, N, qd, d, a->dtmp);
        add_cpu(x, a->dtmp, (long)Nd);
        memcpy(xmid, x, Nd * sizeof(float));
        rmsnorm_cpu(x, L->mlp_norm, N, d, c->rms_eps, xn2);
        linear_cpu(xn2, L->w_gate, NULL, N, d, ff, gate);
        linear_cpu(xn2, L->w_up, NULL, N, d, ff, up);
        swiglu_cpu(gate, up, (long)Nf, hm);
        linear_cpu(hm, L->w_down, NULL, N, ff, d, a->dtmp);
        add_cpu(x, a->dtmp, (long)Nd);
    }
    rmsnorm_cpu(x, m->final_norm, N, d, c->rms_eps, a->xn_f);
    linear_cpu(a->xn_f, m->lm_head, NULL, N, d, V, a->logits);
    a->loss = cross_entropy_cpu(a->logits, a->targets, N, V, a->dlogits, &a->n_counted);
    return a->loss;
}

// ---------------------------------------------------------------- backward ops

void rmsnorm_backward_cpu(const float *x, const float *w, const float *dy, int rows, int n, float eps, float *dx,
                          float *dw) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n, *dyr = dy + (size_t)r * n;
        float *dxr = dx + (size_t)r * n;
        double ss = 0, dot = 0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i], dot += (double)dyr[i] * w[i] * xr[i];
        const double inv = 1.0 / sqrt(ss / n + eps);
        const double c = inv * inv * inv * dot / n;
        if (dw)
            for (int i = 0; i < n; i++) dw[i] += (float)((double)dyr[i] * xr[i] * inv);
        for (int i = 0; i < n; i++) dxr[i] = (float)(inv * dyr[i] * w[i] - xr[i] * c);  // reads dyr[i] first: dx may be dy
    }
}

void linear_backward_cpu(const float *x, const float *W, const float *dy, int T, int n_in, int n_out, float *dx,
                         int accumulate, float *dW, float *db) {
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, n_in, n_out, 1.0f, dy, n_out, W, n_in,
                    accumulate ? 1.0f : 0.0f, dx, n_in);
    if (dW) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_out, n_in, T, 1.0f, dy, n_out, x, n_in, 1.0f, dW, n_in);
    if (db)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < n_out; j++) db[j] += dy[(size_t)t * n_out + j];
}

void rope_backward_cpu(float *dx, int T, int n_heads, int hd, int ld, const float *cos_t, const float *sin_t) {
    const int half = hd / 2;
    for (int t = 0; t < T; t++) {
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int h = 0; h < n_heads; h++) {
            float *xh = dx + (size_t)t * ld + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                const float d1 = xh[i], d2 = xh[i + half];
                xh[i] = d1 * c[i] + d2 * s[i];
                xh[i + half] = d2 * c[i] - d1 * s[i];
            }
        }
    }
}

void attention_backward_cpu(const float *q, const float *k, const float *v, const float *P, const float *dout, int T,
                            int H, int KV, int hd, float *dq, float *dk, float *dv) {
    const int g = H / KV;
    const size_t ldq = (size_t)H * hd, ldk = (size_t)KV * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    // One kv head per iteration: it owns its dk, dv columns and its query heads' dq columns.
#pragma omp parallel if ((double)T * T * H * hd >= 1e6)
    {
        float *dP = xmalloc((size_t)T * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int kvh = 0; kvh < KV; kvh++) {
            for (int j = 0; j < T; j++) {
                memset(dk + (size_t)j * ldk + (size_t)kvh * hd, 0, (size_t)hd * sizeof(float));
                memset(dv + (size_t)j * ldk + (size_t)kvh * hd, 0, (size_t)hd * sizeof(float));
            }
            for (int h = kvh * g; h < (kvh + 1) * g; h++)
                for (int i = 0; i < T; i++) {
                    const float *Pi = P + ((size_t)h * T + i) * T;
                    const float *doi = dout + (size_t)i * ldq + (size_t)h * hd, *qi = q + (size_t)i * ldq + (size_t)h * hd;
                    float *dqi = dq + (size_t)i * ldq + (size_t)h * hd;
                    float rs = 0;  // sum_j P_ij dP_ij
                    for (int j = 0; j <= i; j++) {
                        const float *vj = v + (size_t)j * ldk + (size_t)kvh * hd;
                        float s = 0;
                        for (int e = 0; e < hd; e++) s += doi[e] * vj[e];
                        dP[j] = s;
                        rs += Pi[j] * s;
                    }
                    for (int e = 0; e < hd; e++) dqi[e] = 0;
                    for (int j = 0; j <= i; j++) {
                        const float dS = Pi[j] * (dP[j] - rs) * scale;  // through the 1/sqrt(hd) scale too
                        const float *kj = k + (size_t)j * ldk + (size_t)kvh * hd;
                        float *dkj = dk + (size_t)j * ldk + (size_t)kvh * hd, *dvj = dv + (size_t)j * ldk + (size_t)kvh * hd;
                        for (int e = 0; e < hd; e++) {
                            dqi[e] += dS * kj[e];
                            dkj[e] += dS * qi[e];
                            dvj[e] += Pi[j] * doi[e];
                        }
                    }
                }
        }
        free(dP);
    }
}

void swiglu_backward_cpu(const float *gate, const float *up, const float *dh, long n, float *dgate, float *dup) {
    for (long i = 0; i < n; i++) {
        const float gz = gate[i], s = 1.0f / (1.0f + expf(-gz));
        dgate[i] = dh[i] * up[i] * s * (1.0f + gz * (1.0f - s));
        dup[i] = dh[i] * gz * s;
    }
}

// ---------------------------------------------------------------- backward

void train_backward(TrainModel *m, TrainActs *a) { train_backward_hooked(m, a, NULL, NULL); }

void train_backward_hooked(TrainModel *m, TrainActs *a, TrainGradReady ready, void *ctx) {
    const ModelConfig *c = &m->cfg;
    const int B = a->B, T = a->T, N = a->N, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    const int ff = c->intermediate, qd = H * hd, kd = KV * hd, V = c->vocab;
    const size_t Nd = (size_t)N * d, Nq = (size_t)N * qd, Nk = (size_t)N * kd, Nf = (size_t)N * ff;
    float *dx = a->dx, *dxn = a->dxn, *dtmp = a->dtmp;
#define G(p) train_grad_of(m, (p))
    // logits = xn_f lm_head^T;  xn_f = rmsnorm(x_out) final_norm
    linear_backward_cpu(a->xn_f, m->lm_head, a->dlogits, N, d, V, dxn, 0, G(m->lm_head), NULL);
    rmsnorm_backward_cpu(a->x_out, m->final_norm, dxn, N, d, c->rms_eps, dx, G(m->final_norm));
    // the layout (train_model_new) is embed, layer 0 .. layer n-1, final_norm[, lm_head]: each piece
    // below is one contiguous range of the buffer
    const size_t off_final = (size_t)(m->final_norm - m->params);
    if (ready) ready(ctx, off_final, m->n_params - off_final);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        const TrainLayer *L = &m->layers[l];
        const float *xin = a->x_in + l * Nd, *xn1 = a->xn1 + l * Nd, *xmid = a->x_mid + l * Nd, *xn2 = a->xn2 + l * Nd;
        const float *q = a->q + l * Nq, *k = a->k + l * Nk, *v = a->v + l * Nk, *att = a->att + l * Nq;
        const float *P = a->probs + (size_t)l * B * H * T * T;
        const float *gate = a->gate + l * Nf, *up = a->up + l * Nf, *hm = a->hmid + l * Nf;
        // MLP block: x_out = x_mid + down(silu(gate(xn2)) * up(xn2)); dx flows to x_mid unchanged too
        linear_backward_cpu(hm, L->w_down, dx, N, ff, d, a->dh, 0, G(L->w_down), NULL);
        swiglu_backward_cpu(gate, up, a->dh, (long)Nf, a->dgate, a->dup);
        linear_backward_cpu(xn2, L->w_gate, a->dgate, N, d, ff, dxn, 0, G(L->w_gate), NULL);
        linear_backward_cpu(xn2, L->w_up, a->dup, N, d, ff, dxn, 1, G(L->w_up), NULL);
        rmsnorm_backward_cpu(xmid, L->mlp_norm, dxn, N, d, c->rms_eps, dtmp, G(L->mlp_norm));
        add_cpu(dx, dtmp, (long)Nd);
        // attention block: x_mid = x_in + o_proj(attention(rope(q), rope(k), v))
        linear_backward_cpu(att, L->wo, dx, N, qd, d, a->datt, 0, G(L->wo), G(L->bo));
        for (int b = 0; b < B; b++) {
            const size_t r0 = (size_t)b * T;
            attention_backward_cpu(q + r0 * qd, k + r0 * kd, v + r0 * kd, P + (size_t)b * H * T * T, a->datt + r0 * qd,
                                   T, H, KV, hd, a->dq + r0 * qd, a->dk + r0 * kd, a->dv + r0 * kd);
            rope_backward_cpu(a->dq + r0 * qd, T, H, hd, qd, a->cos_t, a->sin_t);
            rope_backward_cpu(a->dk + r0 * kd, T, KV, hd, kd, a->cos_t, a->sin_t);
        }
        if (c->qk_norm) {
            rmsnorm_backward_cpu(a->q_raw + l * Nq, L->q_norm, a->dq, N * H, hd, c->rms_eps, a->dq, G(L->q_norm));
            rmsnorm_backward_cpu(a->k_raw + l * Nk, L->k_norm, a->dk, N * KV, hd, c->rms_eps, a->dk, G(L->k_norm));
        }
        linear_backward_cpu(xn1, L->wq, a->dq, N, d, qd, dxn, 0, G(L->wq), G(L->bq));
        linear_backward_cpu(xn1, L->wk, a->dk, N, d, kd, dxn, 1, G(L->wk), G(L->bk));
        linear_backward_cpu(xn1, L->wv, a->dv, N, d, kd, dxn, 1, G(L->wv), G(L->bv));
        rmsnorm_backward_cpu(xin, L->attn_norm, dxn, N, d, c->rms_eps, dtmp, G(L->attn_norm));
        add_cpu(dx, dtmp, (long)Nd);
        if (ready) {
            const size_t lo = (size_t)(L->attn_norm - m->params), hi = (size_t)(L->w_down - m->params) + (size_t)d * ff;
            ready(ctx, lo, hi - lo);
        }
    }
    // embedding: each row's gradient goes to the row of the table it was read from
    float *dE = G(m->embed);
    for (int t = 0; t < N; t++) add_cpu(dE + (size_t)a->ids[t] * d, dx + (size_t)t * d, d);
    if (ready) ready(ctx, 0, (size_t)(m->layers[0].attn_norm - m->params));
#undef G
}

// ---------------------------------------------------------------- optimizer, clipping, schedule

void adamw_new(AdamW *o, size_t n) {
    o->n = n, o->t = 0;
    o->m = xcalloc(n, sizeof(float)), o->v = xcalloc(n, sizeof(float));
}

void adamw_free(AdamW *o) {
    free(o->m), free(o->v);
    memset(o, 0, sizeof *o);
}

void adamw_update_cpu(float *p, const float *g, float *m, float *v, size_t n, long t, float lr, float b1, float b2,
                      float eps, float wd) {
    // the order of torch.optim.AdamW's single-tensor path
    const float bc1 = 1.0f - powf(b1, (float)t), bc2_sqrt = sqrtf(1.0f - powf(b2, (float)t));
    const float step = lr / bc1, decay = 1.0f - lr * wd;
    for (size_t i = 0; i < n; i++) {
        p[i] *= decay;
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] -= step * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

void train_adamw_step(TrainModel *model, AdamW *o, const AdamWConfig *c, float lr) {
    o->t++;
    for (int i = 0; i < model->n_tensors; i++) {
        const TrainTensor *t = &model->tensors[i];
        adamw_update_cpu(model->params + t->off, model->grads + t->off, o->m + t->off, o->v + t->off, t->numel, o->t,
                         lr, c->beta1, c->beta2, c->eps, t->decay ? c->weight_decay : 0.0f);
    }
}

double grad_global_norm_clip(float *g, size_t n, double max_norm) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    const double norm = sqrt(ss);
    if (max_norm > 0 && norm > max_norm) {
        const float s = (float)(max_norm / (norm + 1e-6));
        for (size_t i = 0; i < n; i++) g[i] *= s;
    }
    return norm;
}

float lr_schedule(long s, long warmup, long total, float lr_max, float lr_min) {
    if (s < warmup) return lr_max * (float)(s + 1) / (float)warmup;
    const long span = total - 1 - warmup;
    const double prog = span > 0 ? (double)(s - warmup) / (double)span : 1.0;
    const double p = prog < 0 ? 0 : prog > 1 ? 1 : prog;
    return (float)(lr_min + (lr_max - lr_min) * 0.5 * (1.0 + cos(M_PI * p)));
}
