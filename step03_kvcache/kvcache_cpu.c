// kvcache_cpu.c — the fp32 CPU reference of decode with a KV cache (see kvcache.h).
//
// forward_cached_cpu is step02's layer loop with two changes: the k, v rows of the new tokens
// are written into the cache at their positions, and attention reads keys and values from the
// cache (positions 0 .. pos) instead of from this call's tokens only. Every op is step02's.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvcache.h"

int cpu_kv_init(CpuKvCache *kv, const ModelConfig *c, int max_seq) {
    memset(kv, 0, sizeof *kv);
    if (max_seq < 1) {
        fprintf(stderr, "cpu_kv_init: max_seq = %d\n", max_seq);
        return -1;
    }
    kv->n_layers = c->n_layers;
    kv->kv_dim = c->n_kv_heads * c->head_dim;
    kv->max_seq = max_seq;
    const size_t n = (size_t)c->n_layers * max_seq * kv->kv_dim;
    kv->k = xmalloc(n * sizeof(float));
    kv->v = xmalloc(n * sizeof(float));
    return 0;
}

void cpu_kv_free(CpuKvCache *kv) {
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

double cpu_kv_bytes(const CpuKvCache *kv) {
    return 2.0 * (double)kv->n_layers * kv->max_seq * kv->kv_dim * sizeof(float);
}

static int check_ids(const char *who, const ModelConfig *c, const int *ids, int T) {
    if (T < 1) {
        fprintf(stderr, "%s: T = %d: need at least one token\n", who, T);
        return -1;
    }
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab) {
            fprintf(stderr, "%s: token id %d is outside the vocabulary [0, %d)\n", who, ids[t], c->vocab);
            return -1;
        }
    return 0;
}

int forward_cached_cpu(const CpuModel *m, CpuKvCache *kv, const int *ids, int T, float *logits) {
    const ModelConfig *c = &m->cfg;
    if (check_ids("forward_cached_cpu", c, ids, T) != 0) return -1;
    const int pos0 = kv->len;
    if (pos0 + T > kv->max_seq) {
        fprintf(stderr, "forward_cached_cpu: %d + %d tokens exceed the cache (%d positions)\n", pos0, T, kv->max_seq);
        return -1;
    }
    const int d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, ff = c->intermediate;
    const int qd = H * hd, kd = KV * hd;
    const size_t Tz = (size_t)T, layer_stride = (size_t)kv->max_seq * kd;
    float *x = xmalloc(Tz * d * 4), *xn = xmalloc(Tz * d * 4), *tmp = xmalloc(Tz * d * 4);  // (T, d)
    float *q = xmalloc(Tz * qd * 4), *att = xmalloc(Tz * qd * 4);                           // (T, H*hd)
    float *gate = xmalloc(Tz * ff * 4), *up = xmalloc(Tz * ff * 4);                         // (T, ff)
    float *cos_t = xmalloc(Tz * (hd / 2) * 4), *sin_t = xmalloc(Tz * (hd / 2) * 4);         // (T, hd/2)
    rope_table_cpu(c, pos0, T, cos_t, sin_t);  // angles of positions pos0 .. pos0+T-1

    embed_cpu(m->embed, ids, T, d, x);
    for (int l = 0; l < c->n_layers; l++) {
        const CpuLayer *L = &m->layers[l];
        float *kc = kv->k + l * layer_stride, *vc = kv->v + l * layer_stride;  // (max_seq, KV*hd)
        float *k = kc + (size_t)pos0 * kd, *v = vc + (size_t)pos0 * kd;       // the new rows
        rmsnorm_cpu(x, L->attn_norm, T, d, c->rms_eps, xn);
        proj_cpu(L, PROJ_Q, linear_cpu, xn, T, d, qd, q);
        proj_cpu(L, PROJ_K, linear_cpu, xn, T, d, kd, k);  // straight into the cache
        proj_cpu(L, PROJ_V, linear_cpu, xn, T, d, kd, v);
        if (L->q_norm) rmsnorm_cpu(q, L->q_norm, T * H, hd, c->rms_eps, q);
        if (L->k_norm) rmsnorm_cpu(k, L->k_norm, T * KV, hd, c->rms_eps, k);
        rope_apply_cpu(q, T, H, hd, qd, cos_t, sin_t);
        rope_apply_cpu(k, T, KV, hd, kd, cos_t, sin_t);  // the cache holds k after rope
        attention_at_cpu(q, kc, vc, pos0, T, H, KV, hd, att);  // over the cache
        proj_cpu(L, PROJ_O, linear_cpu, att, T, qd, d, tmp);
        add_cpu(x, tmp, (long)Tz * d);
        mlp_block_cpu(L, c, x, T, xn, gate, up, tmp);
    }
    // Only the last token's logits are needed to pick the next token.
    rmsnorm_cpu(x + (Tz - 1) * d, m->final_norm, 1, d, c->rms_eps, xn);
    lm_head_cpu(m, linear_cpu, xn, 1, logits);
    kv->len = pos0 + T;
    float *bufs[] = {x, xn, tmp, q, att, gate, up, cos_t, sin_t};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    return 0;
}

int forward_last_cpu(const CpuModel *m, const int *ids, int T, float *logits) {
    if (check_ids("forward_last_cpu", &m->cfg, ids, T) != 0) return -1;
    const size_t V = (size_t)m->cfg.vocab;
    float *all = xmalloc((size_t)T * V * sizeof(float));
    int rc = forward_cpu(m, ids, T, all, NULL);
    if (rc == 0) memcpy(logits, all + (size_t)(T - 1) * V, V * sizeof(float));
    free(all);
    return rc;
}
